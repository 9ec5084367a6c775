"""numpy-tiled's fp8 path (issue 31): FA3's arithmetic on fp8 inputs, emulated in float32.

NumPy has no fp8 type: an fp8 input arrives as float32 numbers that are exact fp8 values (like
bfloat16 held in float32).  The kernel then does what FA3's fp8 forward does: q and k times their
descales in float32 (FA3 folds them into the softmax scale: the same products up to one rounding),
the scores and the online softmax in float32, P = exp(s - m) of each tile rounded to the input's
fp8 format before P V (the second GEMM takes fp8 operands; the row sum is taken from P before
rounding), V's descale applied to the output at the end.  Its own rounding, never `specs`'s: a
float32 addition of a magic number whose last place is the fp8 spacing rounds to it (ties to even).
"""
from __future__ import annotations

import numpy as np

# (mantissa bits, exponent of the smallest normal) of the formats P is rounded to
P_FORMATS = {"float8_e4m3fn": (3, -6), "float8_e5m2": (2, -14)}


def round_p(p: np.ndarray, dtype: str) -> np.ndarray:
    """p >= 0 (float32) rounded to the fp8 format, ties to even, in float32 (P <= 1: never past its range)."""
    mantissa, min_exp = P_FORMATS[dtype]
    p = np.asarray(p, dtype=np.float32)
    exponent = ((p.view(np.uint32) >> 23) & 0xFF).astype(np.int32) - 127  # float32's biased exponent
    step = np.ldexp(np.float32(1), np.maximum(exponent, min_exp) - mantissa).astype(np.float32)  # spacing at p
    magic = (step * np.float32(1.5 * 2**23)).astype(np.float32)  # its last place is step: p + magic rounds to it
    return ((p + magic) - magic).astype(np.float32)


def _per_head(d, heads: int, dtype):
    """A descale (..., Hkv) or a scalar as (..., H, 1, 1) in dtype for an array with `heads` heads."""
    d = np.asarray(d).astype(dtype)
    if d.ndim == 0 or d.shape[-1] == heads:
        return d if d.ndim == 0 else d[..., None, None]
    return np.repeat(d, heads // d.shape[-1], axis=-1)[..., None, None]  # a query group shares its KV head's


def of_sequence(call, b: int, B: int) -> dict:
    """Sequence b's descales of a packed or paged call (B sequences): a (B, Hkv) or (B, 1) descale's row
    b, as (1, ·); one shared by every sequence ((1, Hkv), (Hkv,), a scalar) as it is."""
    out = {}
    for name in ("q_descale", "k_descale", "v_descale"):
        d = getattr(call, name)
        if d is not None and np.ndim(d) == 2:
            d = np.broadcast_to(d, (B, np.shape(d)[1]))[b:b + 1]  # (1, Hkv) or (1, 1)
        out[name] = d
    return out


def dequantised_qk(q, k, call):
    """q and k times their descales, in their dtype (K/V heads' descales shared by their query group);
    either may be None (a paged call dequantises its pages one at a time)."""
    if call.q_descale is not None and q is not None:
        q = q * _per_head(call.q_descale, q.shape[-3], q.dtype)  # (..., Hq, Lq, E)
    if call.k_descale is not None and k is not None:
        k = k * _per_head(call.k_descale, k.shape[-3], k.dtype)  # (..., Hkv, Lk, E)
    return q, k


def descaled_output(out, call):
    """The output times V's descale (per KV head, over its query group's heads)."""
    if call.v_descale is None:
        return out
    return out * _per_head(call.v_descale, out.shape[-3], out.dtype)  # (..., Hq, Lq, Ev)
