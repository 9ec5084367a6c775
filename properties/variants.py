"""Drawing the optional problem fields: bias, window, lengths, segment ids, softcap, ALiBi.

Each draw returns NumPy statements (recorded in the Case, so the reproducer rebuilds them)
and the field values.  Only fields the backend declares are drawn (`Capabilities.features`);
a test may require some (``need``) or rule some out (``avoid``).  Values are exact in the
dtype under test, like the inputs.  Backends that compile per shape and per static argument
(JAX, compiled flex) get small menus for the static fields (window, softcap).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st

from attnspec.specs.problem import alibi_slopes

from attnspec.properties.case import literal
from attnspec.properties.reuse import binary, booleans, integers, reused, sampled

# fields a drawn problem may carry, with how often each is drawn when the backend supports it
OPTIONAL = ("bias", "window", "seq_lengths", "segment_ids", "softcap", "alibi")
DRAW_RATE = 0.25  # each supported optional field independently; tests needing one force it
WINDOW_LEFT, WINDOW_RIGHT = (None, 1, 2, 3, 8), (None, 0, 1, 2)  # (0, 0) would leave one key a row
COMPILED_WINDOWS = ((2, 1), (None, 0), (3, None))
# (Hq, Hkv); Hypothesis favours the first: a group of 2 with 2 KV heads (MQA, Hkv = 1, hides a
# head index taken modulo Hkv or always 0)
GQA_HEADS = ((4, 2), (6, 3), (2, 1), (4, 1), (6, 2))
# head counts that are not powers of two, where ALiBi's standard slopes interpolate
ODD_HEADS, ODD_GQA_HEADS = (3, 6, 5, 12), ((6, 3), (6, 2), (12, 4), (3, 1))


@reused
@st.composite
def chosen_features(draw, supported, need=frozenset(), avoid=frozenset()) -> frozenset:
    """Which optional fields this problem uses: those needed, plus each supported one at DRAW_RATE.

    One byte a field, one draw for all (a draw each cost ~0.1 ms, a drawn problem's sixth); the
    zero byte, where shrinking goes, keeps the field."""
    raw = draw(binary(len(OPTIONAL)), label="optional fields (a byte each: below 64 = used)")
    return frozenset(need) | {name for name, byte in zip(OPTIONAL, raw)
                              if name in supported and name not in avoid and byte < DRAW_RATE * 256}


def _grid_values(draw, dims, dtype, amplitude: float, label: str):
    """Exact values: k/8 steps for 16-bit formats, float32 values for float32; |x| <= amplitude."""
    seed = draw(integers(0, 2**31 - 1), label=f"{label} seed")
    rng = np.random.default_rng(seed)
    raw = rng.uniform(-amplitude, amplitude, dims)
    if dtype in ("float16", "bfloat16"):
        return f"np.round(np.random.default_rng({seed}).uniform(-{amplitude!r}, {amplitude!r}, {dims}) * 8) / 8", \
            np.round(raw * 8) / 8
    if dtype == "float32":
        return (f"np.random.default_rng({seed}).uniform(-{amplitude!r}, {amplitude!r}, {dims})"
                ".astype(np.float32).astype(np.float64)"), raw.astype(np.float32).astype(np.float64)
    return f"np.random.default_rng({seed}).uniform(-{amplitude!r}, {amplitude!r}, {dims})", raw


@reused
@st.composite
def bias_lines(draw, shape, dtype, room: float, allow_hidden: bool) -> list:
    """``bias = ...``: a broadcastable float array, |bias| <= room (a power of two, at least 1/4),
    sometimes with -inf entries."""
    B, H, Lq, Lk = shape.B, shape.H, shape.Lq, shape.Lk
    dims = draw(sampled(((Lq, Lk), (B, H, Lq, Lk), (1, H, 1, Lk), (B, 1, Lq, Lk))), label="bias shape")
    amplitude = float(2.0 ** np.floor(np.log2(max(room, 0.25))))
    expr, _ = _grid_values(draw, dims, dtype, amplitude, "bias")
    lines = [f"bias = {expr}  # {dims}, added to the scaled scores"]
    if allow_hidden and draw(booleans, label="bias hides keys (-inf)"):
        lines.append(f"bias[np.random.default_rng({draw(integers(0, 2**31 - 1), label='hidden seed')})"
                     f".random({dims}) < 0.15] = -np.inf  # -inf: hidden")
        lines.append("bias[..., 0] = np.where(np.isneginf(bias[..., 0]), 0.0, bias[..., 0])  # key 0 stays")
    return lines


class Config(NamedTuple):
    """A compiling backend's static choices for one problem (see `compiled_configs`)."""

    kind: int        # index into the mask kinds the test allows (modulo their number)
    scale: int       # index into the scales it allows
    window: int      # index into COMPILED_WINDOWS
    features: frozenset  # the optional fields used
    shape: int       # index into the shape menu (strategies.COMPILED_SHAPES or _GQA_SHAPES)
    grouped: bool    # fewer KV heads than query heads, where the backend takes them


def compiled_configs(rows: int = 24, seed: int = 779) -> tuple:
    """A fixed table of static configurations for backends that compile per static argument.

    Drawn field by field, jax-dpa's static combinations (mask kind x scale x window x which of
    bias and lengths are given, per shape, dtype and call) made ~240 new programs in each dev run
    even after five runs had filled the program cache, ~0.35 s of compile each.  From a table -
    the shape from the menu included, else a row's 7 shapes left 80 new programs a run after
    eight - the programs a run builds repeat from run to run; every array's values stay drawn.  Each
    field is in about half the rows and every pair of fields shares some, so a test that needs
    (or avoids) fields draws among the rows that have (or lack) them.  Seed 779: the first whose
    table has each field in 9-15 of the 24 rows, every pair of fields together in 3 or more,
    rows with none of jax-dpa's fields and rows with none at all, and every mask kind, window
    and scale in several rows (tests/test_suite_strategies.py checks it).
    """
    rng = np.random.default_rng(seed)
    table = []
    for _ in range(rows):
        kind, scale, window = (int(x) for x in rng.integers(0, 60, 3))
        table.append(Config(kind, scale, window, frozenset(f for f in OPTIONAL if rng.random() < 0.5), 0, False))
    # the shape and grouping from a generator of their own: the table above is the one checked
    shapes = np.random.default_rng(seed + 1)
    return tuple(c._replace(shape=int(shapes.integers(0, 60)), grouped=bool(shapes.random() < 0.25)) for c in table)


COMPILED_CONFIGS = compiled_configs()


def compiled_config(draw, need, avoid):
    """A row of COMPILED_CONFIGS with every needed field and no avoided one (None: no such row)."""
    rows = tuple(c for c in COMPILED_CONFIGS if need <= c.features and not avoid & c.features)
    return draw(sampled(rows), label="static configuration (compiling backend)") if rows else None


@reused
@st.composite
def window_value(draw, compiled: bool):
    if compiled:
        return draw(sampled(COMPILED_WINDOWS), label="window")
    left = draw(sampled(WINDOW_LEFT), label="window left")
    right = draw(sampled(WINDOW_RIGHT), label="window right")
    return (left, right) if (left, right) != (None, None) else (2, 2)


@reused
def _length(draw, L: int, lo: int, allow_empty: bool, label: str) -> int:
    """A length of L positions: mostly the upper half (padding, not one key); 0 or 1 sometimes."""
    keep = min(L, max(lo, (L + 1) // 2, 2))  # at least two rows or keys stay: one would judge nothing
    # a middle value of 0..19 picks 0 or 1: Hypothesis favours the ends, and shrinks to no padding
    if allow_empty and L >= 2 and draw(integers(0, 19), label=f"{label}: 0 or 1 (at 9)") == 9:
        return draw(integers(0, 1), label=label)
    return L - draw(integers(0, L - keep), label=f"{label}: positions cut")


@reused
@st.composite
def lengths_lines(draw, shape, allow_empty: bool) -> list:
    q_len = [_length(draw, shape.Lq, shape.Lq if not allow_empty else 0, allow_empty, "q_length")
             for _ in range(shape.B)]
    kv_len = [_length(draw, shape.Lk, 1, allow_empty, "kv_length") for _ in range(shape.B)]
    return [f"q_lengths = np.array({q_len})  # query rows at or past it are padding",
            f"kv_lengths = np.array({kv_len})  # keys at or past it are hidden"]


@reused
@st.composite
def segment_lines(draw, shape) -> list:
    """Packed sequences: sorted segment ids per batch element, the same segments on both sides."""
    most = max(1, min(3, min(shape.Lq, shape.Lk) // 2))  # simplest: two segments (one shows no boundary)
    n = draw(sampled(tuple(dict.fromkeys((min(2, most), most, 1)))), label="segments")
    rows = []
    for side, L in (("q", shape.Lq), ("kv", shape.Lk)):
        # a byte a position, one draw a side (a draw per id cost more than the backend's call); the zero
        # byte is segment 0, so a shrunk draw is one segment
        raw = draw(binary(shape.B * L), label=f"{side} ids")
        ids = np.sort((np.frombuffer(raw, dtype=np.uint8) % n).reshape(shape.B, L), axis=-1)  # (B, L)
        rows.append(literal(f"{side}_segment_ids", ids.astype(np.int64)))
    return rows


def softcap_value(draw, score_size: float, compiled: bool) -> float:
    """A cap below, near or above the largest score (a power of two: exact in every format)."""
    if compiled:
        return 4.0
    j = draw(sampled((-2, -1, 0, 1)), label="softcap vs largest score (log2)")
    return float(2.0 ** (np.floor(np.log2(max(score_size, 2.0**-4))) + j))


def slopes_literal(H: int) -> str:
    return f"alibi_slopes = np.array({alibi_slopes(H).tolist()!r})  # the standard slopes for {H} heads"
