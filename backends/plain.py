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
  ``return_lse``, ``sinks``, FA4's ``learnable_sink`` or vLLM's ``s_aux``) means that field.
- `declare(...)`, attached to the function: dtypes, gradients (a backward function), what it
  does with fully masked and padded rows, its causal alignment, effective precision, output
  dtypes, whether it takes a mask together with ``is_causal`` (PyTorch refuses: by default the
  triangle is folded into the mask instead), and the features it takes (overriding the signature).

A function may decline a problem by raising ``backends.base.Unsupported(reason)``: a skip with
its reason, never a failure.

``declare(framework="torch" | "jax", device=..., layout="BHLE" | "BLHE")`` makes it a function over
that framework's tensors on that device, in the dtype under test (bfloat16 too), rank 4 in the
declared layout; its backward is autograd / ``jax.vjp`` (backends/native_functions.py).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import numpy as np

from attnspec.backends.base import (
    CAUSAL_ALIGNMENTS,
    FULLY_MASKED_CHOICES,
    Backend,
    Capabilities,
    Deviation,
    Semantics,
    Unsupported,
)
from attnspec.backends.layout4d import LAYOUTS_4D, LSE_LAYOUTS
from attnspec.specs.fields import FEATURES, FIELDS
from attnspec.specs.fp8 import FP8_DTYPE_NAMES, is_fp8
from attnspec.specs.problem import FLOAT_DTYPE_NAMES

PLAIN_CALL = "fn(query, key, value, attn_mask=None, is_causal=False, scale=None)"
# parameter name -> the features it declares: a parameter named after a field of the problem
# (specs.fields) takes that field; PyTorch's enable_gqa also means float (additive) masks in
# attn_mask, as PyTorch's own function takes them (its bias); return_lse the log-sum-exp
_PARAM_FEATURES = {**{f.name: (f.feature,) for f in FIELDS if f.name != "bias"},
                   "enable_gqa": ("gqa", "bias"), "return_lse": ("lse",), "learnable_sink": ("sinks",),
                   "s_aux": ("sinks",), "k_scale": ("descale",), "v_scale": ("descale",)}
# a field a function may name otherwise: flash-attention 4 calls the sinks learnable_sink, vLLM's flash-attention
# fork s_aux (FlashInfer: sinks);
# FlashInfer's and vLLM's k_scale, v_scale multiply on dequantisation as FA3's k_descale, v_descale do
ALIASES = {"learnable_sink": "sinks", "s_aux": "sinks", "k_scale": "k_descale", "v_scale": "v_descale"}


def _full_descale(value, shape: tuple):
    """A per-head descale broadcast to (batch..., Hkv), contiguous, as the docstring promises and FA3 checks
    (a form that broadcasts to it, (B, 1) or (Hkv,), is what the spec takes); a scalar (per tensor) as it is."""
    if tuple(getattr(value, "shape", ())) in ((), tuple(shape)):
        return value
    if hasattr(value, "expand"):  # a torch tensor
        return value.expand(*shape).contiguous()
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(np.broadcast_to(value, shape))
    return value.__array_namespace__().broadcast_to(value, shape)  # a JAX array


def renamed(fn, kw: dict) -> dict:
    """The keywords under the names fn's signature uses (ALIASES)."""
    params = _parameters(fn) or {}
    for alias, name in ALIASES.items():
        if name in kw and alias in params and name not in params:
            kw[alias] = kw.pop(name)
    return kw
# a plain function works on NumPy arrays; fp8 ones are ml_dtypes' (JAX's dependency: NumPy has no fp8 type)
_NUMPY_DTYPES = ("float16", "float32", "float64") + FP8_DTYPE_NAMES
# framework -> (the dtypes it can be given, the default when none are declared, the devices it names)
FRAMEWORKS = {"numpy": (_NUMPY_DTYPES, ("float64", "float32"), ("cpu",)),
              "torch": (FLOAT_DTYPE_NAMES + FP8_DTYPE_NAMES, ("float16", "bfloat16", "float32"), ("cpu", "cuda")),
              "jax": (FLOAT_DTYPE_NAMES, ("float16", "bfloat16", "float32"), ("cpu", "gpu", "tpu"))}


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
    # the framework part (backends/native_functions.py): whose tensors, where, in which axis order
    framework: str = "numpy"
    device: str = "cpu"
    layout: str | None = None   # None: the problem's own (..., H, L, E); torch/jax: "BHLE" or "BLHE"
    lse_layout: str = "BHL"     # a returned log-sum-exp's axes (flash-attention's, in either layout)
    lse_padding: int | None = None  # its rows rounded up to a multiple of this (cut to Lq)
    env: tuple = ()             # environment variables its behaviour depends on (reproducers carry them)
    bias_gradient: bool = False  # torch/jax: the backward gives dBias too (autograd through the bias)
    lse_with_sinks: bool | None = None  # a returned LSE counts the sinks (FA4) or not (gpt-oss's Triton)
    limits: dict = field(default_factory=dict)  # the other declared shape limits: Capabilities' fields
    rejects_bad_indices: bool | None = None  # a varlen/kvcache function refuses bad index arguments
    fp8: dict = field(default_factory=dict)  # p_dtypes, descale_granularity, fp8_query (Semantics, Capabilities)


def declare(fn=None, *, dtypes=None, backward=None, fully_masked=None, padded_rows=None,
            causal_alignment=None, effective_precision=None, output_dtypes=None, mask_with_causal=False,
            masks=True, causal=True, features=None, notes=(), head_dim_multiple=1, deviations=None,
            framework="numpy", device="cpu", layout=None, lse_layout="BHL", lse_padding=None, env=(),
            bias_gradient=False, head_dims=(), max_head_dim=0, head_dim_power_of_two=False, length_multiple=1,
            max_length=0, causal_equal_lengths=False, op_dtypes=None, lse_with_sinks=None, rejects_bad_indices=None,
            p_dtypes=None, descale_granularity="head", fp8_query=None, paged_cache_views=True):
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

    framework: "numpy" (default), "torch" or "jax": the function then receives that framework's
    tensors on ``device`` (torch: cpu, cuda; jax: cpu, gpu, tpu), in the dtype under test (dtypes
    default float16, bfloat16, float32), rank 4 in ``layout`` ("BHLE" default, or "BLHE"); masks
    and biases (B, H, Lq, Lk).  Its backward is autograd / jax.vjp (``backward=False``: forward
    only).  lse_layout ("BHL" or "BLH") and lse_padding (an int m: the LSE's rows rounded up to a
    multiple of m, cut to Lq) say how a returned LSE is laid out.  env: names of environment
    variables the function depends on (``TRITON_INTERPRET``): reproducers record and restore them.
    bias_gradient: a torch/jax function's autograd gives the bias gradient too (checked then).
    lse_with_sinks: whether a returned LSE counts the sinks (FA4: True; gpt-oss's Triton kernel: False).
    rejects_bad_indices: a function with flash-attention's varlen/kvcache signature raises on index
    arguments outside its tensors (True: judged by properties/test_bad_indices.py).  paged_cache_views:
    a kvcache function takes its caches as strided views of larger storage (K and V halves of one pool,
    rows inside wider ones, a transposed storage, padded pages: backends/cache_views.py); False if it needs
    them contiguous (then never handed a view), or a tuple of the views it takes.
    With sinks a NumPy function's backward returns (dq, dk, dv, dsink).

    fp8 inputs (dtypes float8_e4m3fn, float8_e5m2; forward-only): a NumPy function gets ml_dtypes arrays,
    a torch one torch.float8_* tensors, and the descales (parameters q_descale, k_descale, v_descale, or
    FlashInfer's k_scale, v_scale) as float32 (B, Hkv).  p_dtypes: {fp8 input dtype: what P is rounded to
    before P V} ("float8_e4m3fn" as FA3 does, "float32" for not at all); output_dtypes says the output's
    (FA3: bfloat16); descale_granularity "tensor" for one descale a tensor (then a float32 scalar array);
    fp8_query: q's dtype when only K and V are fp8 (a 16-bit dtype).

    The shapes its kernel takes (the suite draws only those, and counts what a limit leaves out of a
    fixed grid): head_dims, a set of the head dims it takes; max_head_dim; head_dim_power_of_two;
    length_multiple, for Lq and Lk; max_length; causal_equal_lengths, causal only with Lq == Lk;
    op_dtypes, {"forward" or "forward_backward": dtypes} narrowing dtypes per op.  E.g. a Triton
    kernel: ``declare(max_head_dim=128, head_dim_power_of_two=True, dtypes=("float16",))``.
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"declare: framework must be one of {', '.join(FRAMEWORKS)}; got {framework!r}")
    allowed_dtypes, default_dtypes, devices = FRAMEWORKS[framework]
    dtypes = default_dtypes if dtypes is None else dtypes
    if device not in devices:
        raise ValueError(f"declare: device for framework {framework!r} must be one of {', '.join(devices)}; "
                         f"got {device!r}")
    native = framework != "numpy"
    if native:
        layout = "BHLE" if layout is None else layout
        if layout not in LAYOUTS_4D:
            raise ValueError(f"declare: layout must be one of {', '.join(LAYOUTS_4D)}; got {layout!r}")
        if backward not in (None, False):
            raise ValueError(f"declare: a {framework} function's backward is its autograd (backward=False: "
                             f"forward only); got {backward!r}")
    elif layout is not None or bias_gradient:
        raise ValueError(f"declare: {'layout' if layout is not None else 'bias_gradient'} needs framework='torch' "
                         f"or 'jax' (a NumPy function takes the problem's (..., H, L, E) and its backward "
                         f"returns (dq, dk, dv)); got {layout if layout is not None else bias_gradient!r}")
    if lse_layout not in LSE_LAYOUTS:
        raise ValueError(f"declare: lse_layout must be one of {', '.join(LSE_LAYOUTS)}; got {lse_layout!r}")
    if lse_padding is not None and (isinstance(lse_padding, bool) or not isinstance(lse_padding, int)
                                    or lse_padding < 1):
        raise ValueError(f"declare: lse_padding must be a positive int or None; got {lse_padding!r}")
    if isinstance(env, str) or not all(isinstance(e, str) and e for e in env):
        raise ValueError(f"declare: env must be a tuple of environment variable names; got {env!r}")
    for name, value, allowed in (("fully_masked", fully_masked, FULLY_MASKED_CHOICES),
                                 ("padded_rows", padded_rows, FULLY_MASKED_CHOICES),
                                 ("causal_alignment", causal_alignment, CAUSAL_ALIGNMENTS),
                                 ("effective_precision", effective_precision, FLOAT_DTYPE_NAMES)):
        if value is not None and value not in allowed:
            raise ValueError(f"declare: {name} must be one of {', '.join(allowed)}; got {value!r}")
    bad = [d for d in dtypes if d not in allowed_dtypes]
    if isinstance(dtypes, str) or not dtypes or bad:
        raise ValueError(f"declare: dtypes for framework {framework!r} must be a non-empty tuple of "
                         f"{', '.join(allowed_dtypes)}; got {dtypes!r}")
    unknown = [f for f in (features or ()) if f not in FEATURES]
    if unknown:
        raise ValueError(f"declare: unknown features {unknown}; known: {', '.join(FEATURES)}")
    if not native and backward is not None and not callable(backward):
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
                  op_dtypes=tuple((op, tuple(d)) for op, d in (op_dtypes or {}).items()),
                  paged_cache_views=paged_cache_views)
    try:
        Capabilities(dtypes=tuple(dtypes), descale_granularity=descale_granularity, fp8_query=fp8_query, **limits)
        Semantics(p_dtypes=tuple(sorted((p_dtypes or {}).items())))
    except (TypeError, ValueError) as e:
        raise ValueError(f"declare: {e}".replace("Capabilities.", "").replace("Semantics.", "")) from None
    pairs = tuple(sorted((output_dtypes or {}).items()))
    for src, dst in pairs:
        if src not in allowed_dtypes or dst not in allowed_dtypes + ("bfloat16",):  # NumPy: ml_dtypes' bfloat16
            raise ValueError(f"declare: output_dtypes maps dtype names of {framework}; got {src!r}: {dst!r}")
    decl = Declaration(tuple(dtypes), backward, fully_masked, padded_rows, causal_alignment, effective_precision,
                       pairs, bool(mask_with_causal), bool(masks), bool(causal),
                       None if features is None else tuple(features), tuple(notes), head_dim_multiple,
                       tuple(Deviation(prop, why) for prop, why in (deviations or {}).items()),
                       framework, device, layout, lse_layout, lse_padding, tuple(env), bool(bias_gradient),
                       None if lse_with_sinks is None else bool(lse_with_sinks), limits,
                       None if rejects_bad_indices is None else bool(rejects_bad_indices),
                       dict(p_dtypes=tuple(sorted((p_dtypes or {}).items())), descale_granularity=descale_granularity,
                            fp8_query=fp8_query))

    def attach(f):
        f.__attnspec__ = decl
        return f
    return attach if fn is None else attach(fn)


def numpy_arrays_hint(fn, error: Exception) -> str:
    """Why a plain function over NumPy arrays raised, when its error says it wanted another framework's
    tensors: a torch function plugged in without `declare(framework=...)` (a wrapper of
    F.scaled_dot_product_attention, flash-attn's own functions) fails so in every call of every property."""
    framework = (getattr(fn, "__attnspec__", None) or Declaration()).framework
    if framework == "numpy" and isinstance(error, (TypeError, AttributeError)) and "ndarray" in str(error):
        return ("a plain function is handed NumPy arrays unless it declares its framework: "
                "from attnspec import declare; declare(fn, framework='torch') or framework='jax'")
    return ""


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
    from attnspec.backends.flash_functions import flash_form
    if flash_form(fn):  # flash-attention's padded, varlen or kvcache signature: called that way
        return None
    try:
        inspect.signature(fn).bind(None, None, None, attn_mask=None, is_causal=False, scale=None)
    except TypeError as e:
        return f"function {getattr(fn, '__name__', fn)!r}{inspect.signature(fn)} cannot be called as {PLAIN_CALL} ({e})"
    return None


def declared(fn, decl: Declaration, gradients: bool, note: str) -> tuple:
    """(Capabilities, Semantics) of a function from what it declares (and its signature)."""
    features = frozenset(decl.features) if decl.features is not None else signature_features(fn)
    caps = Capabilities(dtypes=decl.dtypes, device=decl.device, gradients=gradients, features=features,
                        mask_with_causal=decl.mask_with_causal, masks=decl.masks, causal=decl.causal,
                        head_dim_multiple=decl.head_dim_multiple, **decl.limits,
                        bias_gradient=gradients and decl.bias_gradient and "bias" in features,
                        descale_granularity=decl.fp8.get("descale_granularity", "head"),
                        fp8_query=decl.fp8.get("fp8_query"))
    sem = Semantics(fully_masked=decl.fully_masked, causal_alignment=decl.causal_alignment,
                    effective_precision=decl.effective_precision, padded_rows=decl.padded_rows,
                    output_dtypes=decl.output_dtypes, deviations=decl.deviations, notes=decl.notes + (note,),
                    lse_with_sinks=decl.lse_with_sinks, rejects_bad_indices=decl.rejects_bad_indices,
                    p_dtypes=decl.fp8.get("p_dtypes", ()))
    return caps, sem


def function_backend(fn, name: str) -> Backend:
    """The backend of a plain function: over NumPy arrays, or its framework's tensors as it declares."""
    decl = getattr(fn, "__attnspec__", None) or Declaration()
    from attnspec.backends import flash_functions
    if flash_functions.flash_form(fn):  # flash_attn_func / _varlen_func / _with_kvcache: called that way
        return flash_functions.for_framework(decl.framework)(fn, name)
    if decl.framework == "numpy":
        return FunctionBackend(fn, name)
    from attnspec.backends import native_functions

    return native_functions.for_framework(decl.framework)(fn, name, decl)


class FunctionBackend(Backend):
    """A plain function with PyTorch's signature over NumPy arrays, with what it declares."""

    def __init__(self, fn, name: str):
        self.fn, self.name = fn, name
        decl = getattr(fn, "__attnspec__", None) or Declaration()
        self.declaration = decl
        self.env_vars = decl.env
        self.capabilities, self.semantics = declared(fn, decl, decl.backward is not None, "a plain function")

    def _kwargs(self, call, kv_lead: tuple | None = None) -> dict:
        attn_mask = call.mask
        if call.bias is not None:  # PyTorch's signature takes one mask: a float one when there is a bias
            bias = call.bias
            attn_mask = bias if attn_mask is None else np.where(attn_mask, bias, bias.dtype.type(-np.inf))
        kw = dict(attn_mask=attn_mask, is_causal=call.is_causal, scale=call.scale)
        feats = self.capabilities.features
        for f in FIELDS:  # the fields it declares through its parameters, when the problem uses them
            value = getattr(call, f.name)
            if f.name != "bias" and f.feature in feats and value is not None and not f.is_off(value):
                kw[f.name] = _full_descale(value, kv_lead) if f.feature == "descale" and kv_lead else value
        if call.return_lse:
            kw["return_lse"] = True
        kw = renamed(self.fn, kw)
        params = _parameters(self.fn)
        for name in ("q_descale", "k_descale", "v_descale"):  # a function may take some of the three only
            if name in kw and params is not None and name not in params and not any(
                    p.kind == p.VAR_KEYWORD for p in params.values()):
                raise Unsupported(f"{self.name} takes no {name} (its parameters: {', '.join(params)})")
        return kw

    def native_attention(self, q, k, v, call):
        return self.fn(q, k, v, **self._kwargs(call, tuple(k.shape[:-2])))  # (..., Lq, Ev), or (out, lse)

    def raise_hint(self, error: Exception) -> str:
        return numpy_arrays_hint(self.fn, error)

    def native_attention_backward(self, q, k, v, grad_out, call):
        if self.declaration.backward is None:
            raise Unsupported(f"{self.name} declares no backward")
        return self.declaration.backward(q, k, v, grad_out, **self._kwargs(call))

    def to_native(self, x, dtype):
        """NumPy arrays; fp8 (and a bfloat16 query beside fp8 K/V) as ml_dtypes' types."""
        if dtype in FP8_DTYPE_NAMES or (dtype == "bfloat16" and self.capabilities.fp8_query == "bfloat16"):
            try:
                import ml_dtypes
            except ImportError:
                raise Unsupported(f"{self.name}: {dtype} inputs need ml_dtypes (pip install ml_dtypes): "
                                  "NumPy has no such type") from None
            return x.astype(getattr(ml_dtypes, dtype))
        return Backend.to_native(self, x, dtype)  # also borrowed by FlashFunctionBackend

    def from_native(self, y):
        """NumPy; ml_dtypes' bfloat16 and fp8 results widened to float32 (exactly)."""
        y = np.asarray(y)
        return y.astype(np.float32) if is_fp8(str(y.dtype)) or str(y.dtype) == "bfloat16" else y

    def native_dtype(self, y):
        return str(np.asarray(y).dtype)
