"""Helpers the harness tests share: random problems and the dtype a backend's results are judged in.

Plain functions rather than fixtures: every caller passes its own sizes and seed.
"""
from __future__ import annotations

import os
import sys

import numpy as np

# PATH as a venv's `activate` sets it: this interpreter's own commands first, so a test that runs
# `asv` or `python` as a user types them runs this environment's, whether the venv is activated or
# its commands are called by path (then PATH holds none of them)
ACTIVATED_PATH = os.pathsep.join(p for p in (os.path.dirname(sys.executable), os.environ.get("PATH", "")) if p)

# significand bits (with the implicit one): bfloat16 (8) is narrower than float16 (11)
SIGNIFICAND_BITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53, "float8_e4m3fn": 4, "float8_e5m2": 3}


def qkv(seed=0, *, batch=(1, 2), Lq=4, Lk=6, E=8, Ev=None, sigma=1.0):
    """Random q (batch + (Lq, E)), k (batch + (Lk, E)) and v (batch + (Lk, Ev); Ev defaults to E).

    q and k are normal with standard deviation sigma (the spread of the logits), v standard normal;
    drawn in that order from default_rng(seed), so a seed names one problem.
    """
    rng = np.random.default_rng(seed)
    Ev = E if Ev is None else Ev
    q = sigma * rng.standard_normal((*batch, Lq, E))
    k = sigma * rng.standard_normal((*batch, Lk, E))
    v = rng.standard_normal((*batch, Lk, Ev))
    return q, k, v


def judged_dtype(backend, dtype: str) -> str:
    """The dtype whose error budget applies to `backend`'s results in `dtype`: its declared
    effective precision (e.g. jax-dpa's float32 softmax, openvino-sdpa's bfloat16) where that is
    narrower than `dtype`, else `dtype` itself; fp8 inputs: the declared computation (Target's)."""
    from attnspec.specs.fp8 import is_fp8
    if is_fp8(dtype):
        return target_of(backend, dtype, equal_dims=False).budget_dtype
    eff = backend.semantics.effective_precision
    return eff if eff and SIGNIFICAND_BITS[eff] < SIGNIFICAND_BITS[dtype] else dtype


def target_of(backend, dtype: str = "float32", *, spec: str | None = None, equal_dims: bool | None = None):
    """A Target (the backend at one dtype) outside a suite run, for tests of draws, checks and outcomes.

    spec: how a reproducer would name it (default: the backend's name); equal_dims: whether it
    declines Ev != E, when known (False: no probe call is made)."""
    from attnspec.properties.target import Session, Target

    return Target(Session(backend, spec or backend.name, equal_dims=equal_dims), dtype)
