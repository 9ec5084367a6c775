"""The attention problem: what the inputs are and which (query, key) pairs take part.

One composable definition, every field optional (`validate` names each):

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

Only NumPy (and objects exposing ``shape``/``dtype``) is used here.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

FLOAT_DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
# The optional fields beyond PyTorch's classic (mask, is_causal, scale), with their "off" values.
VARIANT_DEFAULTS = dict(bias=None, enable_gqa=False, causal_alignment="top_left", window=None, softcap=None,
                        q_lengths=None, kv_lengths=None, q_segment_ids=None, kv_segment_ids=None,
                        alibi_slopes=None)
# What a backend may declare it supports natively (backends.base.Capabilities.features).
FEATURES = ("gqa", "bias", "causal_bottom_right", "window", "seq_lengths", "segment_ids", "softcap", "alibi",
            "lse")
FEATURE_TEXT = {"gqa": "grouped KV heads (enable_gqa)", "bias": "an additive float bias",
                "causal_bottom_right": "bottom-right causal alignment", "window": "a sliding window",
                "seq_lengths": "per-sequence lengths (padding)", "segment_ids": "segment ids (packed sequences)",
                "softcap": "a softcap", "alibi": "ALiBi slopes", "lse": "returning the log-sum-exp"}


@dataclass(frozen=True)
class Problem:
    """A validated attention problem (arrays untouched; shapes and scale resolved)."""

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
    bias: np.ndarray | None = None
    enable_gqa: bool = False
    causal_alignment: str = "top_left"
    window: tuple | None = None          # (left, right), None entries unbounded
    softcap: float | None = None
    q_lengths: np.ndarray | None = None
    kv_lengths: np.ndarray | None = None
    q_segment_ids: np.ndarray | None = None
    kv_segment_ids: np.ndarray | None = None
    alibi_slopes: np.ndarray | None = None
    group: int = 1                      # query heads per KV head (1 without enable_gqa)

    @property
    def features(self) -> frozenset:
        """The optional features this problem uses (names from FEATURES; 'lse' is a call option)."""
        used = set()
        if self.enable_gqa and self.group > 1:
            used.add("gqa")
        if self.bias is not None:
            used.add("bias")
        if self.is_causal and self.causal_alignment == "bottom_right" and self.Lq != self.Lk:
            used.add("causal_bottom_right")
        for name, on in (("window", self.window is not None), ("softcap", self.softcap is not None),
                         ("seq_lengths", self.q_lengths is not None or self.kv_lengths is not None),
                         ("segment_ids", self.q_segment_ids is not None or self.kv_segment_ids is not None),
                         ("alibi", self.alibi_slopes is not None)):
            if on:
                used.add(name)
        return frozenset(used)

    def variant_fields(self) -> dict:
        """The optional fields that differ from their defaults (what to pass on to another call)."""
        return {name: getattr(self, name) for name, off in VARIANT_DEFAULTS.items()
                if not _same(getattr(self, name), off)}

    @property
    def offset(self) -> int:
        """Where query i's diagonal meets the keys: Lk - Lq bottom-right aligned, else 0."""
        return self.Lk - self.Lq if self.causal_alignment == "bottom_right" else 0

    @property
    def Hq(self) -> int:
        return self.batch_shape[-1] if self.batch_shape else 1


def _same(a, b) -> bool:
    return a is b or (not isinstance(a, np.ndarray) and a == b)


def _dtype_name(x) -> str:
    return str(getattr(x, "dtype", type(x).__name__)).replace("torch.", "")


def _is_floating(x) -> bool:
    name = _dtype_name(x)
    return name in FLOAT_DTYPE_NAMES or name.startswith("float")


def default_scale(E: int) -> float:
    """1/sqrt(E): the factor that brings Var(q.k) back to 1 for unit-variance inputs."""
    return 1.0 / math.sqrt(E)


def _broadcasts(shape, target) -> bool:
    try:
        return np.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except ValueError:
        return False


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


def _optional_float(name, x, lo_exclusive=0.0):
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x) or x <= lo_exclusive:
        raise ValueError(f"{name} must be a finite number > {lo_exclusive:g} (or None for off); got {x!r}")
    return float(x)


def _window(window):
    if window is None:
        return None
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(f"window must be (left, right) with ints >= 0 or None (unbounded); got {window!r}") from None
    out = []
    for side, w in (("left", left), ("right", right)):
        if w is None:
            out.append(None)
            continue
        if isinstance(w, bool) or not isinstance(w, numbers.Integral) or w < 0:
            raise ValueError(f"window {side} must be an int >= 0 or None (unbounded); got window={window!r}")
        out.append(int(w))
    return tuple(out)


def _int_array(name, x, target_shape, per):
    if x is None:
        return None
    shape = tuple(getattr(x, "shape", np.shape(x)))
    if not _dtype_name(x).startswith(("int", "uint")):
        raise ValueError(f"{name} must be an integer array; got dtype {_dtype_name(x)}")
    if not _broadcasts(shape, target_shape):
        raise ValueError(f"{name} of shape {shape} does not broadcast to {target_shape} ({per})")
    return np.asarray(x)


def validate(query, key, value, mask=None, is_causal=False, scale=None, *, bias=None, enable_gqa=False,
             causal_alignment="top_left", window=None, softcap=None, q_lengths=None, kv_lengths=None,
             q_segment_ids=None, kv_segment_ids=None, alibi_slopes=None) -> Problem:
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
    for dim_name, size in (("E (query.shape[-1])", E), ("Ev (value.shape[-1])", Ev)):
        if size == 0:
            raise ValueError(f"{dim_name} must be positive; got 0 (query {qs}, key {ks}, value {vs})")
    if not isinstance(enable_gqa, (bool, np.bool_)):
        raise ValueError(f"enable_gqa must be a bool; got {enable_gqa!r}")
    batch_shape, group = _heads(qs, ks, vs, bool(enable_gqa))
    scores_shape = batch_shape + (Lq, Lk)
    if mask is not None:
        if not hasattr(mask, "shape"):
            raise ValueError(f"mask must be a boolean array broadcastable to (..., Lq, Lk); got {type(mask).__name__} "
                             f"{mask!r} (for a causal mask pass is_causal=True)")
        mshape = tuple(getattr(mask, "shape", ()))
        if _dtype_name(mask) != "bool":
            raise ValueError(f"mask must be boolean (True = takes part; a float mask is a bias); "
                             f"got dtype {_dtype_name(mask)}")
        if not _broadcasts(mshape, scores_shape):
            raise ValueError(f"mask of shape {mshape} is not broadcastable to (..., Lq, Lk) = {scores_shape}")
    if bias is not None:
        bshape = tuple(getattr(bias, "shape", ()))
        if not _is_floating(bias):
            raise ValueError(f"bias must be a float array (added to the scaled scores; -inf = hidden); "
                             f"got dtype {_dtype_name(bias)}")
        if not _broadcasts(bshape, scores_shape):
            raise ValueError(f"bias of shape {bshape} is not broadcastable to (..., Hq, Lq, Lk) = {scores_shape}")
        b = np.asarray(bias, dtype=np.float64)
        if np.isnan(b).any() or np.isposinf(b).any():
            bad = "NaN" if np.isnan(b).any() else "+inf"
            at = tuple(int(i) for i in np.argwhere(np.isnan(b) | np.isposinf(b))[0])
            raise ValueError(f"bias must be finite or -inf (hidden); got {bad} at {at}")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise ValueError(f"is_causal must be a bool; got {is_causal!r}")
    if causal_alignment not in CAUSAL_ALIGNMENTS:
        raise ValueError(f"causal_alignment must be one of {CAUSAL_ALIGNMENTS}; got {causal_alignment!r}")
    if scale is None:
        scale = default_scale(E)
    else:
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale must be a finite positive number; got {scale!r}")
        scale = float(scale)
    softcap = _optional_float("softcap", softcap)
    window = _window(window)
    lead = batch_shape[:-1]  # per sequence: everything before the head axis
    for name, x in (("q_lengths", q_lengths), ("kv_lengths", kv_lengths), ("q_segment_ids", q_segment_ids),
                    ("kv_segment_ids", kv_segment_ids)):
        if x is not None and not batch_shape:
            raise ValueError(f"{name} needs inputs with a head axis, shaped (..., H, L, E); got query {qs}")
    q_lengths = _int_array("q_lengths", q_lengths, lead, "one length per batch element, before the head axis")
    kv_lengths = _int_array("kv_lengths", kv_lengths, lead, "one length per batch element, before the head axis")
    for name, lengths, L in (("q_lengths", q_lengths, Lq), ("kv_lengths", kv_lengths, Lk)):
        if lengths is not None and lengths.size and (lengths.min() < 0 or lengths.max() > L):
            raise ValueError(f"{name} must lie in [0, {L}]; got {lengths.tolist()}")
    q_segment_ids = _int_array("q_segment_ids", q_segment_ids, lead + (Lq,), "(..., Lq), one id per query")
    kv_segment_ids = _int_array("kv_segment_ids", kv_segment_ids, lead + (Lk,), "(..., Lk), one id per key")
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("q_segment_ids and kv_segment_ids go together; got only "
                         f"{'q_segment_ids' if kv_segment_ids is None else 'kv_segment_ids'}")
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, dtype=np.float64)
        Hq = batch_shape[-1] if batch_shape else 1
        if slopes.ndim != 1 or slopes.shape[0] != Hq:
            raise ValueError(f"alibi_slopes must have one slope per query head, shape ({Hq},); "
                             f"got shape {slopes.shape}")
        if not np.isfinite(slopes).all():
            raise ValueError(f"alibi_slopes must be finite; got {slopes.tolist()}")
        alibi_slopes = slopes
    return Problem(query, key, value, mask, bool(is_causal), scale, tuple(batch_shape), Lq, Lk, E, Ev,
                   bias, bool(enable_gqa), causal_alignment, window, softcap, q_lengths, kv_lengths,
                   q_segment_ids, kv_segment_ids, alibi_slopes, group)


# the pairs that take part: specs/masks.py (re-exported: everything imports them from here)
from attnspec.specs.masks import alibi_bias, alibi_slopes, causal_mask, padded_query_rows, visible, window_mask  # noqa: E402,F401
