"""The attention problem: what the inputs are and which (query, key) pairs take part.

query ``(..., Lq, E)``, key ``(..., Lk, E)``, value ``(..., Lk, Ev)``; the leading
dimensions (batch, heads) broadcast.  ``mask`` is boolean, broadcastable to
``(..., Lq, Lk)``, and True means *takes part*.  ``is_causal`` is aligned top-left:
query i sees keys j <= i, as PyTorch and JAX do.  ``scale`` defaults to 1/sqrt(E).

Only NumPy (and objects exposing ``shape``/``dtype``) is used here.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

FLOAT_DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class Problem:
    """A validated attention problem (arrays untouched; shapes and scale resolved)."""

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    mask: np.ndarray | None
    is_causal: bool
    scale: float
    batch_shape: tuple
    Lq: int
    Lk: int
    E: int
    Ev: int


def _dtype_name(x) -> str:
    return str(getattr(x, "dtype", type(x).__name__)).replace("torch.", "")


def _is_floating(x) -> bool:
    name = _dtype_name(x)
    return name in FLOAT_DTYPE_NAMES or name.startswith("float")


def default_scale(E: int) -> float:
    """1/sqrt(E): the factor that brings Var(q.k) back to 1 for unit-variance inputs."""
    return 1.0 / math.sqrt(E)


def validate(query, key, value, mask=None, is_causal=False, scale=None) -> Problem:
    """Check the arguments against the definition; raise ValueError naming the culprit."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        shape = getattr(x, "shape", None)
        if shape is None or len(shape) < 2:
            raise ValueError(f"{name} must be an array of rank >= 2 shaped (..., L, E); got shape {shape}")
        if not _is_floating(x):
            raise ValueError(f"{name} must have a floating dtype; got {_dtype_name(x)}")
    qs, ks, vs = tuple(query.shape), tuple(key.shape), tuple(value.shape)
    Lq, E = qs[-2:]
    Lk, Ek = ks[-2:]
    Lkv, Ev = vs[-2:]
    if E != Ek:
        raise ValueError(f"query and key must share the last dimension E; got query {qs} (E={E}) and key {ks} (E={Ek})")
    if Lk != Lkv:
        raise ValueError(f"key and value must have the same length Lk; "
                         f"got key {ks} (Lk={Lk}) and value {vs} (Lk={Lkv})")
    for dim_name, size in (("Lq (query.shape[-2])", Lq), ("Lk (key.shape[-2])", Lk),
                           ("E (query.shape[-1])", E), ("Ev (value.shape[-1])", Ev)):
        if size == 0:
            raise ValueError(f"{dim_name} must be positive; got 0 (query {qs}, key {ks}, value {vs})")
    try:
        batch_shape = np.broadcast_shapes(qs[:-2], ks[:-2], vs[:-2])
    except ValueError:
        raise ValueError(f"leading (batch, head) dimensions of query {qs}, key {ks} "
                         f"and value {vs} do not broadcast") from None
    if mask is not None:
        mshape = tuple(getattr(mask, "shape", ()))
        if _dtype_name(mask) != "bool":
            raise ValueError(f"mask must be boolean (True = takes part); got dtype {_dtype_name(mask)}")
        try:
            full = np.broadcast_shapes(mshape, batch_shape + (Lq, Lk))
        except ValueError:
            full = None
        if full != batch_shape + (Lq, Lk):
            raise ValueError(f"mask of shape {mshape} is not broadcastable to (..., Lq, Lk) = {batch_shape + (Lq, Lk)}")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise ValueError(f"is_causal must be a bool; got {is_causal!r}")
    if scale is None:
        scale = default_scale(E)
    else:
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale must be a finite positive number; got {scale!r}")
        scale = float(scale)
    return Problem(query, key, value, mask, bool(is_causal), scale, tuple(batch_shape), Lq, Lk, E, Ev)


def causal_mask(Lq: int, Lk: int, alignment: str = "top_left") -> np.ndarray:
    """Boolean (Lq, Lk): True where query i may see key j.

    top_left: j <= i (PyTorch's ``is_causal``, JAX's ``is_causal``).
    bottom_right: j <= i + (Lk - Lq), the KV-cache convention (flash-attn >= 2.1).
    """
    i = np.arange(Lq)[:, None]  # (Lq, 1)
    j = np.arange(Lk)[None, :]  # (1, Lk)
    if alignment == "top_left":
        return j <= i  # (Lq, Lk)
    if alignment == "bottom_right":
        return j <= i + (Lk - Lq)  # (Lq, Lk)
    raise ValueError(f"alignment must be 'top_left' or 'bottom_right'; got {alignment!r}")


def visible(problem: Problem) -> np.ndarray:
    """Boolean (..., Lq, Lk): the pairs that take part (mask AND causal)."""
    shape = problem.batch_shape + (problem.Lq, problem.Lk)
    vis = np.ones(shape, dtype=bool)  # (..., Lq, Lk)
    if problem.mask is not None:
        vis = vis & np.asarray(problem.mask, dtype=bool)
    if problem.is_causal:
        vis = vis & causal_mask(problem.Lq, problem.Lk)
    return vis
