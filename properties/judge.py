"""Expected values and verdicts for one Case, and failures a user can act on.

A failed property raises `ConformanceFailure` (an AssertionError, so Hypothesis shrinks
it): the backend, dtype, invariant, where and how much, the problem, and a NumPy snippet
that rebuilds the inputs and makes the same call.
"""
from __future__ import annotations

import textwrap

import numpy as np
from hypothesis import reject
from hypothesis import strategies as st

from specs import error_budget, reference
from specs.invariants import Verdict

from .strategies import Case, cases


class ConformanceFailure(AssertionError):
    def __init__(self, prop: str, target, verdict: Verdict, case: Case, snippet: str):
        self.prop, self.backend, self.dtype = prop, target.name, target.dtype
        self.verdict, self.case, self.snippet = verdict, case, snippet
        where = "" if verdict.where is None else f"\n  where: {verdict.where}  (index into the tensor named above)"
        much = "" if verdict.amount != verdict.amount else f"\n  how much: {verdict.amount:.6g}"  # NaN: no amount
        super().__init__(f"{prop} failed on backend {target.name!r} at {target.dtype}\n"
                         f"  {verdict.message}{where}{much}\n  problem: {case!r}\n"
                         f"Reproduce:\n{textwrap.indent(snippet, '    ')}")


def draw_case(data, target, **kwargs) -> Case:
    """The test's problem: a seed example given with @example(data=Case), else a fresh draw."""
    if isinstance(data, Case):  # a seed example: only where its shapes suit the backend
        d = data.dims
        reject_unless(not target.equal_head_dims or d["E"] == (d["Lk"] if kwargs.get("probe") else d["Ev"]))
        reject_unless(target.caps.causal or not data.is_causal)
        case = data.rounded(target.dtype)
    else:
        case = data.draw(cases(target.dtype, target.caps, compiled=target.compiled,
                               equal_dims=target.equal_head_dims, **kwargs), label="problem")
    target.examples += 1
    return case


def reject_unless(condition: bool) -> None:
    if not condition:
        reject()


def _scale_arg(case: Case) -> str:
    return "None" if case.scale is None else repr(case.scale)


def snippet(target, case: Case, call: str = "forward", checks: tuple = (), grad_line: str = "") -> str:
    """NumPy code that rebuilds the inputs, calls the backend and the reference."""
    args = f"mask, is_causal=is_causal, scale=scale, dtype={target.dtype!r}"
    lines = ["import numpy as np", "from backends.registry import resolve", "from specs import reference",
             "from specs.problem import causal_mask", *case.code,
             f"is_causal, scale = {case.is_causal}, {_scale_arg(case)}",
             f"backend = resolve({getattr(target, 'spec', target.name)!r})"]
    if call == "backward":
        lines += [grad_line or "grad_out = np.ones(q.shape[:-1] + v.shape[-1:])  # d(sum of outputs)",
                  f"dq, dk, dv = backend.backward(q, k, v, grad_out, {args})"]
    else:
        lines.append(f"out = backend.forward(q, k, v, {args})  # (B, H, Lq, Ev)")
    d = case.dims
    vis = "mask" if not case.is_causal else (
        f"causal_mask({d['Lq']}, {d['Lk']}, {target.alignment!r})" if case.mask is None else
        f"mask & causal_mask({d['Lq']}, {d['Lk']}, {target.alignment!r})")
    lines.append(f"visible = {vis}  # (.., Lq, Lk) pairs that take part")
    if call == "backward":
        lines.append(f"ref_dq, ref_dk, ref_dv = reference.backward(q, k, v, grad_out, visible, scale=scale)")
    else:
        lines.append(f"expected = reference.attention(q, k, v, visible, scale=scale)")
    return "\n".join(lines + list(checks))


def fail_unless(verdict: Verdict, prop: str, target, case: Case, call: str = "forward", checks: tuple = (),
                grad_line: str = ""):
    if not verdict:
        raise ConformanceFailure(prop, target, verdict, case, snippet(target, case, call, checks, grad_line))


# ---- what the backend should produce --------------------------------------------------

def expected_forward(case: Case, alignment: str):
    """reference.Forward on the visible pairs (so a declared bottom-right alignment is honoured)."""
    return reference.forward(case.q, case.k, case.v, case.visible(alignment), False, case.scale)


def plain_output(case: Case, alignment: str, dtype: str) -> np.ndarray:
    return error_budget.plain_forward(case.q, case.k, case.v, case.visible(alignment), False, case.scale, dtype)


def reduction_length(case: Case) -> int:
    return error_budget.reduction_length(case.q.shape, case.k.shape, case.v.shape)


def output_tolerance(case: Case, alignment: str, dtype: str) -> float:
    """The error budget of this problem's output over the judged rows (specs.error_budget)."""
    return error_budget.forward_allowed(case.q, case.k, case.v, case.visible(alignment), False, case.scale, dtype,
                                        rows=judged_rows(case, alignment))[0]


def score_size(case: Case, alignment: str) -> float:
    return error_budget.score_size(case.q, case.k, case.visible(alignment), False, case.scale)


def judged_rows(case: Case, alignment: str) -> np.ndarray:
    """(B, H, Lq) bool: rows with at least one visible key (the only rows the spec judges)."""
    return case.visible(alignment).any(axis=-1)
