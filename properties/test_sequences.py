"""Family: padded and packed sequences — lengths and segment ids.

Keys at or past ``kv_lengths`` are hidden; query rows at or past ``q_lengths`` are padding
(what they output is a declared choice, see the semantics profile); a query sees only the keys
of its own segment.  What happens outside a sequence must not reach it, bit for bit.  Bugs this
catches: ``key_value_seq_lengths`` ignored (jax-ml/jax#23349), segments leaking across a
boundary, padding read (flash-attention#1228, xformers fills out-of-bounds with NaN in its tests).
"""
from __future__ import annotations

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

from attnspec.specs.invariants import Verdict

from attnspec.properties.judge import agreement, draw_case, fail_unless, judged_rows, requires, worst


def _unchanged(prop, target, case, other, rows, what, checks):
    before, after = target.forward(case), target.forward(other)  # (B, H, Lq, Ev) twice
    where, amount = worst(np.abs(after - before), np.broadcast_to(rows[..., None], before.shape))
    verdict = Verdict(prop, amount == 0.0, where if amount else None, amount,
                      f"{what}: output at {where} (batch, head, query, column) changed by {amount:.6g}; "
                      "it must not change at all")
    fail_unless(verdict, prop, target, case, checks=checks)


@given(data=st.data())
def test_other_segment_changes_nothing(target, data):
    """Changing the tokens of one segment leaves every row of the other segments bit-for-bit alone."""
    requires(target, "segment_ids")
    case = draw_case(data, target, need=frozenset({"segment_ids"}))
    agreement(target, case, "other_segment_changes_nothing")
    seg = int(case.fields["kv_segment_ids"].max())
    other = case.then(f"kv_seg = fields['kv_segment_ids'][:, None, :, None] == {seg}  # (B, 1, Lk, 1)",
                      "k, v = np.where(kv_seg, -k, k), np.where(kv_seg, 1 - v, v)  # segment's keys change",
                      f"q = np.where(fields['q_segment_ids'][:, None, :, None] == {seg}, 2 * q, q)")
    rows = judged_rows(case) & (case.fields["q_segment_ids"][:, None, :] != seg)  # (B, H, Lq)
    _unchanged("other_segment_changes_nothing", target, case, other, rows, f"segment {seg}'s tokens changed", checks=(
        f"kv_seg = fields['kv_segment_ids'][:, None, :, None] == {seg}",
        "k2, v2 = np.where(kv_seg, -k, k), np.where(kv_seg, 1 - v, v)",
        f"q2 = np.where(fields['q_segment_ids'][:, None, :, None] == {seg}, 2 * q, q)",
        f"out2 = backend.forward(q2, k2, v2, dtype={target.dtype!r}, **call_kwargs)",
        f"print(np.abs(out2 - out)[fields['q_segment_ids'][:, None, :] != {seg}].max())  # must be 0"))


@given(data=st.data())
def test_nan_in_padding_changes_nothing(target, data):
    """NaN in the padding (keys past kv_lengths, queries past q_lengths) changes no real row."""
    requires(target, "seq_lengths")
    case = draw_case(data, target, need=frozenset({"seq_lengths"}))
    agreement(target, case, "nan_in_padding_changes_nothing")
    d = case.dims
    assume(min(case.fields["kv_lengths"]) < d["Lk"] or min(case.fields["q_lengths"]) < d["Lq"])
    padded = case.then("pad_k = np.arange(k.shape[-2]) >= fields['kv_lengths'][:, None, None]  # (B, 1, Lk)",
                       "pad_q = np.arange(q.shape[-2]) >= fields['q_lengths'][:, None, None]  # (B, 1, Lq)",
                       "k, v = np.where(pad_k[..., None], np.nan, k), np.where(pad_k[..., None], np.nan, v)",
                       "q = np.where(pad_q[..., None], np.nan, q)  # NaN in every padded position")
    rows = judged_rows(case)  # (B, H, Lq) real rows that see a key
    _unchanged("nan_in_padding_changes_nothing", target, case, padded, rows, "NaN put in the padding", checks=(
        "pad_k = np.arange(k.shape[-2]) >= fields['kv_lengths'][:, None, None]",
        "pad_q = np.arange(q.shape[-2]) >= fields['q_lengths'][:, None, None]",
        "k2, v2 = np.where(pad_k[..., None], np.nan, k), np.where(pad_k[..., None], np.nan, v)",
        "q2 = np.where(pad_q[..., None], np.nan, q)",
        f"out2 = backend.forward(q2, k2, v2, dtype={target.dtype!r}, **call_kwargs)",
        "print(np.abs(out2 - out)[visible.any(-1)].max())  # must be 0, and no NaN"))
