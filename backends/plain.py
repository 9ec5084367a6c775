"""Plain functions as backends: PyTorch's signature over NumPy arrays, plus optional declarations.

A function is called as PyTorch's ``F.scaled_dot_product_attention`` would be::

    fn(query, key, value, attn_mask=None, is_causal=False, scale=None)           # classic
    fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,       # full signature
       scale=None, enable_gqa=False)

What it is given follows what it declares, never more:
- its signature: ``enable_gqa`` (PyTorch's full signature) means grouped KV heads *and* float
  (additive) masks in ``attn_mask``, as PyTorch's own function takes them; a parameter named
  after another field (``softcap``, ``window``, ``q_lengths``/``kv_lengths``,
  ``q_segment_ids``/``kv_segment_ids``, ``alibi_slopes``, ``causal_alignment``,
  ``return_lse``) means that field.
- `declare(...)`, attached to the function: dtypes, gradients (a backward function), what it
  does with fully masked and padded rows, its causal alignment, effective precision, output
  dtypes, whether it takes a mask together with ``is_causal`` (PyTorch refuses: by default the
  triangle is folded into the mask instead), and the features it takes (overriding the signature).

A function may decline a problem by raising ``backends.base.Unsupported(reason)``: a skip with
its reason, never a failure.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import numpy as np

from attnspec.backends.base import (CAUSAL_ALIGNMENTS, FULLY_MASKED_CHOICES, Backend, Capabilities, Deviation, Semantics,
                   Unsupported)
from attnspec.specs.fields import FEATURES, FIELDS
from attnspec.specs.problem import FLOAT_DTYPE_NAMES

PLAIN_CALL = "fn(query, key, value, attn_mask=None, is_causal=False, scale=None)"
# parameter name -> the features it declares: a parameter named after a field of the problem
# (specs.fields) takes that field; PyTorch's enable_gqa also means float (additive) masks in
# attn_mask, as PyTorch's own function takes them (its bias); return_lse the log-sum-exp
_PARAM_FEATURES = {**{f.name: (f.feature,) for f in FIELDS if f.name != "bias"},
                   "enable_gqa": ("gqa", "bias"), "return_lse": ("lse",)}
_NUMPY_DTYPES = ("float16", "float32", "float64")  # a plain function works on NumPy arrays


@dataclass(frozen=True)
class Declaration:
    """What a plain function declares (see `declare`); None = not declared."""

    dtypes: tuple = ("float64", "float32")
    backward: object = None
    fully_masked: str | None = None
    padded_rows: str | None = None
    causal_alignment: str | None = None
    effective_precision: str | None = None
    output_dtypes: tuple = ()
    mask_with_causal: bool = False
    masks: bool = True   # takes a boolean attn_mask at all
    causal: bool = True  # has is_causal at all
    features: tuple | None = None  # None: read them off the signature
    notes: tuple = field(default_factory=tuple)
    head_dim_multiple: int = 1  # E and Ev must be multiples of it (a kernel's tile width)
    deviations: tuple = ()      # Deviation(property, why): known departures, reported as such
    limits: dict = field(default_factory=dict)  # the other declared shape limits: Capabilities' fields


def declare(fn=None, *, dtypes=("float64", "float32"), backward=None, fully_masked=None, padded_rows=None,
            causal_alignment=None, effective_precision=None, output_dtypes=None, mask_with_causal=False,
            masks=True, causal=True, features=None, notes=(), head_dim_multiple=1, deviations=None,
            head_dims=(), max_head_dim=0, head_dim_power_of_two=False, length_multiple=1, max_length=0,
            causal_equal_lengths=False, op_dtypes=None):
    """Attach declarations to a plain function; usable as ``@declare(...)`` or ``declare(fn, ...)``.

    dtypes: among float16, float32, float64 (NumPy has no bfloat16).  backward: a function
    ``bwd(query, key, value, grad_out, attn_mask=None, is_causal=False, scale=None) -> (dq, dk, dv)``
    called with the same keywords as the forward.  fully_masked / padded_rows: zeros, nan,
    mean_of_values or error.  causal_alignment: what ``is_causal=True`` does when Lq != Lk,
    top_left or bottom_right.  effective_precision: a dtype name when results are only that
    accurate (e.g. float32 inside).  output_dtypes: {input dtype: output dtype} for results that
    come back in another dtype by policy.  mask_with_causal: it takes ``attn_mask`` together
    with ``is_causal=True``.  masks / causal: False when it takes no boolean mask / has no causal
    mode (the suite then never sends one).  features: names from specs.fields.FEATURES.
    head_dim_multiple: the head dims E and Ev it takes are multiples of this (a kernel's tile width;
    the suite draws only those).  deviations: {property name: why} for known departures (an
    upstream bug, a documented limit): where that property fails the result is `deviation`.

    The shapes its kernel takes (the suite draws only those, and counts what a limit leaves out of a
    fixed grid): head_dims, a set of the head dims it takes; max_head_dim; head_dim_power_of_two;
    length_multiple, for Lq and Lk; max_length; causal_equal_lengths, causal only with Lq == Lk;
    op_dtypes, {"forward" or "forward_backward": dtypes} narrowing dtypes per op.  E.g. a Triton
    kernel: ``declare(max_head_dim=128, head_dim_power_of_two=True, dtypes=("float16",))``.
    """
    for name, value, allowed in (("fully_masked", fully_masked, FULLY_MASKED_CHOICES),
                                 ("padded_rows", padded_rows, FULLY_MASKED_CHOICES),
                                 ("causal_alignment", causal_alignment, CAUSAL_ALIGNMENTS),
                                 ("effective_precision", effective_precision, FLOAT_DTYPE_NAMES)):
        if value is not None and value not in allowed:
            raise ValueError(f"declare: {name} must be one of {', '.join(allowed)}; got {value!r}")
    bad = [d for d in dtypes if d not in _NUMPY_DTYPES]
    if isinstance(dtypes, str) or not dtypes or bad:
        raise ValueError(f"declare: dtypes must be a non-empty tuple of {', '.join(_NUMPY_DTYPES)}; got {dtypes!r}")
    unknown = [f for f in (features or ()) if f not in FEATURES]
    if unknown:
        raise ValueError(f"declare: unknown features {unknown}; known: {', '.join(FEATURES)}")
    if backward is not None and not callable(backward):
        raise ValueError(f"declare: backward must be a function; got {type(backward).__name__}")
    if isinstance(head_dim_multiple, bool) or not isinstance(head_dim_multiple, int) or head_dim_multiple < 1:
        raise ValueError(f"declare: head_dim_multiple must be a positive int; got {head_dim_multiple!r}")
    if not isinstance(deviations or {}, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in (deviations or {}).items()):
        raise ValueError(f"declare: deviations must map property names to the reason, both non-empty strings; "
                         f"got {deviations!r}")
    limits = dict(head_dims=tuple(head_dims), max_head_dim=max_head_dim,
                  head_dim_power_of_two=bool(head_dim_power_of_two), length_multiple=length_multiple,
                  max_length=max_length, causal_equal_lengths=bool(causal_equal_lengths),
                  op_dtypes=tuple((op, tuple(d)) for op, d in (op_dtypes or {}).items()))
    try:
        Capabilities(dtypes=tuple(dtypes), **limits)
    except (TypeError, ValueError) as e:
        raise ValueError(f"declare: {e}".replace("Capabilities.", "")) from None
    pairs = tuple(sorted((output_dtypes or {}).items()))
    for src, dst in pairs:
        if src not in _NUMPY_DTYPES or dst not in _NUMPY_DTYPES:
            raise ValueError(f"declare: output_dtypes maps NumPy dtype names; got {src!r}: {dst!r}")
    decl = Declaration(tuple(dtypes), backward, fully_masked, padded_rows, causal_alignment, effective_precision,
                       pairs, bool(mask_with_causal), bool(masks), bool(causal),
                       None if features is None else tuple(features), tuple(notes), head_dim_multiple,
                       tuple(Deviation(prop, why) for prop, why in (deviations or {}).items()), limits)

    def attach(f):
        f.__attnspec__ = decl
        return f
    return attach if fn is None else attach(fn)


def _parameters(fn) -> dict | None:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None  # a builtin or C function: nothing to inspect


def signature_features(fn) -> frozenset:
    params = _parameters(fn) or {}
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return frozenset(f for n in named for f in _PARAM_FEATURES.get(n, ()))


def check_plain_call(fn, name: str) -> str | None:
    """None when fn can be called as PLAIN_CALL, else why not."""
    params = _parameters(fn)
    if params is None:
        return None
    try:
        inspect.signature(fn).bind(None, None, None, attn_mask=None, is_causal=False, scale=None)
    except TypeError as e:
        return f"function {getattr(fn, '__name__', fn)!r}{inspect.signature(fn)} cannot be called as {PLAIN_CALL} ({e})"
    return None


class FunctionBackend(Backend):
    """A plain function with PyTorch's signature over NumPy arrays, with what it declares."""

    def __init__(self, fn, name: str):
        self.fn, self.name = fn, name
        decl = getattr(fn, "__attnspec__", None) or Declaration()
        self.declaration = decl
        features = frozenset(decl.features) if decl.features is not None else signature_features(fn)
        self.capabilities = Capabilities(dtypes=decl.dtypes, device="cpu", gradients=decl.backward is not None,
                                         features=features, mask_with_causal=decl.mask_with_causal,
                                         masks=decl.masks, causal=decl.causal,
                                         head_dim_multiple=decl.head_dim_multiple, **decl.limits)
        self.semantics = Semantics(fully_masked=decl.fully_masked, causal_alignment=decl.causal_alignment,
                                   effective_precision=decl.effective_precision, padded_rows=decl.padded_rows,
                                   output_dtypes=decl.output_dtypes, deviations=decl.deviations,
                                   notes=decl.notes + ("a plain function",))

    def _kwargs(self, call) -> dict:
        attn_mask = call.mask
        if call.bias is not None:  # PyTorch's signature takes one mask: a float one when there is a bias
            bias = call.bias
            attn_mask = bias if attn_mask is None else np.where(attn_mask, bias, bias.dtype.type(-np.inf))
        kw = dict(attn_mask=attn_mask, is_causal=call.is_causal, scale=call.scale)
        feats = self.capabilities.features
        for f in FIELDS:  # the fields it declares through its parameters, when the problem uses them
            value = getattr(call, f.name)
            if f.name != "bias" and f.feature in feats and value is not None and not f.is_off(value):
                kw[f.name] = value
        if call.return_lse:
            kw["return_lse"] = True
        return kw

    def native_attention(self, q, k, v, call):
        return self.fn(q, k, v, **self._kwargs(call))  # (..., Lq, Ev), or (out, lse)

    def native_attention_backward(self, q, k, v, grad_out, call):
        if self.declaration.backward is None:
            raise Unsupported(f"{self.name} declares no backward")
        return self.declaration.backward(q, k, v, grad_out, **self._kwargs(call))

    def native_dtype(self, y):
        return str(np.asarray(y).dtype)
