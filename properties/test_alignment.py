"""Family: causal alignment when Lq != Lk, tested on what the backend says it does.

top_left (PyTorch's ``is_causal``, JAX): query i sees keys j <= i.  bottom_right
(flash-attention >= 2.1, ``causal_lower_right``, KV caches): j <= i + Lk - Lq.  Every alignment
the backend takes is asked for by name (`specs.problem` ``causal_alignment``); a backend that
takes only one is asked for that one.  Bugs this catches: one alignment computed as the other
(pytorch/pytorch#108108, Dao-AILab/flash-attention#282, onnx/onnx#8068).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from attnspec.properties.distribution import cases
from attnspec.properties.explore import prop
from attnspec.properties.judge import agreement, zero_weights
from attnspec.specs import fields as F

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target


@prop(needs=("causal",), draw=cases(kinds=("causal",), probe=True, avoid=F.DIAGONAL),
      keep=lambda c: c.dims["Lq"] != c.dims["Lk"])
def test_causal_alignment_as_asked(target: Target, case: Case, params: dict):
    """V = identity, Lq != Lk: the weights are zero exactly where the asked alignment hides keys.
    Every alignment the backend takes, on every example (not one drawn per example: a bug in
    one alignment would pass a run whose draws never asked for it)."""
    for alignment in target.alignments:
        asked = case.replace(causal_alignment=alignment).with_identity_values()
        weights = target.forward(asked)  # (B, H, Lq, Lk): V = identity
        hidden = ~asked.visible() & asked.judged_rows()[..., None]  # (B, H, Lq, Lk)
        d = asked.dims
        zero_weights("causal_alignment_as_asked", weights, hidden, f"{alignment} causal, Lq={d['Lq']} Lk={d['Lk']}")
        agreement(target, asked, weights)
