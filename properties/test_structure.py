"""Family: structure — (batch, head) slices are independent; queries permute, keys+values don't matter in order.

Independence is exact: changing one slice's inputs leaves every other slice bit-for-bit
alone (the same program runs on the same numbers).  Permutations may reorder a kernel's
sums, so they are judged with the budget: both outputs are within the budget of their
references, which are exact permutations of each other, hence 2 x the budget.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

from specs.invariants import Verdict
from specs.problem import causal_mask

from .judge import draw_case, fail_unless, judged_rows, output_tolerance
from .strategies import Case


@given(data=st.data())
def test_batch_head_independence(target, data):
    case = draw_case(data, target)
    d = case.dims
    assume(d["B"] * d["H"] > 1)
    b = data.draw(st.integers(0, d["B"] - 1), label="changed batch") if not isinstance(data, Case) else 0
    h = data.draw(st.integers(0, d["H"] - 1), label="changed head") if not isinstance(data, Case) else 0
    before = target.forward(case)  # (B, H, Lq, Ev)
    changed = case.then(f"q[{b}, {h}], k[{b}, {h}], v[{b}, {h}] = -2 * q[{b}, {h}] + 1, k[{b}, {h}][::-1], "
                        f"3 * v[{b}, {h}] - 1  # only slice ({b}, {h}) changes")
    after = target.forward(changed)  # (B, H, Lq, Ev)
    others = judged_rows(case, target.alignment)  # (B, H, Lq)
    others[b, h] = False
    diff = np.where(others[..., None], np.abs(after - before), 0.0)  # (B, H, Lq, Ev)
    diff = np.where(np.isnan(diff), np.inf, diff)
    where = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    worst = float(diff[where])
    verdict = Verdict("batch_head_independence", worst == 0.0, where if worst else None, worst,
                      f"output at {where} (batch, head, query, column) changed by {worst:.6g} when only "
                      f"slice ({b}, {h}) of q, k, v changed")
    fail_unless(verdict, "batch_head_independence", target, case,
                checks=(f"q2, k2, v2 = q.copy(), k.copy(), v.copy(); q2[{b}, {h}] = -2 * q2[{b}, {h}] + 1; "
                        f"k2[{b}, {h}] = k2[{b}, {h}][::-1]; v2[{b}, {h}] = 3 * v2[{b}, {h}] - 1",
                        f"out2 = backend.forward(q2, k2, v2, mask, is_causal=is_causal, scale=scale, dtype={target.dtype!r})",
                        f"print(out2 - out)  # only slice ({b}, {h}) may change"))


def _explicit(case: Case, target) -> Case:
    """Causal made an explicit mask (a permutation moves queries and keys off the diagonal)."""
    if not case.is_causal:
        return case
    d = case.dims
    line = f"mask = (True if mask is None else mask) & causal_mask({d['Lq']}, {d['Lk']}, {target.alignment!r})"
    return dataclasses.replace(case.then(line, causal_mask=causal_mask), is_causal=False)


def _check_permuted(target, data, axis: str, prop: str):
    kinds = ("none", "mask", "empty_rows") + (("causal", "causal_mask") if target.caps.masks else ())
    case = _explicit(draw_case(data, target, kinds=kinds), target)
    n = case.dims["Lq" if axis == "q" else "Lk"]
    perm = list(range(n))[::-1] if isinstance(data, Case) else \
        data.draw(st.permutations(range(n)), label=f"{'query' if axis == 'q' else 'key'} permutation")
    before = target.forward(case)  # (B, H, Lq, Ev)
    def moves(sfx):
        if axis == "q":
            return (f"q{sfx}, k{sfx}, v{sfx} = q[..., {perm}, :], k, v",
                    f"mask{sfx} = None if mask is None else mask[..., {perm}, :]")
        return (f"q{sfx}, k{sfx}, v{sfx} = q, k[..., {perm}, :], v[..., {perm}, :]",
                f"mask{sfx} = None if mask is None else mask[..., :, {perm}]")
    moved = case.then(*moves(""))
    after = target.forward(moved)  # (B, H, Lq, Ev)
    expect = before[..., perm, :] if axis == "q" else before  # (B, H, Lq, Ev)
    rows = judged_rows(moved, target.alignment)  # (B, H, Lq)
    # both outputs are within the budget of references that permute exactly: 2 x the budget
    atol = 2 * output_tolerance(moved, target.alignment, target.budget_dtype)
    diff = np.where(rows[..., None], np.abs(after - expect), 0.0)  # (B, H, Lq, Ev)
    diff = np.where(np.isnan(diff), np.inf, diff)
    where = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    worst = float(diff[where])
    what = "queries" if axis == "q" else "keys and values jointly"
    verdict = Verdict(prop, worst <= atol, where, worst,
                      f"after permuting the {what}, output at {where} (batch, head, query, column) is off by "
                      f"{worst:.6g} from the {'permuted ' if axis == 'q' else ''}original output "
                      f"(allowed {atol:.3g} = 2 x budget)")
    expected = f"out[..., {perm}, :]" if axis == "q" else "out"
    fail_unless(verdict, prop, target, case, checks=moves("2") + (
        f"out2 = backend.forward(q2, k2, v2, mask2, is_causal=False, scale=scale, dtype={target.dtype!r})",
        f"print(np.abs(out2 - {expected}).max())  # must be ~0: {what} permuted"))


@given(data=st.data())
def test_query_permutation_equivariance(target, data):
    _check_permuted(target, data, "q", "query_permutation_equivariance")


@given(data=st.data())
def test_key_value_permutation_invariance(target, data):
    _check_permuted(target, data, "k", "key_value_permutation_invariance")
