"""Drawing attention problems: Cases of float64 NumPy arrays, exact in the dtype under test.

Every input value is exactly representable in the dtype under test (a grid of k/8 for 16-bit
formats, float32 values for float32) and a normal number of it - no scaling step may push a
value below the format's normal range - so the adapter's cast loses nothing and the reference
sees the very numbers the backend sees.  Small problems are drawn entry by entry (Hypothesis
shrinks them entry by entry); large ones as a seed and a distribution.

Draws that can fail: the largest score term S is *measured* on the drawn arrays and the
amplitude of q and k set so that S lands where the draw asks - deep saturation at the dtype's
cap, a moderate spread, or (rarely) near-uniform rows.  An "aligned" distribution (q and k
multiples of one direction) puts the scores themselves at +-S, and a "needle" one (each query
row equal to one key) one score per row far above the others, so saturated rows are common in
every dtype.  Each optional field is drawn at `variants.DRAW_RATE` when the backend takes it
(`properties/variants.py`).  ``draw`` is Hypothesis' ``data.draw`` (labelled draws).
"""
from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from attnspec.properties import fp8_draws
from attnspec.properties import variants as V
from attnspec.properties.case import Case
from attnspec.properties.shapes import (  # noqa: F401 - the sizes' names, public here too
    COMPILED_GQA_SHAPES,
    COMPILED_SHAPES,
    LARGE_DIMS,
    LARGE_LENGTHS,
    MEDIUM_DIMS,
    MEDIUM_LENGTHS,
    NO_LIMITS,
    REGIMES,
    SMALL_MAX_DIM,
    SMALL_MAX_LEN,
    Shape,
    _is_small,
    compiled_menu,
    draw_shape,
    fitted,
    pick,
)
from attnspec.specs import fields as F
from attnspec.specs.fp8 import is_fp8
from attnspec.specs.plain import round_to

if TYPE_CHECKING:
    from attnspec.properties.target import Target

LOW_PRECISION = ("float16", "bfloat16")
# The largest score term S = max scale |q|.|k| a dtype's draws may reach.  float32/float64: deep
# saturation (gaps of hundreds; exp overflows past 88 in float32 without the max subtraction)
# yet far from overflow.  The 16-bit formats hold the scores themselves (XLA, PyTorch's math
# path), and one rounding of a score S moves its weight by u*S (specs/error_budget.py puts that
# in the floor): past u*S ~ 2^-5 the budget could no longer tell a bug from rounding.
SCORE_CAP = {"float16": 2.0**6, "bfloat16": 2.0**3, "float32": 2.0**11, "float64": 2.0**11}
# Where S lands: at the cap (saturating), a moderate spread, or near-uniform (log2 targets).
AMPLITUDES = (("saturating", None),) * 5 + (("moderate", 2.0), ("moderate", 3.0)) * 2 + (("tiny", -6.0),)
MASK_KINDS = ("none", "causal", "mask", "empty_rows", "causal_mask")
# 0.3 is no power of two: the others are exact in every format, so a kernel that rounds the scale it
# is given (an explicit scale kept in a 16-bit parameter) passed them all
SCALES = (None, 0.5, 0.125, 1.0, 2.0, 4.0, 0.25, 0.3)
VALUE_DISTS, QK_DISTS = ("normal", "ties"), ("needle", "normal", "aligned", "needle", "ties")
_SMALLEST_NORMAL = {"float16": 2.0**-14, "bfloat16": 2.0**-126, "float32": 2.0**-126, "float64": 2.0**-1022}
SEEDS = st.integers(0, 2**31 - 1)
# kinds whose hidden pairs are a boolean mask (a backend without masks gets them as a -inf bias, or not
# at all), and kinds that are causal
MASK_BUILT, CAUSAL_KINDS = ("mask", "empty_rows", "causal_mask"), ("causal", "causal_mask")


def _zigzag(b: np.ndarray, n: int) -> np.ndarray:
    """b mod (2n + 1) as 0, 1, -1, 2, -2, ..., n, -n: the zero byte is the value 0, so a shrunk draw
    reads as zeros."""
    z = (b % (2 * n + 1)).astype(np.int64)
    return np.where(z % 2 == 1, (z + 1) // 2, -(z // 2))


def element_values(raw: bytes, n: int, dtype: str, shift: int = 0) -> np.ndarray:
    """n entries from n (16-bit) or 4n bytes, exact in dtype, in [-4, 4].

    16-bit: k/8 with |k| <= 32 (exact in bfloat16's 8 bits and float16).  float32/float64, per
    entry (byte 0 chooses): an integer in [-4, 4] (ties) 3/8 of the time, a uniform value on the
    2^-21 grid of [-4, 4) (exact in float32) 1/2, a signed power of two from 2^-23 to 2 (magnitudes
    far apart in one row) 1/8.  Entry i reads its bytes shifted by shift + i, so zero bytes (what
    Hypothesis' generation falls back on in many examples, and where shrinking goes) spell small
    distinct values - 0, 1, -1, 2, ... eighths or units - not an array of zeros, whose scores would
    all be 0 and its rows uniform whatever the kernel does.
    """
    b = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
    at = shift + np.arange(n)  # (n,)
    if dtype in LOW_PRECISION:
        return _zigzag(b + at, 32) / 8.0
    b = b.reshape(n, 4)
    tie = _zigzag(b[:, 1] + at, 4).astype(np.float64)
    uniform = (b[:, 1] * 65536 + b[:, 2] * 256 + b[:, 3]) * 2.0**-21 - 4.0
    power = np.where(b[:, 2] % 2 == 1, -1.0, 1.0) * 2.0 ** (1 - (b[:, 1] % 25))
    return np.where(b[:, 0] < 96, tie, np.where(b[:, 0] < 224, uniform, power))


def _dims(s: Shape) -> dict:
    return {"q": (s.B, s.H, s.Lq, s.E), "k": (s.B, s.Hkv, s.Lk, s.E), "v": (s.B, s.Hkv, s.Lk, s.Ev)}


def _values_small(draw, s: Shape, dtype) -> dict:
    """Each array from one draw of bytes (an entry's value from its own bytes, so Hypothesis still
    shrinks entry by entry)."""
    out = {}
    for shift, (name, dims) in zip((0, 3, 5), _dims(s).items(), strict=True):  # q, k and v spell different values
        n = int(np.prod(dims))
        raw = draw(st.binary(min_size=n if dtype in LOW_PRECISION else 4 * n,
                             max_size=n if dtype in LOW_PRECISION else 4 * n), label=name)
        out[name] = element_values(raw, n, dtype, shift).reshape(dims)
    return out


def row_seed(label: str) -> int:
    """A fixed problem's seed, from its label: a grid row added, moved or removed leaves the data of every
    other row as it was (seeded by position, one inserted row gave every later row new data, and a planted
    bug's catch moved with it)."""
    return zlib.crc32(label.encode())


def in_format(x: np.ndarray, dtype: str, grid: bool = True) -> np.ndarray:
    """Normal draws made exact in dtype: a k/8 grid in [-4, 4] for 16-bit formats, float32 values for float32."""
    if dtype in LOW_PRECISION:
        return np.clip(np.round(x * 8), -32, 32) / 8 if grid else x
    return x.astype(np.float32).astype(np.float64) if dtype == "float32" else x


def _values_large(draw, s: Shape, dtype) -> dict:
    rng = np.random.default_rng(draw(SEEDS, label="seed"))
    dists = {name: pick(draw, QK_DISTS if name != "v" else VALUE_DISTS, f"{name} distribution") for name in "qkv"}
    dims = _dims(s)
    if "needle" in (dists["q"], dists["k"]):  # each query row has one key equal to it: one score
        n, g = min(s.Lq, s.Lk), s.H // s.Hkv  # stands out by ~sqrt(E) spreads, the row saturates
        q = rng.choice([-1.0, 1.0], dims["q"])  # (B, H, Lq, E)
        k = rng.choice([-0.25, 0.25], dims["k"])  # (B, Hkv, Lk, E)
        k[..., rng.permutation(s.Lk)[:n], :] = q[:, ::g, :n, :]  # the needles
        return {"q": q, "k": k, "v": _large(rng, dists["v"], dims["v"], dtype)}
    direction = None
    if "aligned" in (dists["q"], dists["k"]):  # multiples of one +-1 direction: scores reach +-S, rows saturate
        dists["q"] = dists["k"] = "aligned"
        direction = rng.choice([-1.0, 1.0], s.E)  # (E,) shared by q and k
    return {name: _large(rng, dists[name], dims[name], dtype, direction) for name in "qkv"}


def _large(rng, dist: str, dims: tuple, dtype: str, direction=None) -> np.ndarray:
    if dist == "normal":
        return in_format(rng.standard_normal(dims), dtype)
    if dist == "ties":
        return in_format(rng.integers(-2, 3, dims) / 1.0, dtype, grid=False)
    return in_format(rng.integers(-4, 5, dims[:-1] + (1,)) * direction / 4, dtype, grid=False)  # aligned


def _mask(draw, kind, s: Shape, compiled, allow_empty_rows, small):
    if kind in ("none", "causal"):
        return None
    full = compiled or draw(st.booleans(), label="mask per batch and head")
    dims = (s.B, s.H, s.Lq, s.Lk) if full else (s.Lq, s.Lk)
    if small:  # draw the *hidden* pairs, so shrinking heads for "everything visible"
        n = int(np.prod(dims))
        # about a quarter hidden (a byte a pair); the zero byte, where shrinking goes, is a visible pair
        raw = np.frombuffer(draw(st.binary(min_size=n, max_size=n), label="hidden pairs"), dtype=np.uint8)
        mask = ~np.isin(raw % 8, (3, 4)).reshape(dims)
    else:
        mask = ~V.hidden_pairs(draw, dims, "mask")
    if kind == "empty_rows" and s.Lq:
        rows = draw(st.lists(st.integers(0, s.Lq - 1), min_size=1, max_size=max(1, s.Lq // 2), unique=True),
                    label="fully masked rows")
        mask[..., sorted(rows), :] = False
    if not allow_empty_rows and s.Lk:
        if kind == "causal_mask":
            mask[..., :, 0] = True  # every row sees key 0, the one the causal triangle leaves it
        else:
            mask[..., :, 0] |= ~mask.any(axis=-1)  # a row hidden whole sees key 0 (a leading run keeps its tail)
    return mask


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


def _toward(draw, dtype, S: float) -> int:
    """log2 of the factor on q and k (each) that puts a largest score term S where the draw asks."""
    _, target = pick(draw, AMPLITUDES, "score size")
    goal = SCORE_CAP[dtype] if target is None else min(2.0**target, SCORE_CAP[dtype])
    j = int(np.floor((np.log2(goal) - np.log2(S)) / 2))  # q and k each scaled by 2^j: S by 4^j
    while np.ldexp(S, 2 * j) > SCORE_CAP[dtype]:  # S * 4^j, inf rather than OverflowError
        j -= 1
    return j


def amplitude(draw, dtype, q, k, scale, group) -> int:
    """log2 of the factor on q and k (each) that puts the largest score term where the draw asks."""
    S = score_terms(q, k, scale, group)
    if S == 0:
        return 0
    j = _toward(draw, dtype, S)
    while j and not (_exact_after(q, j, dtype) and _exact_after(k, j, dtype)):
        j += 1 if j < 0 else -1  # toward 1: never leave the format's exact normal numbers
    return j


def draw_case(draw, target: Target, *, kinds=MASK_KINDS, allow_empty_rows=True, scales=SCALES, regimes=REGIMES,
              probe=False, need=frozenset(), avoid=frozenset()) -> Case:
    """A Case for the target's dtype within its backend's capabilities (masks, causal, features).

    ``need``/``avoid``: optional features (specs.fields.FEATURES) every draw must / must not use.
    Values, score sizes and the bias stay in the range of the dtype whose budget judges the results
    (a float64 call computed in float32 is judged in float32) and are exact in it.
    """
    caps, fmt = target.caps, draw_format(target)
    need, avoid = frozenset(need), frozenset(avoid)
    config = V.compiled_config(draw, need, avoid) if target.compiled else None
    use = V.chosen_features(draw, caps.features, need, avoid, config)
    batched = bool(V.PER_SEQUENCE & use)
    s = draw_shape(draw, target.compiled, regimes, target.equal_head_dims, probe, "gqa" in use, "alibi" in use,
                   caps, batched, None if config is None else config.shape)
    if s.H == s.Hkv:
        use = use - {"gqa"}
    kinds = drawable_kinds(target, kinds, allow_empty_rows, avoid)
    menu = (tuple(x for x in scales if x in (None, 0.5)) or (0.5,)) if target.compiled else tuple(scales)
    if config is not None:  # a compile per static choice: from the table
        kind, scale = kinds[config.kind % len(kinds)], menu[config.scale % len(menu)]
    else:
        kind, scale = pick(draw, kinds, "mask kind"), pick(draw, menu, "scale")
    if kind in CAUSAL_KINDS and caps.causal_equal_lengths:  # declared: causal only with Lq == Lk
        s = s._replace(Lq=s.Lk)
    small = _is_small(s)
    arrays = _values_small(draw, s, fmt) if small else _values_large(draw, s, fmt)
    mask = _mask(draw, kind, s, target.compiled, allow_empty_rows, small)
    group = s.H // s.Hkv
    used_scale = scale if scale is not None else 1.0 / np.sqrt(s.E)
    if is_fp8(target.dtype):  # quantised as a serving stack does; S set through the descales
        quantised, descales = fp8_draws.quantise(draw, arrays, target, s.Hkv)
        arrays["v"] = quantised["v"]
        q, k = quantised["q"], quantised["k"]
        S = score_terms(fp8_draws.dequantised(q, descales.get("q_descale"), group),
                        fp8_draws.dequantised(k, descales["k_descale"], 1), used_scale, group)
        descales = fp8_draws.scale_scores(descales, _toward(draw, fmt, S) if S else 0)
        S = score_terms(fp8_draws.dequantised(q, descales.get("q_descale"), group),
                        fp8_draws.dequantised(k, descales["k_descale"], 1), used_scale, group)
    else:
        amp = amplitude(draw, fmt, arrays["q"], arrays["k"], used_scale, group)
        q, k, descales = arrays["q"] * 2.0**amp, arrays["k"] * 2.0**amp, {}
        S = score_terms(q, k, used_scale, group)
    env = V.Drawing(shape=s, fmt=fmt, score=S, cap=SCORE_CAP[fmt],
                    compiled=target.compiled, config=config, allow_empty_rows=allow_empty_rows,
                    hides=allow_empty_rows or kind != "none", need=need)
    diagonal = kind in ("causal", "causal_mask") or bool(F.DIAGONAL & use)  # the alignment moves them
    fields = {**V.draw_fields(draw, env, use, target.alignments if diagonal else ()), **descales}
    if mask is not None and as_bias(draw, target, avoid):  # the same hidden keys, as a -inf bias
        fields["bias"] = np.where(mask, fields.get("bias", 0.0), -np.inf)
        mask = None
    return Case(q, k, arrays["v"], mask, kind in CAUSAL_KINDS, scale, fields)


def draw_format(target: Target) -> str:
    """The format drawn values, score caps and field values follow: the budget's dtype; for fp8 inputs
    float32, what such a kernel computes in (a declared coarser effective precision: that one)."""
    fmt = target.budget_dtype
    return "float32" if is_fp8(fmt) else fmt


def drawable_kinds(target: Target, kinds, allow_empty_rows: bool = True, avoid=frozenset()) -> tuple:
    """The mask kinds a backend can be given: a mask-built kind needs boolean masks or a bias it can
    go in as -inf (not avoided); a causal kind a causal mode."""
    caps = target.caps
    hides = caps.masks or (target.supports("bias") and "bias" not in avoid)
    return tuple(k for k in kinds if (hides or k not in MASK_BUILT) and (caps.causal or k not in CAUSAL_KINDS)
                 and (allow_empty_rows or k != "empty_rows"))


def as_bias(draw, target: Target, avoid) -> bool:
    """Whether a drawn mask goes in as a -inf bias: always for a backend that takes a bias and no
    mask; a quarter of the time for one that takes both (a kernel's -inf path is not its mask path)."""
    if not target.supports("bias") or "bias" in avoid:
        return False
    return not target.caps.masks or draw(st.integers(0, 3), label="hidden keys as a -inf bias (0 = yes)") == 0
