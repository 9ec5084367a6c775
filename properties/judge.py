"""Expected values and verdicts for one Case, and failures a user can act on.

A failed property raises `ConformanceFailure` (an AssertionError, so Hypothesis shrinks
it): the backend, dtype, invariant, where and how much, the problem, and a NumPy snippet
that sets up its import path, rebuilds the inputs and replays the backend calls of the
failing example in order (with the call just before it: a stateful backend's bug may need it).
"""
from __future__ import annotations

import dataclasses
import textwrap

import numpy as np
from hypothesis import reject

from attnspec.specs import error_budget, reference
from attnspec.specs.invariants import Verdict

from attnspec.properties.case import Case
from attnspec.properties.strategies import cases


class ConformanceFailure(AssertionError):
    def __init__(self, prop: str, target, verdict: Verdict, case: Case, snippet: str):
        self.prop, self.backend, self.dtype = prop, target.name, target.dtype
        self.verdict, self.case, self.snippet = verdict, case, snippet
        where = "" if verdict.where is None else f"\n  where: {verdict.where}  (index into the tensor named above)"
        much = "" if verdict.amount != verdict.amount else f"\n  how much: {verdict.amount:.6g}"  # NaN: no amount
        super().__init__(f"{prop} failed on backend {target.name!r} at {target.dtype}\n"
                         f"  {verdict.message}{where}{much}\n  problem: {case!r}\n"
                         f"Reproduce:\n{textwrap.indent(snippet, '    ')}")

    @property
    def headline(self) -> str:
        """The failure without its snippet."""
        return str(self).split("\nReproduce:")[0]


def draw_case(data, target, **kwargs) -> Case:
    """The test's problem: a seed example given with @example(data=Case), else a fresh draw."""
    target.begin_example()
    if isinstance(data, Case):  # a seed example: only where its shapes suit the backend
        d = data.dims
        reject_unless(not target.equal_head_dims or d["E"] == (d["Lk"] if kwargs.get("probe") else d["Ev"]))
        m = getattr(target.caps, "head_dim_multiple", 1)
        reject_unless(d["E"] % m == 0 and (d["Lk"] if kwargs.get("probe") else d["Ev"]) % m == 0)
        reject_unless(target.caps.causal or not data.is_causal)
        reject_unless(not kwargs.get("need"))  # the seeds use no optional field
        case = data.rounded(target.dtype)
    else:
        case = data.draw(cases(target.dtype, target.caps, compiled=target.compiled,
                               equal_dims=target.equal_head_dims, alignments=target.alignments,
                               within=target.budget_dtype, **kwargs),
                         label="problem")
    target.examples += 1
    return case


def requires(target, *features: str) -> None:
    """Skip (with the reason) unless the backend declares every feature natively."""
    from attnspec.specs.problem import FEATURE_TEXT
    missing = [f for f in features if not target.supports(f)]
    if missing:
        import pytest
        pytest.skip(f"{target.name} does not support {', '.join(FEATURE_TEXT[f] for f in missing)} natively")


def agreement(target, case: Case, prop: str, checks: tuple = ("print(np.abs(out - expected.output).max())  "
                                                                "# rows with no visible key are not judged",)):
    """The backend's output within the error budget of the reference, on the judged rows."""
    out = target.forward(case)  # (B, H, Lq, Ev)
    rows = judged_rows(case)  # (B, H, Lq)
    verdict = error_budget.check_forward(out, case.problem, dtype=target.budget_dtype, rows=rows)
    fail_unless(with_full_index(verdict, rows), prop, target, case, checks=checks)
    return out


def close_outputs(prop: str, target, case: Case, a, b, other: Case, what: str, checks: tuple):
    """Two outputs of problems with the same reference: each within its budget, so 2 x budget apart at most."""
    rows = judged_rows(case) & judged_rows(other)  # (B, H, Lq)
    atol = output_tolerance(case, target.budget_dtype) + output_tolerance(other, target.budget_dtype)
    where, amount = worst(np.abs(a - b), np.broadcast_to(rows[..., None], np.shape(a)))
    verdict = Verdict(prop, amount <= atol, where, amount,
                      f"{what}: output at {where} (batch, head, query, column) differs by {amount:.6g} "
                      f"(allowed {atol:.3g}: both budgets)")
    fail_unless(verdict, prop, target, case, checks=checks)


def reject_unless(condition: bool) -> None:
    if not condition:
        reject()


def _call_line(call: dict, target, result: str) -> list:
    kw = f"dtype={call['dtype']!r}, **call_kwargs" + (", return_lse=True" if call.get("return_lse") else "") + (
        f", layout={call['layout']!r}" if call.get("layout", "contiguous") != "contiguous" else "")
    if call["kind"] == "backward":
        return [call.get("grad_line") or "grad_out = np.ones(q.shape[:-1] + v.shape[-1:])  # d(sum of outputs)",
                f"{result} = backend.backward(q, k, v, grad_out, {kw})"]
    return [f"{result} = backend.forward(q, k, v, {kw})"]


def _inputs(case: Case) -> list:
    return [*case.code, f"is_causal, scale = {case.is_causal}, {case.scale!r}",
            "call_kwargs = dict(mask=mask, is_causal=is_causal, scale=scale, **fields)"]


def snippet(target, case: Case, call: str = "forward", checks: tuple = (), grad_line: str = "",
            return_lse: bool = False) -> str:
    """NumPy code that replays the example's backend calls, then the failing one and the reference."""
    lines = ["import sys", *(f"sys.path.insert(0, {p!r})" for p in getattr(target, "import_paths", ())),
             "import numpy as np", "from backends.registry import resolve", "from specs import reference",
             f"backend = resolve({getattr(target, 'spec', target.name)!r})"]
    if getattr(target, "earlier", None):
        from attnspec.properties.targets import replay_line
        lines += ["def shaped(*shapes):  # random inputs: the calls below only bring the backend to its state",
                  "    rng = np.random.default_rng(0)",
                  "    return [rng.standard_normal(s) for s in shapes]",
                  f"# {len(target.earlier)} earlier call configurations of this run, in order (a stateful backend "
                  "may depend on them)", *(replay_line(sig, None) for sig in target.earlier)]
    for i, earlier in enumerate(target.calls_before(case)):
        lines += [f"# call {i + 1}: made before the failing one (a stateful backend may depend on it)",
                  *_inputs(earlier["case"]), *_call_line(earlier, target, "_")]
    lines += ["# the failing call", *_inputs(case)]
    main = dict(kind=call, dtype=target.dtype, grad_line=grad_line, return_lse=return_lse)
    if call == "backward":
        lines += _call_line(main, target, "grads")
        lines += ["dq, dk, dv = grads[:3]",
                  "ref = reference.backward(q, k, v, grad_out, mask, is_causal, scale, **fields)",
                  "ref_dq, ref_dk, ref_dv = ref[:3]"]
    else:
        lines += _call_line(main, target, "out, lse" if return_lse else "out")
        lines.append("expected = reference.forward(q, k, v, mask, is_causal, scale, **fields)  # .output, .lse")
        lines.append("visible = expected.visible  # (B, H, Lq, Lk) pairs that take part")
    return "\n".join(lines + list(checks))


def fail_unless(verdict: Verdict, prop: str, target, case: Case, call: str = "forward", checks: tuple = (),
                grad_line: str = "", return_lse: bool = False):
    if not verdict:
        raise ConformanceFailure(prop, target, verdict, case,
                                 snippet(target, case, call, checks, grad_line, return_lse))


def with_full_index(verdict: Verdict, rows: np.ndarray) -> Verdict:
    """A verdict over the judged rows (rows[sel] flattened) re-indexed into the full tensor."""
    if verdict or verdict.where is None or len(verdict.where) != 2:  # (judged row, column); else already full
        return verdict
    full = tuple(int(i) for i in np.argwhere(rows)[verdict.where[0]]) + tuple(verdict.where[1:])
    return dataclasses.replace(verdict, where=full, message=verdict.message.replace(str(verdict.where), str(full)))


# ---- what the backend should produce --------------------------------------------------

def expected_forward(case: Case):
    """reference.Forward of the case (every field counted)."""
    return reference.forward(case.problem)


def plain_output(case: Case, dtype: str) -> np.ndarray:
    return error_budget.plain_forward(case.problem, dtype=dtype)


def reduction_length(case: Case) -> int:
    p = case.problem
    return int(max(p.Lq, p.Lk, p.E, p.Ev, 1))


def output_tolerance(case: Case, dtype: str) -> float:
    """The error budget of this problem's output over the judged rows (specs.error_budget)."""
    return error_budget.forward_allowed(case.problem, dtype=dtype, rows=case.judged_rows())[0]


def score_size(case: Case) -> float:
    return error_budget.score_size(case.q, case.k, case.mask, case.is_causal, case.scale, value=case.v, **case.fields)


def judged_rows(case: Case) -> np.ndarray:
    """(B, H, Lq) bool: rows with at least one visible key (the only rows the spec judges)."""
    return case.judged_rows()


def worst(deviation: np.ndarray, judged: np.ndarray) -> tuple:
    """(where, amount) of the largest deviation over judged entries; NaN counts as infinite."""
    dev = np.where(judged, deviation, 0.0)
    dev = np.where(np.isnan(dev), np.inf, dev)
    if dev.size == 0:
        return None, 0.0
    where = tuple(int(i) for i in np.unravel_index(int(np.argmax(dev)), dev.shape))
    return where, float(dev[where])
