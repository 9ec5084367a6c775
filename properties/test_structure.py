"""Family: structure — (batch, head) slices are independent; queries permute, keys+values don't matter in order.

Independence is exact: changing one slice's inputs leaves every other slice bit-for-bit
alone (the same program runs on the same numbers).  Permutations may reorder a kernel's
sums, so they are judged with the budget: both outputs are within the budget of their
references, which are exact permutations of each other, hence 2 x the budget.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from attnspec.properties.distribution import Cases, cases
from attnspec.properties.explore import prop
from attnspec.properties.judge import output_tolerance, require, shown, unchanged, verdict, worst
from attnspec.specs import fields as F

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target


def _slice(draw, case: Case, target: Target) -> dict:
    d = case.dims
    return {"b": draw(st.integers(0, d["B"] - 1), label="changed batch"),
            "h": draw(st.integers(0, d["Hkv"] - 1), label="changed KV head")}


@prop(keep=lambda c: c.dims["B"] * c.dims["Hkv"] > 1, params=_slice, seed_params={"b": 0, "h": 0})
def test_batch_head_independence(target: Target, case: Case, params: dict):
    b, h, g = params["b"], params["h"], case.group  # query heads h*g .. h*g + g - 1 read KV head h
    before = target.forward(case)  # (B, H, Lq, Ev)
    q, k, v = case.q.copy(), case.k.copy(), case.v.copy()
    q[b, h * g:h * g + g] = -2 * q[b, h * g:h * g + g] + 1
    k[b, h], v[b, h] = k[b, h][::-1], 3 * v[b, h] - 1  # only KV head h of batch b (and its query heads) change
    after = target.forward(target.exact(case.replace(q=q, k=k, v=v)))  # (B, H, Lq, Ev) fp8: rounded, saturated
    others = case.judged_rows().copy()  # (B, H, Lq)
    others[b, h * g:h * g + g] = False
    unchanged("batch_head_independence", before, after, others,
              f"only batch {b}, query heads {h * g}..{h * g + g - 1} (KV head {h}) changed; another slice")


# fields tied to positions (a window, ALiBi distances, lengths) do not permute with the rows
_POSITIONAL = F.POSITIONAL  # no permutation keeps their pairs


def _kinds(target: Target) -> Cases:
    kinds = ("none", "mask", "empty_rows") + (("causal", "causal_mask") if target.caps.masks else ())
    return cases(kinds=kinds, avoid=_POSITIONAL)


def _permutation(axis):
    def draw_perm(draw, case, target) -> dict:
        n = case.dims["Lq" if axis == "q" else "Lk"]
        return {"perm": list(draw(st.permutations(range(n)), label=f"{'query' if axis == 'q' else 'key'} permutation"))}
    return draw_perm


def _check_permuted(target: Target, case, perm, axis: str, name: str) -> None:
    case = case.causal_as_mask()  # a permutation moves queries and keys off the diagonal
    before = target.forward(case)  # (B, H, Lq, Ev)
    moved = case.permuted(axis, perm)
    after = target.forward(moved)  # (B, H, Lq, Ev)
    expect = before[..., perm, :] if axis == "q" else before  # (B, H, Lq, Ev)
    rows = moved.judged_rows()  # (B, H, Lq)
    # both outputs are within the budget of references that permute exactly: 2 x the budget
    atol = 2 * output_tolerance(moved, target)
    where, amount = worst(diff := np.abs(after - expect), np.broadcast_to(rows[..., None], after.shape))
    what = "queries" if axis == "q" else "keys and values jointly"
    require(verdict(name, amount <= atol, where, amount,
                    f"after permuting the {what} by {perm}, output at {where} (batch, head, query, column) is off "
                    f"by {shown(diff, where, amount)} from the {'permuted ' if axis == 'q' else ''}original output "
                    f"(allowed {atol:.3g} = 2 x budget)", atol))


@prop(draw=_kinds, params=_permutation("q"))
def test_query_permutation_equivariance(target: Target, case: Case, params: dict):
    _check_permuted(target, case, params["perm"], "q", "query_permutation_equivariance")


@prop(draw=_kinds, params=_permutation("k"))
def test_key_value_permutation_invariance(target: Target, case: Case, params: dict):
    _check_permuted(target, case, params["perm"], "k", "key_value_permutation_invariance")
