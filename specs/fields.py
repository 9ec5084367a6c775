"""The problem's optional fields: one table, iterated by everything that handles a field.

Beyond PyTorch's classic ``(mask, is_causal, scale)`` a problem may carry each field below.
A row says what the field is called (the keyword of `specs.problem.validate`, of
``Backend.forward`` and of a backend's ``Call``), which feature a backend declares to take it
natively (``Capabilities.features``), its off value, how it is validated, which (query, key)
pairs it keeps - attention-gym's ``mask_mod`` idea: a predicate of the query and key index -
and how a backend's call carries it.  `specs.problem.validate` and `visible`, the backends'
``Call`` and their feature checks, a plain function's keywords, ``attnspec backends``, the
suite's draws and its reproducers iterate this table.

Adding a field: its row here (with where its values sit - ``axes`` - and whether it is
positional: permuting and cutting a case, the draws' feature choice and the compiled-config
table follow from the row); its arithmetic in `specs/reference.py` when it changes the scores
(a field that only hides pairs needs nothing there); its draw (`properties/variants.py`) and its
property (`properties/test_<family>.py`); the adapters that take it natively.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from attnspec.specs.masks import CAUSAL_ALIGNMENTS, POSITIONS, normalize_window, offset, sequence_offsets, window_mask


class Dims(NamedTuple):
    """What a field is validated against."""

    batch_shape: tuple  # leading dims of the output, ending with Hq when the inputs have a head axis
    Lq: int
    Lk: int
    query_shape: tuple
    kv_heads: int = 1   # Hkv: key's head axis (-3), 1 without one

    @property
    def lead(self) -> tuple:
        """Per sequence: everything before the head axis."""
        return self.batch_shape[:-1]

    @property
    def Hq(self) -> int:
        return self.batch_shape[-1] if self.batch_shape else 1

    @property
    def scores(self) -> tuple:
        return self.batch_shape + (self.Lq, self.Lk)


@dataclass(frozen=True)
class Field:
    name: str          # keyword of validate, Backend.forward and Call
    feature: str       # what a backend declares to take it natively (Capabilities.features)
    off: object        # the value meaning "not used"
    cast: str          # how Call carries it: "value" as is; "input" the input dtype; "int32";
    #                    "wide" float64 for float64 input, else float32 (ALiBi's 2^-0.5 is no float32)
    text: str          # the feature in words
    check: Callable    # (value, Dims) -> the value validated; ValueError naming the field
    keeps: Callable | None = None  # (value, problem) -> bool broadcastable to (..., Lq, Lk): pairs kept
    uses: Callable | None = None   # (value, problem) -> whether the problem uses the feature (default: not off)
    # Where its values sit, as (side, array axis) pairs: permuting or cutting the queries ("query")
    # or the keys ("key") moves or cuts the field along that axis too.  () : no axis of its own
    # (a flag, a per-head or per-sequence value).
    axes: tuple = ()
    positional: bool = False  # its pairs depend on where a query or key sits (no permutation keeps it)
    diagonal: bool = False    # measured from the diagonal: the causal alignment moves it (window, ALiBi)
    drawn: bool = True        # drawn on its own at the draw rate (False: drawn with the fields it modifies)
    in_shape: bool = False    # changes the drawn shape (grouped heads): a column of its own in the draws
    per_sequence: bool = False  # a value per batch element (before the head axis): drawn on a batch of 2+

    def is_off(self, value) -> bool:
        """Whether value is the field's off value (arrays never are)."""
        return value is self.off or (not isinstance(value, np.ndarray) and value == self.off)

    def used(self, value, problem) -> bool:
        if self.uses is not None:
            return bool(self.uses(value, problem))
        return not self.is_off(value)

    def axis_of(self, side: str) -> int | None:
        """The array axis of the field on that side ("query" or "key"), or None."""
        return dict(self.axes).get(side)


def _dtype_name(x) -> str:
    return str(getattr(x, "dtype", type(x).__name__)).replace("torch.", "")


def _broadcasts(shape, target) -> bool:
    try:
        return np.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except ValueError:
        return False


# ---- validation ---------------------------------------------------------------------------

def _bias(bias, d: Dims):
    shape = tuple(getattr(bias, "shape", ()))
    name = _dtype_name(bias)
    if not (name.startswith("float") or name == "bfloat16"):
        raise ValueError(f"bias must be a float array (added to the scaled scores; -inf = hidden); got dtype {name}")
    if not _broadcasts(shape, d.scores):
        raise ValueError(f"bias of shape {shape} is not broadcastable to (..., Hq, Lq, Lk) = {d.scores}")
    b = np.asarray(bias, dtype=np.float64)
    bad = np.isnan(b) | np.isposinf(b)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"bias must be finite or -inf (hidden); got {'NaN' if np.isnan(b[at]) else '+inf'} at {at}")
    return bias


def _flag(name):
    def check(value, d: Dims):
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name} must be a bool; got {value!r}")
        return bool(value)
    return check


def _alignment(value, d: Dims):
    if value not in CAUSAL_ALIGNMENTS:
        raise ValueError(f"causal_alignment must be one of {CAUSAL_ALIGNMENTS}; got {value!r}")
    return value


def _positions(value, d: Dims):
    if value not in POSITIONS:
        raise ValueError(f"positions must be one of {POSITIONS}; got {value!r}")
    if value == "per_sequence" and not d.batch_shape:
        raise ValueError(f"positions='per_sequence' needs inputs with a head axis, shaped (..., H, L, E); "
                         f"got query {d.query_shape}")
    return value


def _window(value, d: Dims):
    return normalize_window(value)


def _softcap(value, d: Dims):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"softcap must be a finite number > 0 (or None for off); got {value!r}")
    return float(value)


def _ints(name: str, per: str, extra: Callable[[Dims], tuple], limit: Callable[[Dims], int] | None = None):
    """An integer array broadcastable to (lead..., *extra) - one value per sequence (and position)."""
    def check(value, d: Dims):
        if not d.batch_shape:
            raise ValueError(f"{name} needs inputs with a head axis, shaped (..., H, L, E); got query {d.query_shape}")
        shape = tuple(getattr(value, "shape", np.shape(value)))
        if not _dtype_name(value).startswith(("int", "uint")):
            raise ValueError(f"{name} must be an integer array; got dtype {_dtype_name(value)}")
        target = d.lead + extra(d)
        if not _broadcasts(shape, target):
            raise ValueError(f"{name} of shape {shape} does not broadcast to {target} ({per})")
        arr = np.asarray(value)
        if limit is not None and arr.size and (arr.min() < 0 or arr.max() > limit(d)):
            raise ValueError(f"{name} must lie in [0, {limit(d)}]; got {arr.tolist()}")
        return arr
    return check


def _sinks(value, d: Dims):
    if not d.batch_shape:
        raise ValueError(f"sinks needs inputs with a head axis, shaped (..., H, L, E); got query {d.query_shape}")
    name = _dtype_name(value)
    if not (name.startswith("float") or name == "bfloat16"):
        raise ValueError(f"sinks must be a float array, one logit per query head; got dtype {name}")
    sinks = np.asarray(value, dtype=np.float64)
    if sinks.ndim != 1 or sinks.shape[0] != d.Hq:
        raise ValueError(f"sinks must have one logit per query head, shape ({d.Hq},); got shape {sinks.shape}")
    bad = np.isnan(sinks) | np.isposinf(sinks)
    if bad.any():
        raise ValueError(f"sinks must be finite or -inf (no sink); got {sinks.tolist()}")
    return sinks


def _descale(name: str):
    """A descale (issue 31, fp8 inputs): x = x_fp8 * descale, one positive float per (batch, KV head)
    broadcastable to (lead..., Hkv) - FA3/FA4 and PyTorch's (B, Hkv); a scalar is one per tensor."""
    def check(value, d: Dims):
        if not d.batch_shape:
            raise ValueError(f"{name} needs inputs with a head axis, shaped (..., H, L, E); got query {d.query_shape}")
        dtype = _dtype_name(value)
        if not (dtype.startswith("float") or dtype == "bfloat16"):
            raise ValueError(f"{name} must be a float array (x = x_fp8 * {name}); got dtype {dtype}")
        shape = tuple(getattr(value, "shape", np.shape(value)))
        target = d.lead + (d.kv_heads,)
        if not _broadcasts(shape, target):
            raise ValueError(f"{name} of shape {shape} does not broadcast to (batch..., Hkv) = {target} "
                             "(one per batch element and KV head; query heads share their KV head's)")
        x = np.asarray(value, dtype=np.float64)
        if not (np.isfinite(x) & (x > 0)).all():
            raise ValueError(f"{name} must be finite and > 0; got {x.ravel()[:8].tolist()}")
        return value
    return check


def _slopes(value, d: Dims):
    slopes = np.asarray(value, dtype=np.float64)
    if slopes.ndim != 1 or slopes.shape[0] != d.Hq:
        raise ValueError(f"alibi_slopes must have one slope per query head, shape ({d.Hq},); got shape {slopes.shape}")
    if not np.isfinite(slopes).all():
        raise ValueError(f"alibi_slopes must be finite; got {slopes.tolist()}")
    return slopes


# ---- the pairs each field keeps (i: query index, j: key index) ---------------------------------

def _per_sequence(x) -> np.ndarray:
    return np.asarray(x)[..., None, None, None]  # (lead..., 1, 1, 1): over heads, queries, keys


def _keeps_bias(bias, p):
    return ~np.isneginf(np.asarray(bias, dtype=np.float64))  # -inf hides


def offsets_of(p):
    """Per-sequence diagonal offsets (lead...,) when positions are per sequence, else None (the global
    `offset`): what the causal triangle, the window and ALiBi are measured from (`masks.sequence_offsets`)."""
    if p.fields["positions"] != "per_sequence":
        return None
    o = sequence_offsets(p.Lq, p.Lk, p.causal_alignment, p.fields["q_lengths"], p.fields["kv_lengths"],
                         p.fields["kv_starts"])
    return np.broadcast_to(o, p.batch_shape[:-1])  # (lead...,)


def _keeps_window(window, p):
    return window_mask(p.Lq, p.Lk, window, p.causal_alignment, offsets_of(p))  # (Lq, Lk) or (lead..., 1, Lq, Lk)


def _keeps_kv_starts(kv_starts, p):
    return np.arange(p.Lk)[None, :] >= _per_sequence(kv_starts)  # (lead..., 1, 1, Lk): left padding hidden


def _keeps_q_lengths(q_lengths, p):
    return np.arange(p.Lq)[:, None] < _per_sequence(q_lengths)  # (lead..., 1, Lq, 1): padded rows see nothing


def _keeps_kv_lengths(kv_lengths, p):
    return np.arange(p.Lk)[None, :] < _per_sequence(kv_lengths)  # (lead..., 1, 1, Lk)


def _keeps_segments(q_ids, p):
    qs = np.asarray(q_ids)[..., None, :, None]  # (lead..., 1, Lq, 1)
    ks = np.asarray(p.kv_segment_ids)[..., None, None, :]  # (lead..., 1, 1, Lk)
    return qs == ks


def _uses_bottom_right(alignment, p) -> bool:
    per_sequence = p.fields["positions"] == "per_sequence"  # sequences' own lengths differ: it matters
    return alignment == "bottom_right" and (p.Lq != p.Lk or per_sequence) and on_diagonal(p)


_PAIR = (("query", -2), ("key", -1))  # (..., Lq, Lk)
FIELDS = (
    Field("bias", "bias", None, "input", "an additive float bias", _bias, keeps=_keeps_bias, axes=_PAIR),
    Field("enable_gqa", "gqa", False, "value", "grouped KV heads (enable_gqa)", _flag("enable_gqa"),
          uses=lambda on, p: on and p.group > 1, in_shape=True),
    Field("causal_alignment", "causal_bottom_right", "top_left", "value", "bottom-right causal alignment",
          _alignment, uses=_uses_bottom_right, drawn=False),
    Field("window", "window", None, "value", "a sliding window", _window, keeps=_keeps_window,
          positional=True, diagonal=True),
    Field("softcap", "softcap", None, "value", "a softcap", _softcap),
    Field("q_lengths", "seq_lengths", None, "int32", "per-sequence lengths (padding)",
          _ints("q_lengths", "one length per batch element, before the head axis", lambda d: (), lambda d: d.Lq),
          keeps=_keeps_q_lengths, positional=True, per_sequence=True),
    Field("kv_lengths", "seq_lengths", None, "int32", "per-sequence lengths (padding)",
          _ints("kv_lengths", "one length per batch element, before the head axis", lambda d: (), lambda d: d.Lk),
          keeps=_keeps_kv_lengths, positional=True, per_sequence=True),
    # issue 30: positions per sequence (the anchors' varlen and KV-cache alignment) and left padding.
    # Not drawn by the default draws (drawn=False, so their byte layout and kill rates stay as they
    # were): properties/test_packed.py and test_paged.py draw them for the backends that declare them,
    # on the batches the per-sequence lengths they need are drawn on (hence per_sequence=False here).
    Field("positions", "seq_positions", "global", "value",
          "per-sequence positions (causal, window, ALiBi per sequence; left padding)", _positions,
          positional=True, drawn=False),
    Field("kv_starts", "seq_positions", None, "int32",
          "per-sequence positions (causal, window, ALiBi per sequence; left padding)",
          _ints("kv_starts", "one start per batch element, before the head axis", lambda d: (), lambda d: d.Lk),
          keeps=_keeps_kv_starts, positional=True, drawn=False),
    Field("q_segment_ids", "segment_ids", None, "int32", "segment ids (packed sequences)",
          _ints("q_segment_ids", "(..., Lq), one id per query", lambda d: (d.Lq,)), keeps=_keeps_segments,
          axes=(("query", -1),), per_sequence=True),
    Field("kv_segment_ids", "segment_ids", None, "int32", "segment ids (packed sequences)",
          _ints("kv_segment_ids", "(..., Lk), one id per key", lambda d: (d.Lk,)), axes=(("key", -1),),
          per_sequence=True),
    Field("alibi_slopes", "alibi", None, "wide", "ALiBi slopes", _slopes, positional=True, diagonal=True),
    # issue 31: a per-query-head logit s_h in every row's denominator (gpt-oss; FA4 `learnable_sink`,
    # FlashInfer `sinks`): a virtual key of value 0 that no scale, cap, bias or mask touches.  Not drawn
    # by the default draws (drawn=False: their layout and kill rates stay); properties/test_sinks.py
    # draws it for the backends that declare it.
    Field("sinks", "sinks", None, "wide", "attention sinks (a per-head logit in the denominator)", _sinks,
          drawn=False),
    # issue 31: fp8 inputs come with descales, x = x_fp8 * descale per (batch, KV head) (FA3/FA4's
    # q_descale, k_descale, v_descale; FlashInfer's k_scale, v_scale).  Cast "wide": float32 as FA3 takes
    # them.  Not drawn by the default draws: the fp8 draw (properties/draws.py) gives every fp8 case its
    # descales; a float problem may carry them too (the reference dequantises either way).
    *(Field(f"{x}_descale", "descale", None, "wide", "descale factors (x = x_fp8 * descale, per KV head)",
            _descale(f"{x}_descale"), drawn=False) for x in "qkv"),
)
BY_NAME = {f.name: f for f in FIELDS}
NAMES = tuple(BY_NAME)
OFF = {f.name: f.off for f in FIELDS}
# fields that go together: one without the other is an error
PAIRS = (("q_segment_ids", "kv_segment_ids"),)

# What a backend may declare it takes natively: every field's feature, and returning the LSE
# (a call option, not a field).
FEATURES = tuple(dict.fromkeys(f.feature for f in FIELDS)) + ("lse",)
FEATURE_TEXT = {**{f.feature: f.text for f in reversed(FIELDS)}, "lse": "returning the log-sum-exp"}
FIELDS_OF = {feature: tuple(f.name for f in FIELDS if f.feature == feature) for feature in FEATURES}
# What an adapter implementing the whole definition declares - but per-sequence positions (issue 30),
# attention sinks and fp8 descales (issue 31), which each adapter declares on its own once it implements them
SERVING_FEATURES = frozenset({"seq_positions", "sinks", "descale"})
EVERY_FEATURE = frozenset(FEATURES) - SERVING_FEATURES


def _features(test) -> tuple:
    return tuple(dict.fromkeys(f.feature for f in FIELDS if test(f)))


# features whose pairs depend on where a query or key sits: no permutation keeps them
POSITIONAL = frozenset(_features(lambda f: f.positional))
# features measured from the diagonal: the causal alignment moves them (drawn with them)
DIAGONAL = frozenset(_features(lambda f: f.diagonal))
# features the draws choose on their own, each at their rate, in the table's order
DRAWN = _features(lambda f: f.drawn)
# features that change the drawn shape (grouped heads)
IN_SHAPE = frozenset(_features(lambda f: f.in_shape))
# features that are one value per sequence (before the head axis): drawn on a batch of two or more
# so a kernel reading the first sequence's value for all fails
PER_SEQUENCE = frozenset(_features(lambda f: f.per_sequence))


def check_pairs(values: dict) -> None:
    for a, b in PAIRS:
        if (values[a] is None) != (values[b] is None):
            raise ValueError(f"{a} and {b} go together; got only {a if values[b] is None else b}")
    starts = values["kv_starts"]
    if starts is not None:
        if values["positions"] != "per_sequence":
            raise ValueError("kv_starts counts key positions from each sequence's start: it needs "
                             f"positions='per_sequence'; got positions={values['positions']!r}")
        ends = values["kv_lengths"]
        if ends is not None and (np.asarray(starts) > np.asarray(ends)).any():
            raise ValueError(f"kv_starts must not exceed kv_lengths (a sequence's keys are [kv_starts, kv_lengths)); "
                             f"got kv_starts={np.asarray(starts).tolist()}, kv_lengths={np.asarray(ends).tolist()}")


def is_off(name: str, value) -> bool:
    """Whether value is field `name`'s off value."""
    return BY_NAME[name].is_off(value)


def on_diagonal(problem) -> bool:
    """Whether the problem's pairs depend on where the diagonal lies (causal, window, ALiBi): then the
    causal alignment matters when Lq != Lk."""
    return problem.is_causal or any(f.diagonal and not f.is_off(problem.fields[f.name]) for f in FIELDS)


def along(fields: dict, side: str, take) -> dict:
    """The fields that have an axis on `side`, each as take(value, axis); broadcast axes (size 1) stay."""
    out = {}
    for name, value in fields.items():
        axis = BY_NAME[name].axis_of(side)
        if axis is not None and isinstance(value, np.ndarray) and value.ndim >= -axis and value.shape[axis] > 1:
            out[name] = take(value, axis)
    return out


__all__ = ["CAUSAL_ALIGNMENTS", "DIAGONAL", "DRAWN", "Dims", "EVERY_FEATURE", "FEATURES", "FEATURE_TEXT", "FIELDS",
           "FIELDS_OF", "Field", "IN_SHAPE", "NAMES", "OFF", "PER_SEQUENCE", "POSITIONAL", "BY_NAME", "SERVING_FEATURES",
           "along", "check_pairs", "is_off", "offset", "offsets_of", "on_diagonal"]
