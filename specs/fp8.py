"""FP8 inputs (issue 31): the two float8 formats, rounding to them, and what a kernel computes from them.

The formats (OCP FP8, as `ml_dtypes`, PyTorch and JAX name them):

    float8_e4m3fn  3 mantissa bits, exponent bias 7, normal from 2^-6, subnormals down to 2^-9,
                   largest 448, no infinity (the "fn": finite), NaN = S.1111.111
    float8_e5m2    2 mantissa bits, exponent bias 15, normal from 2^-14, subnormals down to 2^-16,
                   largest 57344, +-inf and NaN as in IEEE

A quantised tensor comes with a *descale*: its real value is ``x = x_fp8 * descale`` (FA3/FA4's
``q_descale``, ``k_descale``, ``v_descale`` of shape (B, Hkv), float32; FlashInfer's ``k_scale`` and
vLLM's means the same, per tensor).  The reference runs on the dequantised values
(`specs.reference.dequantized`).

What a kernel computes from fp8 inputs (`Fp8Computation`): the scores, the softmax and both
products accumulate in float32 (tensor cores multiply fp8 exactly and accumulate in float32), then
optionally P = exp(s - max) is rounded to ``p_dtype`` before P V (FA3/FA4 and PyTorch's quantised
SDPA round P to e4m3: the second GEMM takes fp8 operands; FlashInfer's fp8-KV kernels round it to
the query's 16-bit dtype), and the output is rounded to the output dtype (bfloat16 in FA3, FA4 and
PyTorch).  Its name, e.g. ``float8_e4m3fn(p=float8_e4m3fn,out=bfloat16)``, is the "dtype" the
error budget (`specs.error_budget`) and the plain computation (`specs.plain`) take for such a
kernel: `computation` parses it.  NumPy only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fp8Format:
    name: str
    mantissa: int      # explicit mantissa bits
    min_exponent: int  # exponent of the smallest normal number
    largest: float     # the largest finite value
    has_inf: bool      # e5m2 overflows to inf; e4m3fn has none: NaN

    @property
    def unit_roundoff(self) -> float:
        return 2.0 ** -(self.mantissa + 1)

    @property
    def normal_min(self) -> float:
        return 2.0 ** self.min_exponent

    @property
    def subnormal_min(self) -> float:
        return 2.0 ** (self.min_exponent - self.mantissa)

    def positives(self) -> np.ndarray:
        """Every finite value > 0 of the format, ascending (the subnormals first)."""
        sub = np.arange(1, 2 ** self.mantissa) * self.subnormal_min
        frac = 1.0 + np.arange(2 ** self.mantissa) / 2 ** self.mantissa  # (2^m,) 1.0, 1.125, ...
        exps = np.arange(self.min_exponent, int(np.log2(self.largest)) + 1)
        normal = (frac[None, :] * 2.0 ** exps[:, None]).ravel()
        return np.concatenate([sub, normal[normal <= self.largest]])


FP8_FORMATS = {
    "float8_e4m3fn": Fp8Format("float8_e4m3fn", 3, -6, 448.0, has_inf=False),
    "float8_e5m2": Fp8Format("float8_e5m2", 2, -14, 57344.0, has_inf=True),
}
FP8_DTYPE_NAMES = tuple(FP8_FORMATS)


def is_fp8(dtype) -> bool:
    """Whether dtype (a name, or a computation's name) has fp8 inputs."""
    return str(dtype).split("(", 1)[0] in FP8_FORMATS


def round_fp8(x, name: str) -> np.ndarray:
    """x rounded to the fp8 format `name` (round to nearest, ties to even), as float64.

    Bit for bit what ``ml_dtypes`` (and so JAX) gives: below the normal range the spacing is the
    subnormals' 2^(min_exponent - mantissa); past the largest value plus half a step e4m3fn gives
    NaN, e5m2 inf; NaN stays NaN, inf becomes NaN in e4m3fn.
    """
    fmt = FP8_FORMATS[name]
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    a = np.where(finite, np.abs(x), 0.0)
    _, e = np.frexp(a)  # a = m 2^e, m in [0.5, 1): the leading bit is 2^(e - 1)
    exponent = np.maximum(e - 1, fmt.min_exponent)  # subnormals share the smallest normal's spacing
    step = np.ldexp(1.0, exponent - fmt.mantissa)  # the spacing of the format's numbers at a
    y = np.copysign(np.round(a / step) * step, x)  # np.round: ties to even; a / step is exact
    overflow = np.abs(y) > fmt.largest
    over = np.copysign(np.inf, x) if fmt.has_inf else np.nan
    y = np.where(overflow, over, y)
    if fmt.has_inf:
        return np.where(finite, y, x)
    return np.where(finite, y, np.nan)


@dataclass(frozen=True)
class Fp8Computation:
    """What a kernel computes from fp8 inputs (the module's docstring): a budget's "dtype"."""

    inputs: str                 # the fp8 format of K and V (and of q, unless `query` says otherwise)
    p_dtype: str | None = None  # P rounded to this before P V; None: kept in float32
    out: str = "float32"        # the output dtype
    query: str | None = None    # q's dtype when it is not fp8 (FlashInfer's fp8 KV cache: bfloat16)

    @property
    def name(self) -> str:
        extra = "" if self.query is None else f",q={self.query}"
        return f"{self.inputs}(p={self.p_dtype or 'float32'},out={self.out}{extra})"


_NAME = re.compile(r"^(float8_\w+)\(p=(\w+),out=(\w+)(?:,q=(\w+))?\)$")


def computation(name: str) -> Fp8Computation:
    """The computation a name stands for; a bare format name: float32 throughout, output in float32."""
    if name in FP8_FORMATS:
        return Fp8Computation(name)
    m = _NAME.match(str(name))
    if not m or m.group(1) not in FP8_FORMATS:
        raise ValueError(f"dtype must be an fp8 format ({', '.join(FP8_FORMATS)}) or a computation named like "
                         f"'float8_e4m3fn(p=float8_e4m3fn,out=bfloat16)'; got {name!r}")
    inputs, p, out, query = m.groups()
    return Fp8Computation(inputs, None if p == "float32" else p, out, query)


def query_format(dtype: str, query: str | None) -> str:
    """The format q's values must be exact in: the fp8 one, or the declared query dtype."""
    return query or str(dtype).split("(", 1)[0]


__all__ = ["FP8_DTYPE_NAMES", "FP8_FORMATS", "Fp8Computation", "Fp8Format", "computation", "is_fp8", "query_format",
           "round_fp8"]
