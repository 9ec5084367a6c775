"""Drawing fp8 inputs (issue 31): quantised q, k, v with their descales, as a quantiser makes them.

Each tensor is drawn as for float32 (`draws`: entries, needles, ties, aligned rows), then quantised
the way serving stacks do: per batch element and KV head (or per tensor, where the backend takes one
descale a tensor), descale = amax / largest, x_fp8 = round(x / descale) - so every head's largest
entry sits at +-448 (e4m3) or +-57344 (e5m2), the format's edge.  On top, drawn on purpose: a spread
of the descales between heads (powers of two, or any float32 factor), saturation (a descale a
quarter of the calibrated one: a share of entries clipped to +-largest), and subnormal entries
sprinkled among the others; and the descales' shape: (B, Hkv), or one of the forms that broadcast to
it - (B, 1), (1, Hkv), (Hkv,) - which a kernel that reads (B, Hkv) strides from any descale misreads
(one descale per batch element or per KV head, shared, as a quantiser may keep them).  The score size
S is then set, as for every dtype, by multiplying the q and k descales by powers of two (exact in
float32): the fp8 values stay as quantised.  Values are rounded bit for bit as ``ml_dtypes`` does (`specs.fp8.round_fp8`).
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from attnspec.properties.shapes import pick
from attnspec.specs.fp8 import FP8_FORMATS, is_fp8, round_fp8
from attnspec.specs.plain import round_to

SPREADS = ("calibrated", "powers of two", "any factor")
EXTREMES = ("none", "subnormals", "saturated", "subnormals")
# a per-head descale's shape: the axes of (B, Hkv) it keeps (False: one shared along that axis), and its rank
DESCALE_FORMS = {"(B, Hkv)": (True, True, 2), "(B, 1)": (True, False, 2), "(1, Hkv)": (False, True, 2),
                 "(Hkv,)": (False, True, 1)}
DESCALE_SHAPES = ("(B, Hkv)", "(B, 1)", "(1, Hkv)", "(Hkv,)", "(B, Hkv)")  # the whole shape twice as often


def _per_kv_head(x: np.ndarray, Hkv: int) -> np.ndarray:
    """(B, Hkv) the largest |x| of each batch element's KV head (a query group's heads together)."""
    B, H = x.shape[:2]
    return np.abs(x).reshape(B, Hkv, H // Hkv, -1).max(axis=(-2, -1))  # (B, Hkv)


def _descale(amax: np.ndarray, largest: float) -> np.ndarray:
    """amax / largest in float32 (1 where a head is all zeros)."""
    return np.where(amax > 0, amax / largest, 1.0).astype(np.float32).astype(np.float64)


def quantise(draw, arrays: dict, target, Hkv: int) -> tuple:
    """(q, k, v as fp8 values (q in its declared dtype when it is not fp8), {descale fields}) from drawn
    float arrays; the descales are float32 values, (B, Hkv) or a form broadcast to it, or () per tensor."""
    fmt = FP8_FORMATS[target.dtype]
    per_head = target.caps.descale_granularity == "head"
    spread = pick(draw, SPREADS, "fp8 descale spread") if per_head else "calibrated"
    extremes = pick(draw, EXTREMES, "fp8 extremes")
    shape = pick(draw, DESCALE_SHAPES, "fp8 descale shape") if per_head else "()"
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1), label="fp8 seed"))
    out, fields = {}, {}
    for name in "qkv":
        x = arrays[name]  # (B, H, L, D)
        if name == "q" and not is_fp8(target.query_dtype):  # a 16-bit query beside fp8 K/V: no descale
            out[name] = np.asarray(round_to(x, target.query_dtype), dtype=np.float64)
            continue
        amax = _per_kv_head(x, Hkv) if per_head else np.full((1, 1), np.abs(x).max(initial=0.0))  # (B, Hkv)
        if per_head:  # the largest over the axes the shape shares: (B, Hkv), (B, 1) or (1, Hkv)
            keep_b, keep_h, _ = DESCALE_FORMS[shape]
            amax = amax.max(axis=tuple(a for a, kept in enumerate((keep_b, keep_h)) if not kept), keepdims=True)
        d = _descale(amax, fmt.largest)
        if spread == "powers of two":
            d = d * 2.0 ** rng.integers(-3, 4, d.shape)
        elif spread == "any factor":
            d = (d * rng.uniform(0.5, 2.0, d.shape)).astype(np.float32).astype(np.float64)
        if extremes == "saturated" and name != "q":
            d = d / 4  # a quarter of the calibrated descale: entries past amax / 4 clip to +-largest
        full = np.broadcast_to(d, (x.shape[0], Hkv))  # (B, Hkv)
        full = np.repeat(full, x.shape[1] // Hkv, axis=1)[..., None, None]  # (B, H, 1, 1)
        xq = round_fp8(np.clip(x / full, -fmt.largest, fmt.largest), target.dtype)  # (B, H, L, D)
        if extremes == "subnormals":
            tiny = rng.random(xq.shape) < 0.125  # an eighth of the entries: subnormal codes, either sign
            codes = rng.integers(1, 2**fmt.mantissa, xq.shape) * fmt.subnormal_min * rng.choice([-1.0, 1.0], xq.shape)
            xq = np.where(tiny, codes, xq)
        out[name] = xq
        fields[f"{name}_descale"] = (d.reshape(-1) if DESCALE_FORMS[shape][2] == 1 else d) if per_head else d.reshape(())
    return out, fields


def dequantised(x: np.ndarray, descale, group: int) -> np.ndarray:
    """x * descale broadcast per KV head (over a query group's heads); x without one."""
    if descale is None:
        return x
    d = np.broadcast_to(np.asarray(descale, dtype=np.float64), (x.shape[0], x.shape[1] // group))  # (B, Hkv)
    return x * np.repeat(d, group, axis=-1)[..., None, None]  # (B, H, L, D)


def scale_scores(fields: dict, j: int) -> dict:
    """The descales with S multiplied by 4^j: q's and k's each by 2^j (all of it on k without a q descale)."""
    out = dict(fields)
    if "q_descale" in out:
        out["q_descale"], out["k_descale"] = out["q_descale"] * 2.0**j, out["k_descale"] * 2.0**j
    else:
        out["k_descale"] = out["k_descale"] * 4.0**j
    return out
