"""Family: attention sinks — a logit s_h per query head in every row's denominator (issue 31).

w_ij = exp(z_ij) / (sum_visible exp(z_ij') + exp(s_h)): a virtual key of value 0 that no scale,
softcap, bias or mask touches (gpt-oss; FA4 `learnable_sink`, FlashInfer `sinks`).  Its closed form,
on the backend's own outputs: O(sinks) = O(none) sigma(LSE - s_h), LSE(sinks) = logaddexp(LSE, s_h).
Bugs this catches: sinks accepted and dropped (vllm-project/vllm#52148: gpt-oss scored 0 on GSM8K),
counted once per split (ROCm/rocm-libraries#12227), scaled or capped like a score, read by KV head,
given a value, an LSE without the sink where it is declared with it; in packed and paged calls (where
a backend declares them), sinks accepted and dropped by that path alone, or counted once per page.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from attnspec.properties import serving_calls as S
from attnspec.properties.distribution import cases
from attnspec.properties.explore import prop
from attnspec.properties.judge import (
    agreement,
    check_gradients,
    grad_out,
    output_tolerance,
    require,
    rule_of,
    shown,
    verdict,
    with_full_index,
    worst,
)
from attnspec.properties.test_gradients import WHOLE_ROWS, grad_seed, whole_rows
from attnspec.specs import error_budget, reference, sink_budget
from attnspec.specs import fields as F

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target

_SINKS = ("sinks",)


def _lse_tol(case: Case, target: Target) -> float:
    return error_budget.lse_allowed(case.problem, dtype=target.budget_dtype, rule=rule_of(target))[0]


def _head_sinks(case: Case) -> np.ndarray:
    return np.asarray(case.fields["sinks"], dtype=np.float64)[:, None]  # (Hq, 1) against (B, Hq, Lq)


def _close(name: str, got, want, rows, atol: float, what: str) -> None:
    diff = np.abs(got - want)  # (B, H, Lq, Ev)
    where, amount = worst(diff, np.broadcast_to(rows[..., None], np.shape(got)))
    require(verdict(name, amount <= atol, where, amount, f"{what}: at {where} (batch, head, query, column) off by "
                                                         f"{shown(diff, where, amount)} (allowed {atol:.3g})", atol))


@prop(requires=_SINKS)
def test_sinks_match_reference(target: Target, case: Case, params: dict):
    """The output with drawn sinks (some far above the row's scores, some -inf) within the budget."""
    agreement(target, case)


@prop(requires=("sinks", "gqa"))
def test_one_sink_per_query_head(target: Target, case: Case, params: dict):
    """Grouped heads: query head h reads sinks[h], not its KV head's index h // group."""
    agreement(target, case)


@prop(requires=("sinks", "softcap"))
def test_sinks_untouched_by_softcap(target: Target, case: Case, params: dict):
    """The cap acts on the scores only (FA4's reference appends the sink after tanh)."""
    agreement(target, case)


@prop(requires=_SINKS, draw=cases(kinds=("causal", "mask", "empty_rows", "causal_mask")))
def test_sinks_untouched_by_masks(target: Target, case: Case, params: dict):
    """Causal triangles and masks hide keys, never the sink (gpt-oss applies its window to real keys)."""
    agreement(target, case)


@prop(requires=("sinks", "window"))
def test_sinks_untouched_by_window(target: Target, case: Case, params: dict):
    agreement(target, case)


@prop(requires=("sinks", "seq_lengths"))
def test_sinks_untouched_by_padding(target: Target, case: Case, params: dict):
    agreement(target, case)


def _scale(draw, case: Case, target: Target) -> dict:
    return {"factor": (0.25, 0.5)[draw(st.integers(0, 1), label="scale factor")]}


@prop(requires=_SINKS, params=_scale)
def test_sinks_untouched_by_scale(target: Target, case: Case, params: dict):
    """A smaller softmax scale shrinks the scores, not the sink (a sink scaled like a score fails)."""
    scale = (case.scale if case.scale is not None else 1.0 / np.sqrt(case.dims["E"])) * params["factor"]
    agreement(target, case.replace(scale=float(scale)))


@prop(requires=_SINKS)
def test_sinks_not_inert(target: Target, case: Case, params: dict):
    """Every head's sink 6 above its rows' largest LSE: the row's output shrinks by e^6 at least."""
    lse = reference.forward(case.without("sinks").problem).lse  # (B, H, Lq)
    top = float(np.max(np.where(np.isfinite(lse), lse, -np.inf), initial=0.0))
    agreement(target, case.replace(sinks=np.full(case.dims["H"], np.ceil(top + 6.0))))


@prop(requires=_SINKS)
def test_minus_inf_sinks_are_no_sinks(target: Target, case: Case, params: dict):
    """sinks = -inf everywhere is the problem without sinks: both outputs within their budgets."""
    off = case.replace(sinks=np.full(case.dims["H"], -np.inf))
    a, b = target.forward(off), target.forward(case.without("sinks"))  # (B, H, Lq, Ev) twice
    _close("minus_inf_sinks_are_no_sinks", a, b, case.judged_rows(), 2 * output_tolerance(off, target),
           "sinks -inf vs no sinks")


@prop(requires=("sinks", "lse"))
def test_sinks_closed_form(target: Target, case: Case, params: dict):
    """O(sinks) = O(none) sigma(LSE(none) - s_h) on the backend's own outputs (transformers#41083's fix)."""
    plain = case.without("sinks")
    out0, lse0 = target.forward(plain, return_lse=True)  # (B, H, Lq, Ev), (B, H, Lq)
    rows = plain.judged_rows()
    with np.errstate(over="ignore", invalid="ignore"):
        sig = 1.0 / (1.0 + np.exp(_head_sinks(case) - np.where(rows, lse0, 0.0)))  # (B, H, Lq)
    want = out0 * sig[..., None]
    # both outputs within their budgets; sigma's slope is at most 1/4, times |O| <= max |v|
    atol = output_tolerance(case, target) + output_tolerance(plain, target) + \
        0.25 * _lse_tol(plain, target) * float(np.max(np.abs(case.v), initial=0))
    _close("sinks_closed_form", target.forward(case), want, rows, atol, "O(sinks) vs O(none) sigma(LSE - s)")


_WORD = {True: "included", False: "excluded", None: None}


def _record_lse_with_sinks(target: Target, fits: dict) -> None:
    """The semantics row `lse_with_sinks` (the report's conventions table): what the LSEs of this test's
    problems held - "included", "excluded", "either" (a sink too small to tell), "neither" or "varies" -
    one row for the test, updated as its problems come."""
    found = {"included" if fits[True] else "excluded"} if fits[True] != fits[False] else \
        {"either" if fits[True] else "neither"}
    row = next((r for r in target.answers if r["question"] == "lse_with_sinks"), None)
    if row is not None:  # the test's earlier problems: "varies" stood for both
        found |= {"included", "excluded"} if row["observed"] == "varies" else {row["observed"]}
        target.answers.remove(row)
    told = found - {"either"}
    observed = "neither" if "neither" in told else "varies" if len(told) > 1 else (told or {"either"}).pop()
    declared = _WORD[target.backend.semantics.lse_with_sinks]
    agrees = None if declared is None else observed in (declared, "either")
    target.answers.append(dict(backend=target.name, question="lse_with_sinks", dtype=target.dtype, observed=observed,
                               declared=declared, agrees=agrees))


@prop(requires=("sinks", "lse"))
def test_sinks_lse_as_declared(target: Target, case: Case, params: dict):
    """The returned LSE includes the sink where declared (FA4), excludes it where declared not (gpt-oss's
    Triton kernel); undeclared, it must be one of the two (recorded: the semantics row lse_with_sinks)."""
    _, lse = target.forward(case, return_lse=True)  # (B, H, Lq)
    lse_as_declared(target, case, lse, "sinks_lse_as_declared", record=True)


def lse_as_declared(target: Target, case: Case, lse, name: str, record: bool = False) -> None:
    """The LSE (B, H, Lq) of a call with sinks holds the sink as declared (`lse_with_sinks`), either
    of the two when undeclared; record: the semantics row of what it held (the padded call's test)."""
    declared = target.backend.semantics.lse_with_sinks
    fits = {}
    for included in (True, False):
        judged = case if included else case.without("sinks")
        # the sink counted: a row that sees no key still holds its sink's mass (LSE s_h, where the sink is finite)
        rows = judged.judged_rows() | (case.sink_only_rows() if included else False)
        # the LSE over the real keys from a running maximum started at the sink (gpt-oss's Triton kernel)
        shift = None if included else _head_sinks(case)  # (Hq, 1) against (B, H, Lq)
        if not included:  # rows whose keys' mass under the sink's maximum, exp(lse - s_h), is below the format's
            tau = error_budget._budget(target.budget_dtype).normal_min  # range: that kernel's l underflows to 0
            ref = reference.forward(judged.problem).lse  # (B, H, Lq)
            with np.errstate(invalid="ignore"):
                rows = rows & ~(ref - np.broadcast_to(shift, ref.shape) < np.log(tau))
        fits[included] = with_full_index(error_budget.check_lse(lse, judged.problem, dtype=target.budget_dtype,
                                                                rows=rows, rule=rule_of(target), shift=shift), rows)
    if record:
        _record_lse_with_sinks(target, {k: bool(v) for k, v in fits.items()})
    verdicts = [fits[included] for included in ((True, False) if declared is None else (declared,))]
    if not any(verdicts):
        v = verdicts[0]
        require(verdict(name, False, v.where, v.amount, f"the LSE, lse_with_sinks={declared}: {v.message}", v.limit))


def _split(draw, case: Case, target: Target) -> dict:
    Lk = case.dims["Lk"]
    return {"c": Lk // 2 if target.compiled else draw(st.integers(1, Lk - 1), label="split after key")}


@prop(requires=("sinks", "lse"), draw=cases(kinds=("none", "mask", "empty_rows"), avoid=F.POSITIONAL),
      keep=lambda c: c.dims["Lk"] >= 2, params=_split)
def test_sink_counted_once_under_split(target: Target, case: Case, params: dict):
    """Two key chunks without the sink merged through their LSEs, the sink merged once (value 0, LSE
    s_h), equal the whole call with it: a kernel adding it per split counts it twice."""
    c, Lk = params["c"], case.dims["Lk"]
    full = target.forward(case)  # (B, H, Lq, Ev)
    parts = []
    for lo, hi in ((0, c), (c, Lk)):
        part = case.keys(lo, hi).without("sinks")
        out, lse = target.forward(part, return_lse=True)  # (B, H, Lq, Ev), (B, H, Lq)
        seen = part.judged_rows()
        parts.append((np.where(seen[..., None], out, 0.0), np.where(seen, lse, -np.inf)))
    sink = np.broadcast_to(_head_sinks(case), parts[0][1].shape)  # (B, H, Lq)
    merged, _ = reference.merge(parts + [(np.zeros_like(full), sink)])  # (B, H, Lq, Ev)
    chunks = [case.keys(lo, hi).without("sinks") for lo, hi in ((0, c), (c, Lk))]
    atol = output_tolerance(case, target) + sum(output_tolerance(p, target) for p in chunks) + \
        sum(_lse_tol(p, target) for p in chunks) * float(np.max(np.abs(case.v), initial=0))
    _close("sink_counted_once_under_split", full, merged, case.judged_rows(), atol,
           f"keys split after {c - 1}, the sink merged once")


@prop(requires=_SINKS, draw=cases(probe=True))
def test_sink_rows_sum_to_one_minus_p_sink(target: Target, case: Case, params: dict):
    """V = identity: the output is the weights, and a row's weights sum to 1 - p_sink."""
    case = case.with_identity_values()
    weights = target.forward(case)  # (B, H, Lq, Lk)
    ref = reference.forward(case.problem)
    rows = case.judged_rows()
    # a normalising kernel's row sum errs by its weights' roundings, one that writes exp(s - lse) by
    # its lse's error: the lse budget covers both (specs.error_budget, weight row sums)
    allowed = error_budget.lse_allowed_rows(case.problem, dtype=target.budget_dtype, rule=rule_of(target))[0]
    allowed = allowed + error_budget.weight_sum_rounding(case.problem, dtype=target.budget_dtype)  # fp8: P, output
    err = np.abs(weights.sum(axis=-1) - (1.0 - ref.sink_weight))  # (B, H, Lq)
    where, amount = worst(np.where(rows, err - allowed, -np.inf), rows)
    require(verdict("sink_rows_sum_to_one_minus_p_sink", amount <= 0, where, amount,
                    f"row {where} (batch, head, query): weights sum {weights.sum(axis=-1)[where]:.6g}, expected "
                    f"1 - p_sink = {1.0 - ref.sink_weight[where]:.6g} (allowed {allowed[where]:.3g})",
                    float(allowed[where]) if where is not None else 0.0))


@prop(requires=_SINKS, gradients=True, draw=WHOLE_ROWS, keep=whole_rows, params=grad_seed)
def test_dsink_matches_reference(target: Target, case: Case, params: dict):
    """dSink_h = -sum_{b,i} p_sink (dO_i . O_i) within its budget; dQ, dK, dV with the sink's weight."""
    g = grad_out(case, target.dtype, params["grad_seed"])
    _, dsink = target.backward(case, g, return_dsink=True)
    v = sink_budget.check_dsink(dsink, case.problem, grad_out=g, dtype=target.budget_dtype, rule=rule_of(target))
    require(verdict("dsink_matches_reference", bool(v), v.where, v.amount, v.message, v.limit))
    check_gradients("dsink_matches_reference", target, case, g)


# ---- sinks in the serving formats' calls (issue 30's packed and paged calls; backends/serving.py) ------------

@prop(requires=_SINKS + S.REQUIRES, draw=S.DRAW, params=S.per_sequence)
def test_sinks_in_packed_calls(target: Target, case: Case, params: dict):
    """A packed call with sinks equals the reference: the lowering hands the sinks over, the varlen path
    applies them (vllm-project/vllm#52148: one path took sinks and dropped them)."""
    S.skip_without(target, "packed")
    case = S.problem_of(case, params)
    lse = target.supports("lse")  # then its LSE too, the sink in it as declared
    with S.as_called(case):
        y = S.packed(target, case, params["unused"], params["seed"], return_lse=lse)
        agreement(target, case, y[0] if lse else y)
        if lse:
            lse_as_declared(target, case, y[1], "sinks_in_packed_calls")


@prop(requires=_SINKS + S.REQUIRES, draw=S.DRAW, params=S.per_sequence)
def test_sinks_in_paged_calls(target: Target, case: Case, params: dict):
    """A paged call with sinks equals the reference, pages of 1 to 256 keys: each row's sink counted once,
    not once per page (a kernel whose pages are its key blocks folds it after the last one); its LSE
    holds the sink as declared."""
    layouts = S.paged_layouts(target)
    if not layouts:
        import pytest
        pytest.skip(f"{target.name} takes no paged call (declares {', '.join(target.caps.formats)})")
    layout = params["layout"] if params["layout"] in layouts else layouts[0]
    case = S.problem_of(case, params, queries=False)
    lse = target.supports("lse")
    with S.as_called(case):
        y = S.paged(target, case, params["page_size"], layout, params["seed"], pool=params["pool"], return_lse=lse)
        agreement(target, case, y[0] if lse else y)
        if lse:
            lse_as_declared(target, case, y[1], "sinks_in_paged_calls")


@prop(requires=_SINKS + S.REQUIRES, draw=S.DRAW, params=S.per_sequence, gradients=True)
def test_sinks_in_packed_gradients(target: Target, case: Case, params: dict):
    """dQ, dK, dV of a packed call with sinks: the backward recomputes the weights with each head's sink,
    as its forward did (sinks added to a forward kernel and not to its backward)."""
    S.skip_without(target, "packed")
    S.packed_gradients(target, S.problem_of(case, params), params["unused"], params["seed"],
                       "sinks_in_packed_gradients")


@prop(requires=_SINKS + S.REQUIRES, draw=S.DRAW, params=S.per_sequence)
def test_sinks_in_append_calls(target: Target, case: Case, params: dict):
    """An append then attention with sinks equals the reference over the grown cache: the fused path
    applies them as the paged and packed calls do (vllm-project/vllm#52148: a path that took sinks
    dropped them)."""
    from hypothesis import assume

    if "append" not in target.caps.formats:
        import pytest
        pytest.skip(f"{target.name} takes no append (declares {', '.join(target.caps.formats)})")
    fit = S.paged_layouts(target, case) or S.paged_layouts(target) or ("NHD",)
    layout = params["layout"] if params["layout"] in fit else fit[0]
    case = S.problem_of(case, params, queries=False)
    ends = case.lengths("kv")
    n = min(1 if params["seed"] % 2 else case.dims["Lq"], int((ends - case.fields.get("kv_starts", 0)).min()))
    assume(n > 0)  # a decode step, or a chunk of Lq, within every sequence's keys
    out, _, _ = S.append(target, case, n, params["page_size"], layout, params["seed"])
    with S.as_called(case):
        agreement(target, case, out)
