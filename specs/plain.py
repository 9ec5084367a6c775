"""The plain same-dtype computation the error budget compares with, and rounding to a format.

`Plain(dtype)` is an arithmetic for `specs.reference`'s pipeline: each operation is computed
in the accumulator type (float32 for the 16-bit formats and float32, float64 for float64)
and its result rounded to dtype - the naive algorithm as a framework runs it.
`plain_forward`, `plain_lse`, `plain_backward` run it (`specs.error_budget` re-exports them).
"""
from __future__ import annotations

import numpy as np

from attnspec.specs.problem import Problem, validate
from attnspec.specs.reference import Exact, run_backward, run_forward

# dtype -> the NumPy type holding its values (bfloat16 values are float32 numbers)
STORAGE = {"float16": "float16", "bfloat16": "float32", "float32": "float32", "float64": "float64"}


def dtype_name(dtype) -> str:
    """'float16', 'bfloat16', 'float32' or 'float64' for a name, NumPy or torch dtype; else ValueError."""
    name = str(getattr(dtype, "__name__", dtype)).replace("torch.", "")
    name = np.dtype(name).name if name in ("float", "double", "half") else name
    if name not in STORAGE:
        raise ValueError(f"dtype must be one of {sorted(STORAGE)}; got {dtype!r}")
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


def _problem(q, k, v, mask, is_causal, scale, fields) -> Problem:
    return q if isinstance(q, Problem) else validate(q, k, v, mask, is_causal, scale, **fields)


def plain_forward(q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", **fields):
    """The naive forward in ``dtype``: the output, in dtype's storage type."""
    return run_forward(_problem(q, k, v, mask, is_causal, scale, fields), Plain(dtype)).output


def plain_lse(q, k=None, v=None, mask=None, is_causal=False, scale=None, dtype="float32", **fields):
    """The naive forward's log-sum-exp (..., Lq) in ``dtype``'s accumulator type."""
    return run_forward(_problem(q, k, v, mask, is_causal, scale, fields), Plain(dtype)).lse


def plain_backward(q, k, v, grad_out, mask=None, is_causal=False, scale=None, dtype="float32", **fields):
    """The naive backward in ``dtype`` (seed 003's chain): (dq, dk, dv[, dbias]) in dtype's storage type."""
    return run_backward(_problem(q, k, v, mask, is_causal, scale, fields), grad_out, Plain(dtype))
