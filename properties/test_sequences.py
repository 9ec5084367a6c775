"""Family: padded and packed sequences — lengths and segment ids.

Keys at or past ``kv_lengths`` are hidden; query rows at or past ``q_lengths`` are padding
(what they output is a declared choice, see the semantics profile); a query sees only the keys
of its own segment.  What happens outside a sequence must not reach it, bit for bit.  Each
sequence of a batch has lengths and segments of its own (properties/variants.py).  Bugs this
catches: ``key_value_seq_lengths`` ignored (jax-ml/jax#23349), one sequence's lengths used for
the whole batch, segments leaking across a boundary, padding read (flash-attention#1228,
xformers fills out-of-bounds with NaN in its tests).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnspec.properties.explore import prop
from attnspec.properties.judge import agreement, unchanged

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target


@prop(requires=("segment_ids",))
def test_other_segment_changes_nothing(target: Target, case: Case, params: dict):
    """Changing the tokens of one segment leaves every row of the other segments bit-for-bit alone."""
    before = agreement(target, case)  # (B, H, Lq, Ev)
    seg = int(case.fields["kv_segment_ids"].max())
    kv_seg = case.fields["kv_segment_ids"][:, None, :, None] == seg  # (B, 1, Lk, 1)
    q_seg = case.fields["q_segment_ids"][:, None, :, None] == seg  # (B, 1, Lq, 1)
    other = case.replace(k=np.where(kv_seg, -case.k, case.k), v=np.where(kv_seg, 1 - case.v, case.v),
                         q=np.where(q_seg, 2 * case.q, case.q))  # segment seg's tokens change
    rows = case.judged_rows() & (case.fields["q_segment_ids"][:, None, :] != seg)  # (B, H, Lq)
    unchanged("other_segment_changes_nothing", before, target.forward(target.exact(other)), rows,
              f"segment {seg}'s tokens changed; a row of another segment")


def _some_padding(case) -> bool:
    d = case.dims
    return min(case.lengths("kv")) < d["Lk"] or min(case.lengths("q")) < d["Lq"]


@prop(requires=("seq_lengths",), keep=_some_padding)
def test_nan_in_padding_changes_nothing(target: Target, case: Case, params: dict):
    """NaN in the padding (keys past kv_lengths, queries past q_lengths) changes no real row."""
    before = agreement(target, case)  # (B, H, Lq, Ev)
    pad_k = np.arange(case.dims["Lk"]) >= case.lengths("kv")[:, None, None]  # (B, 1, Lk)
    pad_q = np.arange(case.dims["Lq"]) >= case.lengths("q")[:, None, None]  # (B, 1, Lq)
    padded = case.replace(k=np.where(pad_k[..., None], np.nan, case.k), v=np.where(pad_k[..., None], np.nan, case.v),
                          q=np.where(pad_q[..., None], np.nan, case.q))  # NaN in every padded position
    unchanged("nan_in_padding_changes_nothing", before, target.forward(padded), case.judged_rows(),
              "NaN put in the padding; a real row")
