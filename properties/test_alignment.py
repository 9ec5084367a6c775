"""Family: causal alignment when Lq != Lk, tested on what the backend says it does.

top_left (PyTorch's ``is_causal``, JAX): query i sees keys j <= i.  bottom_right
(flash-attention >= 2.1, ``causal_lower_right``, KV caches): j <= i + Lk - Lq.  Every alignment
the backend takes is asked for by name (`specs.problem` ``causal_alignment``); a backend that
takes only one is asked for that one.  Bugs this catches: one alignment computed as the other
(pytorch/pytorch#108108, Dao-AILab/flash-attention#282, onnx/onnx#8068).
"""
from __future__ import annotations

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

from attnspec.specs.invariants import Verdict

from attnspec.properties.judge import agreement, draw_case, fail_unless, judged_rows, worst


@given(data=st.data())
def test_causal_alignment_as_asked(target, data):
    """V = identity, Lq != Lk: the weights are zero exactly where the asked alignment hides keys.
    Every alignment the backend takes, on every example (not one drawn per example: a bug in
    one alignment would pass a run whose draws never asked for it)."""
    if not target.caps.causal:
        import pytest
        pytest.skip(f"{target.name} has no causal mode")
    drawn = draw_case(data, target, kinds=("causal",), probe=True, avoid=frozenset({"window", "alibi"}))
    assume(drawn.dims["Lq"] != drawn.dims["Lk"])
    for alignment in target.alignments:
        case = drawn.with_fields(f"causal, aligned {alignment}", causal_alignment=alignment).with_identity_values()
        weights = target.forward(case)  # (B, H, Lq, Lk): V = identity
        rows = judged_rows(case)  # (B, H, Lq)
        hidden = ~case.visible() & rows[..., None]  # (B, H, Lq, Lk)
        where, amount = worst(np.abs(weights), hidden)
        verdict = Verdict("causal_alignment_as_asked", amount == 0.0, where if amount else None, amount,
                          f"{alignment} causal, Lq={case.dims['Lq']} Lk={case.dims['Lk']}: weight {amount:.6g} on the "
                          f"hidden pair {where} (batch, head, query, key)")
        fail_unless(verdict, "causal_alignment_as_asked", target, case,
                    checks=("print((out != 0).astype(int))  # the visible pairs: compare with visible.astype(int)",))
        agreement(target, case, "causal_alignment_as_asked")
