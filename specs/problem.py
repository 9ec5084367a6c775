"""The attention problem: what the inputs are and which (query, key) pairs take part.

One composable definition, every field optional (`validate` names each; `specs.fields` is
the table of the optional ones):

    scores  = scale * q k^T                      q (..., Hq, Lq, E), k (..., Hkv, Lk, E)
    scores  = softcap * tanh(scores / softcap)   softcap: None = off
    scores += bias + alibi                       bias broadcastable to (..., Hq, Lq, Lk); -inf = hidden
    visible = mask & causal & window & lengths & segments & (bias > -inf)
    weights = softmax over the visible keys;  output = weights v;  lse = log sum exp (visible scores)

``mask`` is boolean, True means *takes part*.  ``is_causal`` uses ``causal_alignment``:
``top_left`` (query i sees keys j <= i: PyTorch's ``is_causal``, JAX) or ``bottom_right``
(j <= i + Lk - Lq: flash-attention, ``causal_lower_right``).  ``scale`` defaults to 1/sqrt(E).
``enable_gqa``: key/value have Hkv heads on axis -3, Hq % Hkv == 0, and query head h reads KV
head h // (Hq // Hkv) (PyTorch's ``enable_gqa``; MQA is Hkv = 1).  ``window = (left, right)``
keeps keys j with i + o - left <= j <= i + o + right (inclusive; o = Lk - Lq when bottom-right
aligned, else 0; None = unbounded on that side).  ``q_lengths``/``kv_lengths`` (per batch
element: shape broadcastable to the leading dims before the head axis): query rows at or past
q_lengths are padding and see nothing, keys at or past kv_lengths are hidden.
``q_segment_ids``/``kv_segment_ids`` (..., Lq)/(..., Lk) integers: a query sees only keys of
its own segment (packed sequences).  ``alibi_slopes`` (Hq,): adds -slope_h * |i + o - j|.
``sinks`` (Hq,): a logit s_h added to every row's denominator, weights = exp(s_ij) / (sum_visible
exp(s_ij') + exp(s_h)) - a virtual key of value 0, not scaled, capped, biased or masked (-inf = none).

Only NumPy (and objects exposing ``shape``/``dtype``) is used here.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from attnspec.specs import fields as F
from attnspec.specs.fields import CAUSAL_ALIGNMENTS, FEATURE_TEXT, FEATURES  # noqa: F401 - public names
from attnspec.specs.fp8 import FP8_DTYPE_NAMES
from attnspec.specs.masks import alibi_bias, alibi_slopes, causal_mask, window_mask  # noqa: F401 - public names

FLOAT_DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")
# every dtype a backend may declare: the float formats and the fp8 ones (specs.fp8; forward-only)
DTYPE_NAMES = FLOAT_DTYPE_NAMES + FP8_DTYPE_NAMES


@dataclass(frozen=True)
class Problem:
    """A validated attention problem (arrays untouched; shapes and scale resolved).

    Every optional field of `specs.fields.FIELDS` reads as an attribute (``p.bias``,
    ``p.window``), at its off value when not given."""

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    mask: np.ndarray | None
    is_causal: bool
    scale: float
    batch_shape: tuple  # leading dims of the output, ending with Hq when the inputs have a head axis
    Lq: int
    Lk: int
    E: int
    Ev: int
    group: int = 1      # query heads per KV head (1 without enable_gqa)
    fields: dict = field(default_factory=lambda: dict(F.OFF))

    def __getattr__(self, name):
        if name in F.BY_NAME:
            return self.__dict__["fields"][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def features(self) -> frozenset:
        """The optional features this problem uses (names from FEATURES; 'lse' is a call option)."""
        return frozenset(f.feature for f in F.FIELDS if f.used(self.fields[f.name], self))

    @property
    def offset(self) -> int:
        """Where query i's diagonal meets the keys: Lk - Lq bottom-right aligned, else 0."""
        return F.offset(self.Lq, self.Lk, self.causal_alignment)

    @property
    def offsets(self):
        """Per-sequence diagonal offsets (lead...,) with positions='per_sequence', else None (`offset`)."""
        return F.offsets_of(self)

    @property
    def Hq(self) -> int:
        return self.batch_shape[-1] if self.batch_shape else 1


def _dtype_name(x) -> str:
    return str(getattr(x, "dtype", type(x).__name__)).replace("torch.", "")


def _is_floating(x) -> bool:
    name = _dtype_name(x)
    return name in FLOAT_DTYPE_NAMES or name.startswith("float")


def default_scale(E: int) -> float:
    """1/sqrt(E): the factor that brings Var(q.k) back to 1 for unit-variance inputs."""
    return 1.0 / math.sqrt(E)


def _heads(qs, ks, vs, enable_gqa) -> tuple:
    """(batch_shape, group): leading dims broadcast; with GQA the head axis (-3) groups instead."""
    if not enable_gqa:
        try:
            return tuple(np.broadcast_shapes(qs[:-2], ks[:-2], vs[:-2])), 1
        except ValueError:
            raise ValueError(f"leading (batch, head) dimensions of query {qs}, key {ks} and value {vs} do not "
                             "broadcast (grouped KV heads need enable_gqa=True)") from None
    for name, s in (("query", qs), ("key", ks), ("value", vs)):
        if len(s) < 3:
            raise ValueError(f"enable_gqa needs a head axis: {name} must be shaped (..., H, L, E); got {s}")
    Hq, Hk, Hv = qs[-3], ks[-3], vs[-3]
    if Hk != Hv:
        raise ValueError(f"key and value must have the same number of heads; got key {ks} (Hkv={Hk}) and "
                         f"value {vs} (Hkv={Hv})")
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"enable_gqa: query heads Hq={Hq} must be a multiple of key/value heads Hkv={Hk} "
                         f"(query {qs}, key {ks})")
    try:
        lead = tuple(np.broadcast_shapes(qs[:-3], ks[:-3], vs[:-3]))
    except ValueError:
        raise ValueError(f"batch dimensions of query {qs}, key {ks} and value {vs} do not broadcast") from None
    return lead + (Hq,), Hq // Hk


def _inputs(query, key, value) -> tuple:
    for name, x in (("query", query), ("key", key), ("value", value)):
        shape = getattr(x, "shape", None)
        if shape is None or len(shape) < 2:
            raise ValueError(f"{name} must be an array of rank >= 2 shaped (..., L, E); got shape {shape}")
        if not _is_floating(x):
            raise ValueError(f"{name} must have a floating dtype; got {_dtype_name(x)}")
    qs, ks, vs = tuple(query.shape), tuple(key.shape), tuple(value.shape)
    (Lq, E), (Lk, Ek), (Lkv, Ev) = qs[-2:], ks[-2:], vs[-2:]
    if E != Ek:
        raise ValueError(f"query and key must share the last dimension E; got query {qs} (E={E}) and key {ks} (E={Ek})")
    if Lk != Lkv:
        raise ValueError(f"key and value must have the same length Lk; got key {ks} (Lk={Lk}) and value {vs} (Lk={Lkv})")
    for dim_name, size in (("E (query.shape[-1])", E), ("Ev (value.shape[-1])", Ev)):
        if size == 0:
            raise ValueError(f"{dim_name} must be positive; got 0 (query {qs}, key {ks}, value {vs})")
    return qs, ks, vs, Lq, Lk, E, Ev


def _mask(mask, scores_shape):
    if mask is None:
        return None
    if not hasattr(mask, "shape"):
        raise ValueError(f"mask must be a boolean array broadcastable to (..., Lq, Lk); got {type(mask).__name__} "
                         f"{mask!r} (for a causal mask pass is_causal=True)")
    if _dtype_name(mask) != "bool":
        raise ValueError(f"mask must be boolean (True = takes part; a float mask is a bias); got dtype {_dtype_name(mask)}")
    if not F._broadcasts(mask.shape, scores_shape):
        raise ValueError(f"mask of shape {tuple(mask.shape)} is not broadcastable to (..., Lq, Lk) = {scores_shape}")
    return mask


def _scale(scale, E: int) -> float:
    if scale is None:
        return default_scale(E)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite positive number; got {scale!r}")
    return float(scale)


def validate(query, key, value, mask=None, is_causal=False, scale=None, **fields) -> Problem:
    """Check the arguments against the definition; raise ValueError naming the culprit.

    ``fields``: the optional fields of `specs.fields.FIELDS` (bias, enable_gqa, causal_alignment,
    window, softcap, q_lengths, kv_lengths, q_segment_ids, kv_segment_ids, alibi_slopes)."""
    unknown = sorted(set(fields) - set(F.NAMES))
    if unknown:
        raise ValueError(f"unknown problem field(s) {', '.join(unknown)}; the fields are {', '.join(F.NAMES)}")
    qs, ks, vs, Lq, Lk, E, Ev = _inputs(query, key, value)
    values = {**F.OFF, **fields}
    gqa = F.BY_NAME["enable_gqa"].check(values["enable_gqa"], None)
    batch_shape, group = _heads(qs, ks, vs, gqa)
    dims = F.Dims(tuple(batch_shape), Lq, Lk, qs, ks[-3] if len(ks) >= 3 else 1)
    mask = _mask(mask, dims.scores)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise ValueError(f"is_causal must be a bool; got {is_causal!r}")
    for f in F.FIELDS:
        if not f.is_off(values[f.name]) or f.name in ("enable_gqa", "causal_alignment"):
            values[f.name] = f.check(values[f.name], dims)
    F.check_pairs(values)
    return Problem(query, key, value, mask, bool(is_causal), _scale(scale, E), tuple(batch_shape), Lq, Lk, E, Ev,
                   group, values)


def visible(problem: Problem) -> np.ndarray:
    """Boolean (..., Lq, Lk): the pairs that take part (the mask, the causal triangle, and every field)."""
    p = problem
    shape = p.batch_shape + (p.Lq, p.Lk)
    vis = np.ones(shape, dtype=bool)  # (..., Lq, Lk)
    if p.mask is not None:
        vis = vis & np.asarray(p.mask, dtype=bool)
    if p.is_causal:
        vis = vis & causal_mask(p.Lq, p.Lk, p.causal_alignment, p.offsets)
    for f in F.FIELDS:
        value = p.fields[f.name]
        if f.keeps is not None and not f.is_off(value):
            vis = vis & f.keeps(value, p)
    return np.broadcast_to(vis, shape)
