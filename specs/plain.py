"""The plain same-dtype computation the error budget compares with, and rounding to a format.

`Plain(dtype)` is an arithmetic for `specs.reference`'s pipeline: each operation is computed
in the accumulator type (float32 for the 16-bit formats and float32, float64 for float64)
and its result rounded to dtype - the naive algorithm as a framework runs it.  The row sum is
rounded, and a sink's term is added to it after the keys' sum and rounded again (`reference.sink_softmax`):
a 16-bit kernel that holds its row sum in the format (numpy-naive) does both roundings.
`plain_forward`, `plain_lse`, `plain_backward` run it (`specs.error_budget` re-exports them).
For fp8 inputs the "dtype" is a computation (`specs.fp8.Fp8Computation`, by name): `Fp8Plain` keeps
every step in float32 and rounds only what the kernel rounds - P before P V, and the output.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.specs import fp8
from attnspec.specs.problem import Problem, validate
from attnspec.specs.reference import Exact, dequantized, run_backward, run_forward

# dtype -> the NumPy type holding its values (bfloat16 values are float32 numbers)
STORAGE = {"float16": "float16", "bfloat16": "float32", "float32": "float32", "float64": "float64"}


def dtype_name(dtype) -> str:
    """'float16', 'bfloat16', 'float32' or 'float64' for a name, NumPy or torch dtype - or an fp8 format
    or computation's name (`specs.fp8`), as given; else ValueError."""
    name = str(getattr(dtype, "__name__", dtype)).replace("torch.", "")
    name = np.dtype(name).name if name in ("float", "double", "half") else name
    if fp8.is_fp8(name):
        return fp8.computation(name).name if "(" in name else name
    if name not in STORAGE:
        raise ValueError(f"dtype must be one of {sorted(STORAGE)} or an fp8 format {fp8.FP8_DTYPE_NAMES}; got {dtype!r}")
    return name


def round_bfloat16(x) -> np.ndarray:
    """Round to bfloat16 (round-to-nearest-even on the float32 bit pattern), held in float32."""
    f = np.asarray(x, dtype=np.float32)
    bits = f.view(np.uint32)  # same shape
    lsb = (bits >> 16) & 1  # the last bit bfloat16 keeps: ties go to the even one
    rounded = ((bits + np.uint32(0x7FFF) + lsb) & np.uint32(0xFFFF0000)).astype(np.uint32)
    rounded = np.where(np.isnan(f), bits | np.uint32(0x00400000), rounded)  # NaN stays NaN
    return rounded.view(np.float32)


def round_to(x, dtype) -> np.ndarray:
    """x rounded to dtype's values, held in dtype's storage type."""
    name = dtype_name(dtype)
    if name == "bfloat16":
        return round_bfloat16(x)
    if name in fp8.FP8_FORMATS:
        return fp8.round_fp8(x, name)  # held in float64
    return np.asarray(x).astype(STORAGE[name])


class Plain(Exact):
    """The reference's pipeline with every intermediate rounded to dtype."""

    def __init__(self, dtype):
        self.dtype = dtype_name(dtype)
        self.acc = np.float64 if self.dtype == "float64" else np.float32

    def r(self, x) -> np.ndarray:
        return round_to(np.asarray(x, dtype=self.acc) if self.dtype != "float16" else x, self.dtype)

    def a(self, x) -> np.ndarray:
        return np.asarray(x, dtype=self.acc)

    def matmul(self, x, y) -> np.ndarray:
        return self.r(self.a(x) @ self.a(y))


class Fp8Plain(Exact):
    """What an fp8 kernel computes (`specs.fp8.Fp8Computation`): every step in float32 - the inputs
    dequantised there, the scores, the softmax and both products accumulated - and P = exp(s - max)
    rounded to p_dtype before P V (the row sum taken before, from the unrounded P: FA3's softmax), the
    output rounded to its dtype."""

    acc = np.float32

    def __init__(self, computation: fp8.Fp8Computation):
        self.computation = computation
        self.dtype = computation.name

    def r(self, x) -> np.ndarray:
        return np.asarray(x, dtype=np.float32)

    def a(self, x) -> np.ndarray:
        return np.asarray(x, dtype=np.float32)

    def matmul(self, x, y) -> np.ndarray:
        return self.r(self.a(x) @ self.a(y))

    def probabilities(self, e, total) -> np.ndarray:
        p = self.computation.p_dtype
        rounded = e if p is None else np.asarray(round_to(e, p), dtype=np.float32)  # P as P V takes it
        return self.r(rounded / total)

    def output(self, x) -> np.ndarray:
        return np.asarray(round_to(x, self.computation.out), dtype=np.float64)

    def inputs(self, p) -> tuple:
        """q, k, v cast to the kernel's formats (exact already when drawn), then times their descales."""
        c = self.computation
        cast = replace(p, query=round_to(p.query, c.query or c.inputs), key=round_to(p.key, c.inputs),
                       value=round_to(p.value, c.inputs))
        return dequantized(cast)


def arithmetic(dtype) -> Exact:
    """The plain computation for a dtype: `Plain`, or `Fp8Plain` for an fp8 format or computation."""
    name = dtype_name(dtype)
    return Fp8Plain(fp8.computation(name)) if fp8.is_fp8(name) else Plain(name)


def _problem(q, k, v, mask, is_causal, scale, fields) -> Problem:
    return q if isinstance(q, Problem) else validate(q, k, v, mask, is_causal, scale, **fields)


def plain_forward(q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", **fields):
    """The naive forward in ``dtype``: the output, in dtype's storage type."""
    return run_forward(_problem(q, k, v, mask, is_causal, scale, fields), arithmetic(dtype)).output


def plain_lse(q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", **fields):
    """The naive forward's log-sum-exp (..., Lq) in ``dtype``'s accumulator type."""
    return run_forward(_problem(q, k, v, mask, is_causal, scale, fields), arithmetic(dtype)).lse


def plain_backward(q, k, v, grad_out, mask=None, is_causal=False, scale=None, dtype="float32", **fields):
    """The naive backward in ``dtype`` (seed 003's chain): (dq, dk, dv[, dbias]) in dtype's storage type."""
    return run_backward(_problem(q, k, v, mask, is_causal, scale, fields), grad_out, Plain(dtype))
