"""Hypothesis strategies: attention problems as float64 NumPy arrays, exact in the dtype under test.

A `Case` (properties/case.py) carries its arrays *and* the NumPy statements that rebuild them:
small problems are spelled out element by element (``np.array([...])``, so Hypothesis shrinks
them entry by entry), large ones as a seed plus a distribution.

Every input value is exactly representable in the dtype under test (a grid of k/8 for 16-bit
formats, float32 values for float32) and a normal number of it - no scaling step may push a
value below the format's normal range - so the adapter's cast loses nothing and the reference
sees the very numbers the backend sees.

Draws that can fail: the largest score term S is *measured* on the drawn arrays and the
amplitude of q and k set so that S lands where the draw asks - deep saturation at the dtype's
cap, a moderate spread, or (rarely) near-uniform rows - instead of a worst-case bound that left
16-bit rows near-uniform.  An "aligned" distribution (q and k multiples of one direction) puts
the scores themselves at +-S, and a "needle" one (each query row equal to one key) one score per
row far above the others, so saturated rows are common in every dtype.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st

from attnspec.specs.error_budget import round_to
from attnspec.specs.problem import alibi_slopes

from attnspec.properties import variants as V
from attnspec.properties.case import Case, fields_literal, literal, run, seed_case  # noqa: F401 - re-exported
from attnspec.properties.reuse import binary, booleans, integers, reused, sampled

LOW_PRECISION = ("float16", "bfloat16")
SMALL_MAX_LEN, SMALL_MAX_DIM = 5, 4  # element-wise up to these (at most 40 entries an array)
MEDIUM_LENGTHS, MEDIUM_DIMS = (7, 8, 9, 16, 17, 31, 32, 33, 64, 65), (7, 8, 16, 32, 64)  # block edges +-1
LARGE_LENGTHS, LARGE_DIMS = (100, 127, 128, 129, 200, 256, 257, 300), (64, 80, 128, 256)  # the seeds' d_k
LARGE_WORK = 257 * 257 * 64  # Lq * Lk * max(E, Ev) cap: 257 x 257 x 64 or 257 x 64 x 256, not 300 x 300 x 256
REGIMES = ("small", "small", "small", "medium", "medium", "large")  # element-wise half the time
BATCH_HEADS = ((1, 1), (1, 2), (2, 1), (2, 3))
SMALL_GQA_HEADS = ((4, 2), (2, 1), (3, 1))


class Shape(NamedTuple):
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
# The largest score term S = max scale |q|.|k| a dtype's draws may reach.  float32/float64: deep
# saturation (gaps of hundreds; exp overflows past 88 in float32 without the max subtraction)
# yet far from overflow.  The 16-bit formats hold the scores themselves (XLA, PyTorch's math
# path), and one rounding of a score S moves its weight by u*S (specs/error_budget.py puts that
# in the floor): past u*S ~ 2^-5 the budget could no longer tell a bug from rounding.
SCORE_CAP = {"float16": 2.0**6, "bfloat16": 2.0**3, "float32": 2.0**11, "float64": 2.0**11}
# Where S lands: at the cap (saturating), a moderate spread, or near-uniform (log2 targets).
AMPLITUDES = (("saturating", None),) * 5 + (("moderate", 2.0), ("moderate", 3.0)) * 2 + (("tiny", -6.0),)
MASK_KINDS = ("none", "causal", "mask", "empty_rows", "causal_mask")
SCALES = (None, 0.5, 0.125, 1.0, 2.0, 4.0, 0.25)
_SMALLEST_NORMAL = {"float16": 2.0**-14, "bfloat16": 2.0**-126, "float32": 2.0**-126, "float64": 2.0**-1022}


@reused
@st.composite
def shapes(draw, compiled: bool = False, regimes=REGIMES, equal_dims: bool = False, probe: bool = False,
           grouped: bool = False, odd_heads: bool = False, head_multiple: int = 1):
    """A Shape; small ones first so shrinking goes there.

    equal_dims: the backend needs Ev == E; with probe (V = identity, so Ev becomes Lk) also E == Lk.
    grouped: fewer KV heads than query heads (Hq % Hkv == 0).  odd_heads: mostly head counts that
    are not powers of two (ALiBi's slopes interpolate there).  head_multiple: the backend takes head
    dims that are multiples of it only (cuDNN: 8): E and Ev are rounded up to one.
    """
    def up(n: int) -> int:
        return -(-n // head_multiple) * head_multiple

    if compiled:
        return _in_head_multiple(draw(sampled(_compiled_menu(grouped, regimes)), label="shape"), head_multiple)
    if grouped:
        B = draw(sampled((1, 2)), label="batch")
        H, Hkv = draw(sampled(V.ODD_GQA_HEADS if odd_heads else V.GQA_HEADS), label="query heads, KV heads")
    elif odd_heads:
        B, H = 1, draw(sampled(V.ODD_HEADS), label="heads")
        Hkv = H
    else:
        B, H = draw(sampled(BATCH_HEADS), label="batch, heads")
        Hkv = H
    regime = draw(sampled(regimes), label="regime")
    if regime == "small":  # at most a few dozen entries an array: element-wise draws are slow
        if grouped and not odd_heads:
            B, (H, Hkv) = 1, draw(sampled(SMALL_GQA_HEADS), label="small query heads, KV heads")
        elif odd_heads:
            B, H, Hkv = 1, 3, (1 if grouped else 3)
        else:
            H = Hkv = min(H, 3 - B)
        L, D = integers(1, SMALL_MAX_LEN), integers(1, SMALL_MAX_DIM)
        # Hypothesis favours the simplest value (the first one here): a row of two keys, not one
        L = Lk_small = sampled((2, 3, 4, 5))  # one key (weight exactly 1): the edge grid's
    elif regime == "medium":
        L, D = sampled(MEDIUM_LENGTHS), sampled(MEDIUM_DIMS)
    else:  # realistic: one batch element keeps it quick
        B, L, D = 1, sampled(LARGE_LENGTHS), sampled(LARGE_DIMS)
        H, Hkv = (H, Hkv) if grouped else (1, 1)
    Lq, Lk = draw(L, label="Lq"), draw(Lk_small if regime == "small" else L, label="Lk")
    if probe:  # V = identity makes Ev = Lk: a head dim too
        Lk = up(Lk)
    if equal_dims and probe:  # E = Ev = Lk; a long query side is what stays cheap
        return Shape(B, H, Hkv, Lq if Lq * Lk * Lk <= LARGE_WORK else 16, Lk, Lk, Lk)
    E = up(draw(D, label="E"))
    Ev = E if equal_dims else up(draw(D, label="Ev"))
    if regime == "large" and Lq * Lk * max(E, Ev) * H > LARGE_WORK:  # keep a realistic size quick
        E, Ev = min(E, 64), min(Ev, 64)
        Lk = Lk if Lq * Lk * max(E, Ev) * H <= LARGE_WORK else 64
    return Shape(B, H, Hkv, Lq, Lk, E, Ev)


def _compiled_menu(grouped: bool, regimes) -> tuple:
    """A compiling backend's shapes: the largest only where large problems are drawn at all."""
    return COMPILED_GQA_SHAPES if grouped else (COMPILED_SHAPES if "large" in regimes else COMPILED_SHAPES[:-1])


def _in_head_multiple(s: Shape, head_multiple: int) -> Shape:
    """A menu shape with Lk, E and Ev rounded up to the backend's head-dim multiple (still E = Ev = Lk)."""
    up = lambda n: -(-n // head_multiple) * head_multiple  # noqa: E731
    return s if head_multiple == 1 else s._replace(Lk=up(s.Lk), E=up(s.E), Ev=up(s.Ev))


def _is_small(s: Shape) -> bool:
    return max(s.Lq, s.Lk) <= SMALL_MAX_LEN and max(s.E, s.Ev) <= SMALL_MAX_DIM


def _zigzag(b: np.ndarray, n: int) -> np.ndarray:
    """b mod (2n + 1) as 0, 1, -1, 2, -2, ..., n, -n: the zero byte is the value 0, so a shrunk draw
    reads as zeros."""
    z = (b % (2 * n + 1)).astype(np.int64)
    return np.where(z % 2 == 1, (z + 1) // 2, -(z // 2))


def _element_values(raw: bytes, n: int, dtype: str) -> np.ndarray:
    """n entries from n (16-bit) or 4n bytes, exact in dtype, in [-4, 4].

    16-bit: k/8 with |k| <= 32 (exact in bfloat16's 8 bits and float16).  float32/float64, per
    entry (byte 0 chooses): an integer in [-4, 4] (ties) 3/8 of the time, a uniform value on the
    2^-21 grid of [-4, 4) (exact in float32) 1/2, a signed power of two from 2^-23 to 2 (magnitudes
    far apart in one row) 1/8.
    """
    b = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
    if dtype in LOW_PRECISION:
        return _zigzag(b, 32) / 8.0
    b = b.reshape(n, 4)
    tie = _zigzag(b[:, 1], 4).astype(np.float64)
    uniform = (b[:, 1] * 65536 + b[:, 2] * 256 + b[:, 3]) * 2.0**-21 - 4.0
    power = np.where(b[:, 2] % 2 == 1, -1.0, 1.0) * 2.0 ** (1 - (b[:, 1] % 25))
    return np.where(b[:, 0] < 96, tie, np.where(b[:, 0] < 224, uniform, power))


def _dims(s: Shape) -> dict:
    return {"q": (s.B, s.H, s.Lq, s.E), "k": (s.B, s.Hkv, s.Lk, s.E), "v": (s.B, s.Hkv, s.Lk, s.Ev)}


@reused
@st.composite
def _values_small(draw, s: Shape, dtype):
    """Each array from one draw of bytes (an entry's value from its own bytes, so Hypothesis still
    shrinks entry by entry): a draw per element cost ~half of a cheap backend's run."""
    lines = []
    for name, dims in _dims(s).items():
        n = int(np.prod(dims))
        width = n if dtype in LOW_PRECISION else 4 * n
        raw = draw(binary(width), label=name)
        lines.append(literal(name, _element_values(raw, n, dtype).reshape(dims)))
    return lines


def _recipe(dtype: str, dist: str, dims: tuple) -> str:
    base = {"normal": f"rng.standard_normal({dims})", "ties": f"rng.integers(-2, 3, {dims}) / 1.0",
            # multiples of one +-1 direction: scores q.k reach +-S itself, rows saturate
            "aligned": f"rng.integers(-4, 5, {dims[:-1]} + (1,)) * direction / 4"}[dist]
    if dtype in LOW_PRECISION and dist == "normal":  # a k/8 grid, exact in every format
        return f"np.clip(np.round({base} * 8), -32, 32) / 8"
    return f"({base}).astype(np.float32).astype(np.float64)" if dtype == "float32" else base


@reused
@st.composite
def _values_large(draw, s: Shape, dtype):
    seed = draw(integers(0, 2**31 - 1), label="seed")
    lines = [f"rng = np.random.default_rng({seed})"]
    dists = {name: draw(sampled(("needle", "normal", "aligned", "needle", "ties")) if name != "v"
                        else sampled(("normal", "ties")), label=f"{name} distribution")
             for name in ("q", "k", "v")}
    if "needle" in (dists["q"], dists["k"]):  # each query row has one key equal to it: one score
        n, g = min(s.Lq, s.Lk), s.H // s.Hkv  # stands out by ~sqrt(E) spreads, the row saturates
        return lines + [f"q = rng.choice([-1.0, 1.0], {_dims(s)['q']})",
                        f"k = rng.choice([-0.25, 0.25], {_dims(s)['k']})",
                        f"k[..., rng.permutation({s.Lk})[:{n}], :] = q[:, ::{g}, :{n}, :]  # the needles",
                        f"v = {_recipe(dtype, dists['v'], _dims(s)['v'])}"]
    if "aligned" in (dists["q"], dists["k"]):
        dists["q"] = dists["k"] = "aligned"
        lines.append(f"direction = rng.choice([-1.0, 1.0], {s.E})  # q and k share it")
    lines += [f"{name} = {_recipe(dtype, dists[name], dims)}" for name, dims in _dims(s).items()]
    return lines


@reused
@st.composite
def _mask_lines(draw, kind, s: Shape, compiled, allow_empty_rows, small):
    if kind in ("none", "causal"):
        return ["mask = None"]
    full = compiled or draw(booleans, label="mask per batch and head")
    dims = (s.B, s.H, s.Lq, s.Lk) if full else (s.Lq, s.Lk)
    if small:  # draw the *hidden* pairs, so shrinking heads for "everything visible"
        n = int(np.prod(dims))
        # about a quarter hidden (a byte a pair, one draw: see _values_small); the zero byte, where
        # shrinking goes, is a visible pair
        raw = np.frombuffer(draw(binary(n), label="hidden pairs"), dtype=np.uint8)
        hidden = np.isin(raw % 8, (3, 4)).reshape(dims)
        lines = [literal("mask", ~hidden)]
    else:
        p = draw(sampled((0.9, 0.5)), label="visible fraction")
        lines = ["rng_mask = np.random.default_rng(%d)" % draw(integers(0, 2**31 - 1), label="mask seed"),
                 f"mask = rng_mask.random({dims}) < {p}"]
    if kind == "empty_rows" and s.Lq:
        rows = draw(_some_rows(s.Lq), label="fully masked rows")
        lines.append(f"mask[..., {sorted(rows)}, :] = False")
    if not allow_empty_rows and s.Lk:
        lines.append("mask[..., :, 0] = True  # every row sees key 0")
    return lines


@reused
def _some_rows(Lq: int):
    """Distinct row indices, at least one and at most half of them."""
    return st.lists(integers(0, Lq - 1), min_size=1, max_size=max(1, Lq // 2), unique=True)


def score_terms(q, k, scale, group: int = 1) -> float:
    """The largest scale * |q|.|k| over every (query, key) pair (the budget's S, unmasked)."""
    kk = np.repeat(np.abs(k), group, axis=-3) if group > 1 else np.abs(k)
    return float(np.max(np.abs(q) @ np.swapaxes(kk, -1, -2), initial=0.0)) * scale


def _exact_after(x: np.ndarray, j: int, dtype: str) -> bool:
    """Whether every x * 2^j is a normal number of dtype (or zero)."""
    y = x * 2.0**j
    nz = np.abs(y[y != 0])
    return (nz.size == 0 or nz.min() >= _SMALLEST_NORMAL[dtype]) and np.array_equal(
        np.asarray(round_to(y, dtype), dtype=np.float64), y)


def _amplitude(draw, dtype, q, k, scale, group) -> int:
    """log2 of the factor on q and k (each) that puts the largest score term where the draw asks."""
    S = score_terms(q, k, scale, group)
    if S == 0:
        return 0
    kind, target = draw(sampled(AMPLITUDES), label="score size")
    goal = SCORE_CAP[dtype] if target is None else min(2.0**target, SCORE_CAP[dtype])
    j = int(np.floor((np.log2(goal) - np.log2(S)) / 2))  # q and k each scaled by 2^j: S by 4^j (goal / S may overflow)
    while np.ldexp(S, 2 * j) > SCORE_CAP[dtype]:  # S * 4^j, inf rather than OverflowError
        j -= 1
    while j and not (_exact_after(q, j, dtype) and _exact_after(k, j, dtype)):
        j += 1 if j < 0 else -1  # toward 1: never leave the format's exact normal numbers
    return j


@reused
@st.composite
def cases(draw, dtype: str, caps, compiled: bool = False, kinds=MASK_KINDS, allow_empty_rows: bool = True,
          scales=SCALES, shape=None, regimes=REGIMES, equal_dims: bool = False, probe: bool = False,
          alignments=("top_left",), need=frozenset(), avoid=frozenset(), within: str | None = None):
    """A Case for `dtype` within the backend's capabilities (masks, causal, optional features).

    ``alignments``: the causal alignments the backend takes; ``need``/``avoid``: optional fields
    (names of specs.problem.FEATURES) every draw must / must not use.  ``within``: a narrower
    format whose budget judges the results (a float64 call computed in float32): values, score
    sizes and bias stay in its range and are exact in it, so its plain computation cannot overflow.
    """
    fmt = within or dtype
    supported = getattr(caps, "features", frozenset())
    # compiling backends: the static part from a fixed table (variants.compiled_configs)
    config = V.compiled_config(draw, frozenset(need), frozenset(avoid)) if compiled else None
    if config is not None:
        use = (config.features & supported) | frozenset(need)
    else:
        use = draw(V.chosen_features(supported, need, avoid), label="optional fields")
    grouped = ("gqa" in need) or ("gqa" in supported and "gqa" not in avoid
                                  and (config.grouped if config is not None
                                       else draw(integers(0, 3), label="grouped heads") == 0))
    multiple = getattr(caps, "head_dim_multiple", 1)
    if shape is None and config is not None:  # the menu shape the configuration names
        menu = _compiled_menu(grouped, regimes)
        shape = _in_head_multiple(menu[config.shape % len(menu)], multiple)
    s = shape or draw(shapes(compiled, regimes, equal_dims, probe, grouped, "alibi" in use, multiple), label="shape")
    if not isinstance(s, Shape):
        s = Shape(s[0], s[1], s[1], *s[2:]) if len(s) == 6 else Shape(*s)
    kinds = tuple(k for k in kinds if (caps.masks or "mask" not in k) and (caps.causal or "causal" not in k)
                  and (allow_empty_rows or k != "empty_rows"))
    menu = (tuple(x for x in scales if x in (None, 0.5)) or (0.5,)) if compiled else tuple(scales)  # a compile per scale
    if config is not None:
        kind, scale = kinds[config.kind % len(kinds)], menu[config.scale % len(menu)]
    else:
        kind = draw(sampled(kinds), label="mask kind")
        scale = draw(sampled(menu), label="scale")
    small = _is_small(s)
    lines = draw(_values_small(s, fmt) if small else _values_large(s, fmt))
    lines += draw(_mask_lines(kind, s, compiled, allow_empty_rows, small))
    env = run(lines, {"np": np})  # q, k, v, mask
    group = s.H // s.Hkv
    used_scale = scale if scale is not None else 1.0 / np.sqrt(s.E)
    amp = _amplitude(draw, fmt, env["q"], env["k"], used_scale, group)
    done = len(lines)  # the statements env has run
    if amp:
        lines.append(f"q, k = q * 2.0**{amp}, k * 2.0**{amp}")
    fields, field_lines = {}, []
    if group > 1:
        fields["enable_gqa"] = True
    positional = kind in ("causal", "causal_mask") or {"window", "alibi"} & use
    if positional and len(alignments) > 1:  # bottom-right first: the classic draws are top-left already
        fields["causal_alignment"] = draw(sampled(("bottom_right", "top_left")), label="causal alignment")
    elif positional and alignments[0] != "top_left":
        fields["causal_alignment"] = alignments[0]
    S = score_terms(env["q"] * 2.0**amp, env["k"] * 2.0**amp, used_scale, group)
    cap = SCORE_CAP[fmt]
    if "alibi" in use and fmt in LOW_PRECISION and "alibi" not in need:
        if float(np.max(alibi_slopes(s.H))) * max(s.Lq, s.Lk) > cap / 2:  # distances x slopes past the cap
            use = use - {"alibi"}
    if "bias" in use:  # the bias takes what the scores leave of the cap (a quarter of it at most)
        room = min(cap / 4, cap - S)
        field_lines += draw(V.bias_lines(s, fmt, room, allow_empty_rows or kind != "none"))
        fields["bias"] = None
    if "window" in use:
        fields["window"] = (V.COMPILED_WINDOWS[config.window % len(V.COMPILED_WINDOWS)] if config is not None
                            else draw(V.window_value(compiled)))
    if "seq_lengths" in use:
        field_lines += draw(V.lengths_lines(s, allow_empty_rows))
        fields["q_lengths"] = fields["kv_lengths"] = None
    if "segment_ids" in use:
        field_lines += draw(V.segment_lines(s))
        fields["q_segment_ids"] = fields["kv_segment_ids"] = None
    if "softcap" in use:
        fields["softcap"] = V.softcap_value(draw, S, compiled)
    if "alibi" in use:
        field_lines.append(V.slopes_literal(s.H))
        fields["alibi_slopes"] = None
    lines += field_lines
    run(lines[done:], env)  # the scaling and the fields' statements
    values = {k: (env[k] if v is None else v) for k, v in fields.items()}
    if values:
        lines.append("fields = " + fields_literal(values))
    else:
        lines.append("fields = {}")
    return Case(env["q"], env["k"], env["v"], env["mask"], kind in ("causal", "causal_mask"), scale,
                tuple(lines), fields=values)
