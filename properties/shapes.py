"""The problem's sizes (Shape) and how they are drawn: small ones first, kernels' block edges, and
a fixed menu for backends that compile per shape; every size moved into what the backend declares
it takes (`fitted`, `Capabilities` limits) by construction.  ``draw`` is Hypothesis' ``data.draw``.
"""
from __future__ import annotations

from typing import NamedTuple

from hypothesis import strategies as st

from attnspec.backends.declarations import Capabilities
from attnspec.properties import variants as V

SMALL_MAX_LEN, SMALL_MAX_DIM = 5, 4  # element-wise up to these (at most 40 entries an array)
# block edges +-1 (64 and 128: key blocks of flash-attention, FlexAttention, Triton kernels)
MEDIUM_LENGTHS, MEDIUM_DIMS = (7, 8, 9, 16, 17, 31, 32, 33, 64, 65, 127, 129), (7, 8, 16, 32, 64)
LARGE_LENGTHS, LARGE_DIMS = (100, 127, 128, 129, 200, 256, 257, 300), (64, 80, 128, 256)  # the seeds' d_k
# B * H * Lq * Lk * max(E, Ev) cap of a medium or large problem: 257 x 257 keys at head dim 16, 257 x 64
# at 64, 64 x 64 at 256, 12 heads of 65 x 129 at 8 - long on both sides, wide or many heads, not all: the
# reference, the error budget's (Lq, Lk, Ev) term and the backend all scale with it, and the largest
# draws were most of the suite's time (docs/measurements.md)
LARGE_WORK = 257 * 257 * 16
SHRUNK_LENGTHS = (257, 200, 129, 128, 127, 100, 65, 64, 33, 17, 16, 8)  # a length cut to fit: tile edges first
REGIMES = ("small", "small", "small", "medium", "medium", "large")  # element-wise half the time
BATCH_HEADS = ((1, 1), (1, 2), (2, 1), (2, 3))
SMALL_GQA_HEADS = ((4, 2), (2, 1), (3, 1))
SMALL_LENGTHS = (2, 3, 4, 5)  # Hypothesis favours the first: a row of two keys, not one (the edge grid's)


class Shape(NamedTuple):
    """A problem's sizes (what `Case.dims` gives as a dict): batch, query heads, KV heads, the query
    and key lengths, the query/key and value head dims."""

    B: int
    H: int
    Hkv: int
    Lq: int
    Lk: int
    E: int
    Ev: int


# Compiling backends (JAX, compiled flex) get a fixed menu so a run compiles a bounded set of
# programs; Ev == Lk so the weight probe (V = identity) reuses the same shapes, and
# E == Ev == Lk also suits backends that need Ev == E.
COMPILED_SHAPES = (Shape(1, 1, 1, 1, 1, 1, 1), Shape(2, 3, 3, 5, 3, 3, 3), Shape(1, 2, 2, 3, 6, 6, 6),
                   Shape(1, 1, 1, 17, 64, 64, 64), Shape(1, 1, 1, 129, 256, 256, 256))
COMPILED_GQA_SHAPES = (Shape(1, 4, 2, 3, 6, 6, 6), Shape(2, 2, 1, 5, 3, 3, 3))

NO_LIMITS = Capabilities()


def pick(draw, choices: tuple, label: str):
    """One of `choices` (shrinking toward the first): an index, so no strategy object per tuple."""
    return choices[draw(st.integers(0, len(choices) - 1), label=label)]


def fitted(s: Shape, caps: Capabilities, probe: bool = False, equal_dims: bool = False) -> Shape:
    """The shape moved to the nearest sizes the backend's declared limits take (Capabilities.fit_*):
    head dims, lengths; with the weight probe (V = identity: Ev = Lk) Lk is a head dim too."""
    E, Ev = caps.fit_head_dim(s.E), caps.fit_head_dim(s.Ev)
    Lq, Lk = (caps.fit_length(L) if L else L for L in (s.Lq, s.Lk))
    if probe:  # Lk is a length and a head dim: the nearest that is both
        for _ in range(8):
            Lk = caps.fit_length(caps.fit_head_dim(Lk))
            if caps.takes_head_dim(Lk):
                break
    if equal_dims:
        Ev = E = (Lk if probe else E)
    return s._replace(E=E, Ev=Ev, Lq=Lq, Lk=Lk)


def draw_shape(draw, compiled=False, regimes=REGIMES, equal_dims=False, probe=False, grouped=False,
               odd_heads=False, caps: Capabilities = NO_LIMITS, batched=False, menu_index=None) -> Shape:
    """A Shape; small ones first so shrinking goes there.

    equal_dims: the backend needs Ev == E; with probe (V = identity, so Ev becomes Lk) also E == Lk.
    grouped: fewer KV heads than query heads (Hq % Hkv == 0).  odd_heads: mostly head counts that
    are not powers of two (ALiBi's slopes interpolate there).  batched: two or more sequences, so that a field
    with a value per sequence (lengths, segment ids) differs across the batch.  caps: the backend's
    declared shape limits (head dims - a multiple, cuDNN's 8 -, lengths), honoured by construction (`fitted`).
    """
    if compiled:
        menu = compiled_menu(grouped, regimes, batched)
        s = menu[menu_index % len(menu)] if menu_index is not None else pick(draw, menu, "shape (menu)")
        return fitted(s, caps, probe=True, equal_dims=equal_dims)  # the menu's E = Ev = Lk stay equal
    if grouped:
        B = pick(draw, (2, 3) if batched else (1, 2), "batch")
        H, Hkv = pick(draw, V.ODD_GQA_HEADS if odd_heads else V.GQA_HEADS, "query heads, KV heads")
    elif odd_heads:
        B, H = (2 if batched else 1), pick(draw, V.ODD_HEADS, "heads")
        Hkv = H
    else:
        B, H = pick(draw, ((2, 1), (3, 2)) if batched else BATCH_HEADS, "batch, heads")
        Hkv = H
    regime = pick(draw, regimes, "regime")
    if regime == "small":  # at most a few dozen entries an array: element-wise draws are slow
        if grouped and not odd_heads:
            H, Hkv = pick(draw, SMALL_GQA_HEADS, "small query heads, KV heads")
            B = 2 if batched else 1
        elif odd_heads:
            B, H, Hkv = (2 if batched else 1), 3, (1 if grouped else 3)
        else:
            B = max(B, 2) if batched else B
            H = Hkv = max(1, min(H, 3 - B))
        # a field with a value per sequence needs room to differ across the batch: three or more
        Lq = draw(st.integers(3 if batched else 1, SMALL_MAX_LEN), label="Lq")
        Lk = pick(draw, SMALL_LENGTHS[1:] if batched else SMALL_LENGTHS, "Lk")
        dims = st.integers(1, SMALL_MAX_DIM)
    elif regime == "medium":
        Lq, Lk = pick(draw, MEDIUM_LENGTHS, "Lq"), pick(draw, MEDIUM_LENGTHS, "Lk")
        dims = None
    else:  # realistic: one sequence keeps it quick (two where the batch matters)
        B = 2 if batched else 1
        Lq, Lk = pick(draw, LARGE_LENGTHS, "Lq"), pick(draw, LARGE_LENGTHS, "Lk")
        H, Hkv = (H, Hkv) if grouped else (1, 1)
        dims = None

    def head_dim(label):
        return draw(dims, label=label) if dims is not None else pick(
            draw, MEDIUM_DIMS if regime == "medium" else LARGE_DIMS, label)

    if equal_dims and probe:  # E = Ev = Lk; the query side is what gives
        return fitted(Shape(B, H, Hkv, _cut(Lq, B * H * Lk * Lk), Lk, Lk, Lk), caps, probe, equal_dims)
    E = head_dim("E")
    Ev = E if equal_dims else head_dim("Ev")
    if regime != "small" and B * H * Lq * Lk * max(E, Ev) > LARGE_WORK:  # long or wide, drawn (many heads too)
        if pick(draw, ("lengths", "head dims"), "over the work cap, the problem keeps its") == "lengths":
            while B * H * Lq * Lk * max(E, Ev) > LARGE_WORK and max(E, Ev) > 8:
                E, Ev = max(8, E // 2), max(8, Ev // 2)  # 80 -> 40 -> 20 -> 10: odd widths stay odd
        Lq = _cut(Lq, B * H * Lk * max(E, Ev))  # then the query side, then the keys
        Lk = _cut(Lk, B * H * Lq * max(E, Ev))
    return fitted(Shape(B, H, Hkv, Lq, Lk, E, Ev), caps, probe, equal_dims)


def _cut(L: int, per_position: int) -> int:
    """L, or the longest of SHRUNK_LENGTHS below it that keeps L * per_position within LARGE_WORK."""
    if L * per_position <= LARGE_WORK:
        return L
    return next((n for n in SHRUNK_LENGTHS if n < L and n * per_position <= LARGE_WORK), 1)


def compiled_menu(grouped: bool, regimes, batched: bool = False) -> tuple:
    """A compiling backend's shapes: the largest only where large problems are drawn at all;
    two or more sequences where a field has a value per sequence."""
    menu = COMPILED_GQA_SHAPES if grouped else (COMPILED_SHAPES if "large" in regimes else COMPILED_SHAPES[:-1])
    return tuple(s for s in menu if s.B >= 2) if batched else menu


def _is_small(s: Shape) -> bool:
    return max(s.Lq, s.Lk) <= SMALL_MAX_LEN and max(s.E, s.Ev) <= SMALL_MAX_DIM
