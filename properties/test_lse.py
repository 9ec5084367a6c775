"""Family: the log-sum-exp — lse_i = log sum_j exp(s_ij) over the visible final scores (natural log).

Backends that return it (flash kernels, PyTorch's CPU flash op, JAX's residual) are checked on
it, and on what it is for: attention over two key chunks, merged through their LSEs
(`specs.reference.merge`, flash-decoding's split-KV), equals attention over all keys.  Bugs
this catches: an LSE without the scale or scaled twice (HKUSTDial/flash-sparse-attention#106),
log2 instead of ln, an LSE of the wrong row (Dao-AILab/flash-attention#2388).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from attnspec.properties import test_edges as edges  # a module: pytest collects no property here
from attnspec.properties.distribution import cases
from attnspec.properties.explore import prop
from attnspec.properties.judge import output_tolerance, require, rule_of, shown, verdict, with_full_index, worst
from attnspec.properties.test_sinks import lse_as_declared
from attnspec.specs import error_budget, reference
from attnspec.specs import fields as F

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target

# chunks of keys cannot carry fields tied to key positions (causal, windows, ALiBi, lengths)
_POSITIONAL = F.POSITIONAL  # no permutation keeps their pairs


def lse_agreement(target: Target, case: Case, lse=None) -> None:
    """The backend's LSE (asked for when None) within the error budget of the reference, on the judged rows."""
    if lse is None:
        _, lse = target.forward(case, return_lse=True)  # (B, H, Lq, Ev), (B, H, Lq)
    rows = case.judged_rows()  # (B, H, Lq) rows with no visible key: the LSE is left open
    require(with_full_index(error_budget.check_lse(lse, case.problem, dtype=target.budget_dtype, rows=rows,
                                                   rule=rule_of(target)), rows))


@prop(requires=("lse",))
def test_lse_matches_reference(target: Target, case: Case, params: dict):
    lse_agreement(target, case)


def _edge_rows(target: Target) -> list:
    """The edge grid's rows against 512 keys and more (a split-KV path merges its splits' LSEs into the one it
    returns: one that returns its first split's LSE writes the right output), where draws never go; and those
    with rows that see no key (bottom-right causal under Lq > Lk: a row loop that skips them leaves a 0); and
    the decodes under grouped heads (a decode kernel packing a KV head's group of 3 into a tile of 4 rows stores
    its LSEs at that stride)."""
    return edges.grid_problems(target, [e for e in edges.grid() if e.Lk >= 512 or (e.causal and e.Lq > e.Lk)
                                        or (e.Lq == 1 and e.Hkv not in (None, e.H))])


@prop(requires=("lse",), grid=_edge_rows)
def test_lse_edges_match_reference(target: Target, case: Case, params: dict):
    """The LSE on the edge grid's long rows (decodes and 16 queries against 512 to 2048 keys, with each field)
    and on its rows that see no key (the declared `empty_lse` there: -inf or +inf)."""
    _, lse = target.forward(case, return_lse=True)  # (B, H, Lq)
    if case.fields.get("sinks") is None:
        lse_agreement(target, case, lse)
    else:  # with or without the sink as the backend declares (lse_with_sinks)
        lse_as_declared(target, case, lse, "lse_edges_match_reference")
    declared = target.backend.semantics.empty_lse
    if declared in ("-inf", "+inf"):
        empty = ~case.judged_rows()  # (B, H, Lq)
        if case.fields.get("sinks") is not None:  # a row with its finite sink holds it (lse_as_declared judged it)
            empty &= ~np.isfinite(np.asarray(case.fields["sinks"], dtype=np.float64))[:, None]
        wrong = empty & (lse != float(declared))  # (B, H, Lq)
        where = tuple(int(i) for i in np.argwhere(wrong)[0]) if wrong.any() else None
        require(verdict("lse_edges_match_reference", not wrong.any(), where, float(wrong.sum()),
                        f"the LSE of a row that sees no key is {lse[where] if where else ''} at {where} (batch, head, "
                        f"query), declared empty_lse {declared}", 0.0))


def _split(draw, case: Case, target: Target) -> dict:
    Lk = case.dims["Lk"]
    # a backend that compiles per shape splits in the middle: two chunk shapes per menu shape
    return {"c": Lk // 2 if target.compiled else draw(st.integers(1, Lk - 1), label="split after key")}


@prop(requires=("lse",), draw=cases(kinds=("none", "mask", "empty_rows"), avoid=_POSITIONAL),
      keep=lambda c: c.dims["Lk"] >= 2, params=_split)
def test_split_merge_identity(target: Target, case: Case, params: dict):
    """Attention over keys [0, c) and [c, Lk) merged through their LSEs equals attention over all keys."""
    c, Lk = params["c"], case.dims["Lk"]
    full, _ = target.forward(case, return_lse=True)  # (B, H, Lq, Ev)
    parts = []
    for lo, hi in ((0, c), (c, Lk)):
        part = case.keys(lo, hi)
        out, lse = target.forward(part, return_lse=True)  # (B, H, Lq, Ev), (B, H, Lq)
        seen = part.judged_rows()  # a row that sees nothing in a chunk adds nothing, whatever it returned
        parts.append((np.where(seen[..., None], out, 0.0), np.where(seen, lse, -np.inf)))
    merged, _ = reference.merge(parts)  # (B, H, Lq, Ev)
    rows = case.judged_rows()
    # each chunk's output and LSE are within their budgets; the merge is exact arithmetic on them
    atol = output_tolerance(case, target) + sum(output_tolerance(case.keys(lo, hi), target)
                                                for lo, hi in ((0, c), (c, Lk))) + \
        error_budget.lse_allowed(case.problem, dtype=target.budget_dtype, rule=rule_of(target))[0] * \
        float(np.max(np.abs(case.v), initial=0))
    where, amount = worst(diff := np.abs(merged - full), np.broadcast_to(rows[..., None], full.shape))
    require(verdict("split_merge_identity", amount <= atol, where, amount,
                    f"keys split after {c - 1}: the LSE-merged output at {where} differs from the full output by "
                    f"{shown(diff, where, amount)} (allowed {atol:.3g})", atol))
