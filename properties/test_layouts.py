"""Family: memory layouts — the result does not depend on strides.

A transposed (non-contiguous innermost axis), offset, permuted ((B, L, H, E) storage), head-slice
(heads 1..H of a wider heads axis: a fused QKV projection's q, k or v) or expanded (stride-0 batch)
view of the same values must give the contiguous result, and the contiguous LSE where the backend
returns one (a kernel may write it in q's own order).  Adapters
declare the layouts they can hand their kernel (`Capabilities.layouts`).  Bugs this catches:
pytorch/pytorch#187506 (CPU flash kernel, non-contiguous innermost dim), #191937 (stride-0
K/V), Dao-AILab/flash-attention#2666.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnspec.properties.explore import prop
from attnspec.properties.judge import close_lses, close_outputs

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target

_OTHER_LAYOUTS = ("transposed", "offset", "permuted", "head_slice", "expanded")  # expanded last: it changes the values


@prop(needs=("layouts",))
def test_layout_independence(target: Target, case: Case, params: dict):
    """Every declared layout on every example: one drawn layout an example missed a strides bug
    in a CI run (a transposed view of E = 1, or a permuted one of H = 1, reads the same bytes).  Where the
    backend returns the LSE, its LSE too: a kernel may write it in q's own (L, H) order and read it back
    as (H, L), its output right."""
    with_lse = target.supports("lse")
    contiguous = target.forward(case)  # (B, H, Lq, Ev)
    lse = target.forward(case, return_lse=True)[1] if with_lse else None  # (B, H, Lq)
    for layout in (x for x in _OTHER_LAYOUTS if x in target.caps.layouts):
        if layout == "expanded":  # stride-0 batch: every batch element the same values
            case = case.replace(**{n: np.broadcast_to(x[:1], x.shape).copy() for n, x in
                                   (("q", case.q), ("k", case.k), ("v", case.v))})
            contiguous = target.forward(case)  # (B, H, Lq, Ev)
            lse = target.forward(case, return_lse=True)[1] if with_lse else None  # (B, H, Lq)
        what = f"contiguous inputs vs the same values in the {layout} layout"
        strided = target.forward(case, layout=layout)  # (B, H, Lq, Ev)
        close_outputs("layout_independence", target, case, contiguous, strided, case, what)
        if with_lse:
            close_lses("layout_independence", target, case, lse, target.forward(case, layout=layout,
                                                                                return_lse=True)[1], what)
