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

from attnspec.specs.invariants import Verdict
from attnspec.specs.problem import causal_mask

from attnspec.properties.judge import draw_case, fail_unless, judged_rows, output_tolerance, worst
from attnspec.properties.reuse import integers
from attnspec.properties.strategies import Case


@given(data=st.data())
def test_batch_head_independence(target, data):
    case = draw_case(data, target)
    d = case.dims
    assume(d["B"] * d["Hkv"] > 1)
    b = data.draw(integers(0, d["B"] - 1), label="changed batch") if not isinstance(data, Case) else 0
    h = data.draw(integers(0, d["Hkv"] - 1), label="changed KV head") if not isinstance(data, Case) else 0
    g = d["H"] // d["Hkv"]  # query heads reading KV head h: h*g .. h*g + g - 1
    before = target.forward(case)  # (B, H, Lq, Ev)
    changed = case.then(f"q[{b}, {h * g}:{h * g + g}] = -2 * q[{b}, {h * g}:{h * g + g}] + 1",
                        f"k[{b}, {h}], v[{b}, {h}] = k[{b}, {h}][::-1], 3 * v[{b}, {h}] - 1  "
                        f"# only KV head {h} of batch {b} (and its query heads) change")
    after = target.forward(changed)  # (B, H, Lq, Ev)
    others = judged_rows(case).copy()  # (B, H, Lq)
    others[b, h * g:h * g + g] = False
    where, amount = worst(np.abs(after - before), np.broadcast_to(others[..., None], after.shape))
    verdict = Verdict("batch_head_independence", amount == 0.0, where if amount else None, amount,
                      f"output at {where} (batch, head, query, column) changed by {amount:.6g} when only "
                      f"batch {b}, query heads {h * g}..{h * g + g - 1} (KV head {h}) changed")
    fail_unless(verdict, "batch_head_independence", target, case,
                checks=(f"q2, k2, v2 = q.copy(), k.copy(), v.copy(); q2[{b}, {h * g}:{h * g + g}] = "
                        f"-2 * q2[{b}, {h * g}:{h * g + g}] + 1; k2[{b}, {h}] = k2[{b}, {h}][::-1]; "
                        f"v2[{b}, {h}] = 3 * v2[{b}, {h}] - 1",
                        f"out2 = backend.forward(q2, k2, v2, dtype={target.dtype!r}, **call_kwargs)",
                        f"print(out2 - out)  # only batch {b}, query heads {h * g}..{h * g + g - 1} may change"))


def _explicit(case: Case) -> Case:
    """Causal made an explicit mask (a permutation moves queries and keys off the diagonal)."""
    if not case.is_causal:
        return case
    d = case.dims
    line = f"mask = (True if mask is None else mask) & causal_mask({d['Lq']}, {d['Lk']}, {case.alignment!r})"
    return dataclasses.replace(case.then(line, causal_mask=causal_mask), is_causal=False)


# fields tied to positions (a window, ALiBi distances, lengths) do not permute with the rows
_POSITIONAL = frozenset(("window", "alibi", "seq_lengths"))


def _check_permuted(target, data, axis: str, prop: str):
    kinds = ("none", "mask", "empty_rows") + (("causal", "causal_mask") if target.caps.masks else ())
    case = _explicit(draw_case(data, target, kinds=kinds, avoid=_POSITIONAL))
    n = case.dims["Lq" if axis == "q" else "Lk"]
    perm = list(range(n))[::-1] if isinstance(data, Case) else \
        data.draw(st.permutations(range(n)), label=f"{'query' if axis == 'q' else 'key'} permutation")
    before = target.forward(case)  # (B, H, Lq, Ev)

    def moves(sfx):
        side, seg = ("q", "q_segment_ids") if axis == "q" else ("k", "kv_segment_ids")
        cols = "..., {p}, :" if axis == "q" else "..., :, {p}"
        return (f"q{sfx}, k{sfx}, v{sfx} = " + (f"q[..., {perm}, :], k, v" if axis == "q"
                                               else f"q, k[..., {perm}, :], v[..., {perm}, :]"),
                f"mask{sfx} = mask if mask is None or mask.shape[{-2 if axis == 'q' else -1}] == 1 else "
                f"mask[{cols.format(p=perm)}]",
                f"fields{sfx} = dict(fields)",
                f"if 'bias' in fields and fields['bias'].shape[{-2 if axis == 'q' else -1}] > 1: "
                f"fields{sfx}['bias'] = fields['bias'][{cols.format(p=perm)}]",
                f"if '{seg}' in fields: fields{sfx}['{seg}'] = fields['{seg}'][..., {perm}]")
    moved = case.then(*moves(""))
    after = target.forward(moved)  # (B, H, Lq, Ev)
    expect = before[..., perm, :] if axis == "q" else before  # (B, H, Lq, Ev)
    rows = judged_rows(moved)  # (B, H, Lq)
    # both outputs are within the budget of references that permute exactly: 2 x the budget
    atol = 2 * output_tolerance(moved, target.budget_dtype)
    where, amount = worst(np.abs(after - expect), np.broadcast_to(rows[..., None], after.shape))
    what = "queries" if axis == "q" else "keys and values jointly"
    verdict = Verdict(prop, amount <= atol, where, amount,
                      f"after permuting the {what}, output at {where} (batch, head, query, column) is off by "
                      f"{amount:.6g} from the {'permuted ' if axis == 'q' else ''}original output "
                      f"(allowed {atol:.3g} = 2 x budget)")
    expected = f"out[..., {perm}, :]" if axis == "q" else "out"
    fail_unless(verdict, prop, target, case, checks=moves("2") + (
        f"out2 = backend.forward(q2, k2, v2, mask2, is_causal=False, scale=scale, dtype={target.dtype!r}, **fields2)",
        f"print(np.abs(out2 - {expected}).max())  # must be ~0: {what} permuted"))


@given(data=st.data())
def test_query_permutation_equivariance(target, data):
    _check_permuted(target, data, "q", "query_permutation_equivariance")


@given(data=st.data())
def test_key_value_permutation_invariance(target, data):
    _check_permuted(target, data, "k", "key_value_permutation_invariance")
