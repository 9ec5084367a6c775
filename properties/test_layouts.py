"""Family: memory layouts — the result does not depend on strides.

A transposed (non-contiguous innermost axis), offset, permuted ((B, L, H, E) storage) or
expanded (stride-0 batch) view of the same values must give the contiguous result.  Adapters
declare the layouts they can hand their kernel (`Capabilities.layouts`).  Bugs this catches:
pytorch/pytorch#187506 (CPU flash kernel, non-contiguous innermost dim), #191937 (stride-0
K/V), Dao-AILab/flash-attention#2666.
"""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnspec.properties.judge import close_outputs, draw_case

_OTHER_LAYOUTS = ("transposed", "offset", "permuted", "expanded")  # expanded last: it changes the values


@given(data=st.data())
def test_layout_independence(target, data):
    """Every declared layout on every example: one drawn layout an example missed a strides bug
    in a CI run (a transposed view of E = 1, or a permuted one of H = 1, reads the same bytes)."""
    layouts = [x for x in _OTHER_LAYOUTS if x in target.caps.layouts]
    if not layouts:
        pytest.skip(f"{target.name} declares no layout but contiguous (Capabilities.layouts)")
    case = draw_case(data, target)
    contiguous = target.forward(case)  # (B, H, Lq, Ev)
    for layout in layouts:
        if layout == "expanded":  # stride-0 batch: every batch element the same values
            case = case.then("q, k, v = (np.broadcast_to(x[:1], x.shape).copy() for x in (q, k, v))  # equal batches")
            contiguous = target.forward(case)  # (B, H, Lq, Ev)
        strided = target.forward(case, layout=layout)  # (B, H, Lq, Ev)
        close_outputs("layout_independence", target, case, contiguous, strided, case,
                      f"contiguous inputs vs the same values in the {layout} layout", checks=(
                          f"out2 = backend.forward(q, k, v, dtype={target.dtype!r}, layout={layout!r}, **call_kwargs)",
                          "print(np.abs(out2 - out).max())  # must be ~0"))
