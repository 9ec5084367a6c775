"""The Backend interface: what the suite judges and the benchmarks time.

An adapter subclasses `Backend` and implements a few small hooks over *native* values:
``load`` (import the framework, check device), ``to_native``, ``from_native``, and the call:

- the classic hooks ``native_forward(q, k, v, mask, is_causal, scale)`` and optionally
  ``native_backward(q, k, v, grad_out, mask, is_causal, scale)``: PyTorch's classic signature;
  enough for a backend that declares no optional feature;
- or ``native_attention(q, k, v, call)`` and ``native_attention_backward(q, k, v, grad_out, call)``,
  where ``call`` (a `Call`) carries every field of the problem (bias, grouped heads, causal
  alignment, window, lengths, segments, softcap, ALiBi slopes, whether to return the LSE) as
  native values.  Their default implementations call the classic hooks.

A backend receives only what it declares (`Capabilities.features`, names from
`specs.problem.FEATURES`); anything else is `Unsupported` with its reason - never emulated.
``sync`` waits for the device.  The public methods (`forward`, `backward`, `prepare`) do
validation, conversion and checking once, here, so every adapter stays a screen long.
Importing this module loads no framework.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.specs.fields import CAUSAL_ALIGNMENTS, FEATURE_TEXT, FEATURES, FIELDS, on_diagonal
from attnspec.specs.fp8 import is_fp8
from attnspec.specs.problem import causal_mask, validate  # the definition; never the reference


class Unsupported(Exception):
    """A combination the backend declares it does not support (a skip, with its reason)."""


class BackendUnavailable(Unsupported):
    """The framework or device is missing (a skip, with its reason)."""


class BackendFailure(AssertionError):
    """The backend misbehaved: raised, or returned the wrong shape or dtype."""

    def __init__(self, backend: str, what: str):
        super().__init__(f"backend {backend!r}: {what}")
        self.backend = backend
        self.what = what


# the declarations live in backends/declarations.py; everything imports them from here too
from attnspec.backends.declarations import (  # noqa: E402,F401
    FULLY_MASKED_CHOICES,
    LAYOUTS,
    Call,
    Capabilities,
    Deviation,
    Semantics,
    numpy_layout,
)


class Backend:
    """The contract: every attribute the suite and the benchmarks read is declared here, with its default."""

    name: str = "unnamed"
    capabilities: Capabilities = Capabilities()  # what it takes (dtypes, masks, features, declared limits)
    semantics: Semantics = Semantics()           # what it does where the spec leaves a choice
    # a call at a new shape or static argument compiles (JAX, compiled flex): the suite draws from
    # bounded menus so a run builds a bounded set of programs, and benchmarks time a warm call
    compiles_per_shape: bool = False
    # seconds one call may take before the suite calls it hung, when longer than the suite's
    # limit (ATTNSPEC_CALL_TIMEOUT): a first call that compiles.  0: the suite's limit
    call_timeout: float = 0.0
    # deal the edge-shape grid out over the dtypes (each shape once, in one dtype) as for a
    # compiling backend, though it runs eagerly (properties/test_edges.py)
    edge_grid_over_dtypes: bool = False
    # eager flex: one kernel for every field's hooks (benchmarks switch it off, to time hooks as
    # users write them, one kernel per static field)
    uniform_hooks: bool = False
    # the jax.Device a JAX backend places its arrays on (benchmarks read its memory statistics);
    # None: not a JAX backend
    jax_device: object = None
    # names of environment variables its behaviour depends on (TRITON_INTERPRET): reproducers
    # record them with the run's values and restore them (properties/run_context.py)
    env_vars: tuple = ()
    # tuning knobs and their domains, {name: (default, other values...)} (numpy-tiled's block size, FA3's
    # num_splits): every setting must give the default's answer within the error budget, bitwise where
    # Semantics.knob_exact (properties/test_knobs.py); the call's setting arrives as Call.knobs
    knobs: dict = {}
    # q, k, v, grad_out, the output and dq, dk, dv of the padded call come and go as (..., L, H, E), the
    # length axis before the heads (Keras', Flax's and flash-attn's order), not (..., H, L, E): the swap
    # is made on the host, outside the native call (as a caller holding such arrays makes none), so it
    # is never timed or compiled as the kernel's; masks, biases and the LSE keep (..., H, Lq, Lk/·)
    length_before_heads: bool = False

    # -- hooks for adapters -------------------------------------------------------
    def load(self) -> None:
        """Import the framework and check the device; raise BackendUnavailable(reason)."""

    def to_native(self, x: np.ndarray, dtype: str):
        """A float64/bool/int NumPy array to a native value (dtype is None for masks)."""
        return x if dtype is None else x.astype(dtype)

    def from_native(self, y) -> np.ndarray:
        """A native result to NumPy; bfloat16 comes back as float32 (exactly)."""
        return np.asarray(y)

    def native_dtype(self, y) -> str:
        return str(y.dtype).replace("torch.", "")

    # Each pair calls the other by default, so an adapter implements whichever it likes.
    def native_forward(self, q, k, v, mask, is_causal: bool, scale: float | None):
        """The classic call: output (..., Lq, Ev)."""
        if _overrides(self, "native_attention"):
            return self.native_attention(q, k, v, Call(mask=mask, is_causal=is_causal, scale=scale))
        raise NotImplementedError(f"{type(self).__name__} implements neither native_forward nor native_attention")

    def native_backward(self, q, k, v, grad_out, mask, is_causal: bool, scale: float | None):
        """(dq, dk, dv) natively; only for capabilities.gradients."""
        if _overrides(self, "native_attention_backward"):
            return self.native_attention_backward(q, k, v, grad_out, Call(mask=mask, is_causal=is_causal, scale=scale))
        raise Unsupported(f"{self.name} computes no gradients")

    def native_attention(self, q, k, v, call: Call):
        """The output (..., Lq, Ev), or (output, lse) when call.return_lse.  Default: the classic hook."""
        return self.native_forward(q, k, v, call.mask, call.is_causal, call.scale)

    def native_attention_backward(self, q, k, v, grad_out, call: Call):
        """(dq, dk, dv), plus dbias when capabilities.bias_gradient and call.bias is given."""
        return self.native_backward(q, k, v, grad_out, call.mask, call.is_causal, call.scale)

    def native_packed(self, q, k, v, args, call: Call):
        """A packed call (backends/serving.py): (total_q, Hq, Ev), or (out, lse (Hq, total_q))."""
        raise Unsupported(f"{self.name} takes no packed call")

    def native_packed_backward(self, q, k, v, grad_out, args, call: Call):
        """The packed call's (dq, dk, dv), each shaped like its packed input (backends/serving.py)."""
        raise Unsupported(f"{self.name} takes no packed backward")

    def native_paged(self, q, k_cache, v_cache, args, call: Call):
        """A paged call (backends/serving.py): (B, Hq, Lq, Ev), or (out, lse (B, Hq, Lq))."""
        raise Unsupported(f"{self.name} takes no paged call")

    def native_paged_append(self, q, k_cache, v_cache, k_new, v_new, args, call: Call):
        """Write k_new, v_new (B, n, Hkv, D) into the caches in place at args.cache_seqlens, then the paged
        call over the grown cache (backends/serving.py): (B, Hq, Lq, Ev)."""
        raise Unsupported(f"{self.name} takes no append")

    def native_merge(self, o_a, lse_a, o_b, lse_b):
        """Two attention states over disjoint key sets merged: (o (..., Lq, Ev), lse (..., Lq)), natural log
        (FlashInfer's merge_state, vLLM's merge_attn_states).  o_* native in the call's dtype, lse_* native
        float32 (float64 for float64).  Not offered by default."""
        raise Unsupported(f"{self.name} offers no merge")

    def native_merge_states(self, o_parts, lse_parts):
        """Any number C >= 1 of states merged at once: o_parts (C, ..., Lq, Ev), lse_parts (C, ..., Lq) ->
        (o (..., Lq, Ev), lse (..., Lq)) (FA3's flash_attn_combine over its splits, FlashInfer's merge_states),
        native as for `native_merge`.  Not offered by default; a backend offering it is merged two states at
        a time through it too, unless it also implements `native_merge`."""
        raise Unsupported(f"{self.name} offers no merge of a list of states")

    def offers_merge(self, parts: int = 2) -> bool:
        """Whether `merge` takes `parts` states: a list hook takes any number, a pair hook two."""
        return _overrides(self, "native_merge_states") or (parts == 2 and _overrides(self, "native_merge"))

    def merge_offered(self) -> str:
        """What `describe` says of the merge: "any number" of states, "pairs", or "" (none)."""
        return "any number" if self.offers_merge(3) else "pairs" if self.offers_merge() else ""

    def merge(self, parts, dtype: str = "float64", *, as_list: bool = False, layout: str = "contiguous"):
        """Attention states over disjoint key sets merged, like `specs.reference.merge(parts)`: parts
        [(o_c (..., Lq, Ev), lse_c (..., Lq))], NumPy float64 holding dtype's values, LSEs natural (-inf: an
        empty state; +inf where the backend declares empty_lse "+inf").  Two parts go to `native_merge`
        when the backend implements it (unless as_list), else every count to `native_merge_states`.
        `layout` (one the backend declares, `relayout`'s "transposed", "offset" or "permuted"): every
        native array handed in that layout (vllm-project/vllm#22003: an LSE that is a transposed view).
        Returns (o as NumPy, lse float64, natural)."""
        parts = list(parts)
        if not parts or any(not isinstance(p, (tuple, list)) or len(p) != 2 for p in parts):
            raise ValueError(f"parts: a non-empty list of (output, lse) pairs; got {len(parts)} item(s)")
        shape = np.shape(parts[0][0])
        if len(shape) < 2 or any(np.shape(o) != shape or np.shape(lse) != shape[:-1] for o, lse in parts):
            raise ValueError("parts: every output must share one shape (..., Lq, Ev) and every lse be (..., Lq); "
                             f"got {[(np.shape(o), np.shape(lse)) for o, lse in parts]}")
        if not self.offers_merge(3 if as_list else len(parts)):
            raise Unsupported(f"{self.name} offers no merge" if not self.offers_merge() else
                              f"{self.name} merges pairs only (asked: {len(parts)} states{' as a list' * as_list})")
        if layout not in ("contiguous", "transposed", "offset", "permuted") or (
                layout != "contiguous" and layout not in self.capabilities.layouts):
            raise Unsupported(f"{self.name} cannot be handed {layout} merge states (declares {self.capabilities.layouts})")
        self.load()  # a merge may be the first call (a reproducer replays it alone)
        wide = "float64" if dtype == "float64" else "float32"
        to_base = 1 / np.log(2.0) if self.semantics.lse_base == "2" else 1.0  # a base-2 merge takes base-2 LSEs
        lses = [np.asarray(lse, dtype=np.float64) * to_base for _, lse in parts]
        if len(parts) == 2 and not as_list and _overrides(self, "native_merge"):
            (oa, ob), (la, lb) = self._natives(dtype, parts[0][0], parts[1][0]), self._natives(wide, *lses)
            oa, la, ob, lb = (self.relayout(x, layout) for x in (oa, la, ob, lb))
            y = self._call("merge", self.native_merge, oa, la, ob, lb)
        else:  # stacked as FA3's flash_attn_combine takes them
            (o_parts,), (lse_parts,) = (self._natives(dtype, np.stack([o for o, _ in parts])),  # (C, ..., Lq, Ev)
                                        self._natives(wide, np.stack(lses)))  # (C, ..., Lq)
            o_parts, lse_parts = self.relayout(o_parts, layout), self.relayout(lse_parts, layout)
            y = self._call("merge", self.native_merge_states, o_parts, lse_parts)
        if not isinstance(y, (tuple, list)) or len(y) != 2:
            raise BackendFailure(self.name, f"merge returned {type(y).__name__}, expected (o, lse)")
        out = self._check("merged output", y[0], shape, self.output_dtype(dtype))
        return out, self._natural(self._check("merged lse", y[1], shape[:-1], None).astype(np.float64))

    def sync(self, y) -> None:
        """Wait until y is computed (CUDA synchronize, JAX block_until_ready)."""

    def relayout(self, x, layout: str):
        """The same values as native x in another memory layout (a view with other strides).

        transposed: the last two axes swapped in memory (a non-contiguous innermost axis);
        offset: a view starting 7 elements into a larger buffer; permuted: stored as
        (B, L, H, E), viewed as (B, H, L, E); head_slice: heads 1..H of a buffer two heads wider,
        the others NaN (a fused QKV projection's slice); expanded: batch stride 0 (x's batch slices
        must be equal).  Axes are the native call's (`length_before_heads`: (..., L, H, E), swapped
        first; a packed call's (total, H, E)).  The default handles NumPy arrays; other adapters
        override it.
        """
        if layout == "contiguous" or not isinstance(x, np.ndarray):
            return x
        return numpy_layout(x, layout, self.heads_axis(x))

    def heads_axis(self, x) -> int:
        """The heads axis of a native q, k or v: -2 for (..., L, H, E) and a packed call's (total, H, E)."""
        return -2 if self.length_before_heads or np.ndim(x) == 3 else -3

    # -- declarations -------------------------------------------------------------
    def supports(self, feature: str) -> bool:
        return feature in self.capabilities.features

    def causal_alignments(self) -> tuple:
        """Alignments a causal (or windowed, or ALiBi) call may ask for when Lq != Lk."""
        if self.supports("causal_bottom_right"):
            return CAUSAL_ALIGNMENTS
        return (self.semantics.causal_alignment or "top_left",)

    def output_dtype(self, dtype: str) -> str:
        return dict(self.semantics.output_dtypes).get(dtype, dtype)

    def query_dtype(self, dtype: str) -> str:
        """The dtype q is handed in: dtype, or the declared 16-bit query beside fp8 K/V (Capabilities.fp8_query)."""
        return self.capabilities.fp8_query or dtype if is_fp8(dtype) else dtype

    # -- public API ---------------------------------------------------------------
    def availability(self) -> tuple[bool, str]:
        try:
            self.load()
        except BackendUnavailable as e:
            return False, str(e)
        except ImportError as e:
            return False, f"import failed: {e}"
        return True, "available"

    def check_supported(self, dtype: str, op: str = "forward", mask=None, is_causal=False, problem=None,
                        return_lse: bool = False) -> None:
        """Raise Unsupported (with the reason) for a combination this backend declines."""
        self.load()
        caps = self.capabilities
        if dtype not in caps.dtypes:
            raise Unsupported(f"{self.name} does not support dtype {dtype} (supports {', '.join(caps.dtypes)})")
        if dtype not in caps.dtypes_for(op):
            raise Unsupported(f"{self.name} runs {op} in {', '.join(caps.dtypes_for(op)) or 'no dtype'} only "
                              f"(declared limits; asked: {dtype})")
        if op == "forward_backward" and not caps.gradients:
            raise Unsupported(f"{self.name} computes no gradients")
        if problem is not None:
            mask, is_causal = problem.mask, problem.is_causal
        if mask is not None and not caps.masks:
            raise Unsupported(f"{self.name} takes no boolean mask")
        if is_causal and not caps.causal:
            raise Unsupported(f"{self.name} has no causal mode")
        needed = set(problem.features) if problem is not None else set()
        if return_lse:
            needed.add("lse")
        needed.discard("causal_bottom_right")  # judged through the alignments below
        missing = sorted(needed - caps.features, key=FEATURES.index)
        if missing:
            raise Unsupported(f"{self.name} does not support {', '.join(FEATURE_TEXT[m] for m in missing)} natively")
        if problem is not None and op == "forward_backward" and "descale" in problem.features:
            raise Unsupported(f"{self.name}: descales are forward-only (FA3, FA4 and PyTorch's quantised SDPA have no "
                              "backward with them; nor does the reference)")
        if problem is not None and caps.descale_granularity == "tensor" and _descales_vary(problem):
            raise Unsupported(f"{self.name} takes one descale per tensor (Capabilities.descale_granularity); "
                              "the problem's vary by batch element or KV head")
        if (problem is not None and (problem.Lq != problem.Lk or problem.positions == "per_sequence")
                and on_diagonal(problem)
                and problem.causal_alignment not in self.causal_alignments()):
            raise Unsupported(f"{self.name} aligns its causal mask {self.causal_alignments()[0]} only "
                              f"(asked: {problem.causal_alignment}, Lq={problem.Lq} != Lk={problem.Lk})")

    def _check_shapes(self, p) -> None:
        """Unsupported for a problem outside the declared shape limits (Capabilities.outside), naming them."""
        caps, E, Ev = self.capabilities, p.E, p.Ev
        if caps.equal_head_dims and Ev != E:
            raise Unsupported(f"{self.name} needs value's last dimension equal to query's (Ev == E); got E={E}, Ev={Ev}")
        m = caps.head_dim_multiple
        if E % m or Ev % m:
            raise Unsupported(f"{self.name} needs head dims that are multiples of {m}; got E={E}, Ev={Ev}")
        broken = caps.outside(E, Ev, p.Lq, p.Lk, p.is_causal)
        if broken:
            raise Unsupported(f"{self.name}: outside the declared limits ({'; '.join(broken)})")

    def _natives(self, dtype, *arrays):
        return [None if a is None else self.to_native(np.asarray(a, dtype=np.float64), dtype) for a in arrays]

    def _inputs(self, dtype, q, k, v, *more):
        """q in `query_dtype`, k, v (and more: grad_out) in dtype, native, in the backend's axis order."""
        q, k, v, *more = (self._axes(x) for x in (q, k, v, *more))
        return self._natives(self.query_dtype(dtype), q) + self._natives(dtype, k, v, *more)

    def _axes(self, x):
        """(..., H, L, E) <-> (..., L, H, E) on the host where the backend puts the length first
        (`length_before_heads`); rank 2 (L, E) has no head axis to swap."""
        if not self.length_before_heads or np.ndim(x) < 3:
            return x
        return np.ascontiguousarray(np.swapaxes(x, -3, -2))

    def _call_of(self, p, dtype: str, return_lse: bool, scale) -> Call:
        """The native Call for a validated problem, every field cast as specs.fields says.

        A backend that takes no mask together with is_causal (PyTorch's signature) gets the
        triangle folded into the mask whenever a mask or a bias comes with is_causal: a plain
        function then receives one float mask, -inf where the triangle hides."""
        mask, is_causal = p.mask, p.is_causal
        if is_causal and not self.capabilities.mask_with_causal and (mask is not None or p.bias is not None):
            mask = np.asarray(True if mask is None else mask, dtype=bool) & causal_mask(p.Lq, p.Lk, p.causal_alignment)
            is_causal = False
        values = {}
        for f in FIELDS:
            x = p.fields[f.name]
            if f.cast == "value" or x is None:
                values[f.name] = x
                continue
            # fp8 inputs: a float field (a bias) comes in float32, what such a kernel computes in
            cast = {"input": "float32" if is_fp8(dtype) else dtype, "int32": "int32",
                    "wide": "float64" if dtype == "float64" else "float32"}[f.cast]
            values[f.name] = self.to_native(np.asarray(x, dtype=np.int64 if cast == "int32" else np.float64), cast)
        return Call(mask=None if mask is None else self.to_native(np.asarray(mask, dtype=bool), None),
                    is_causal=is_causal, scale=scale, return_lse=return_lse, dtype=dtype, **values)

    def _check(self, what: str, y, shape: tuple, dtype: str, axes: bool = False) -> np.ndarray:
        """y as NumPy, checked against `shape` and `dtype`; `axes`: an array of q's, k's or v's kind,
        in the backend's axis order (`length_before_heads`)."""
        if y is None:
            raise BackendFailure(self.name, f"{what} is None, expected an array of shape {tuple(shape)}")
        try:
            got_dtype = self.native_dtype(y)
            out = self.from_native(y)
        except Exception as e:  # noqa: BLE001 - any failure to convert is the backend's
            raise BackendFailure(self.name, f"{what} could not be converted to NumPy: {type(e).__name__}: {e}") from e
        if axes and len(shape) >= 3 and self.length_before_heads:
            expected = shape[:-3] + (shape[-2], shape[-3], shape[-1])  # (..., L, H, E)
            if tuple(out.shape) != tuple(expected):
                raise BackendFailure(self.name, f"{what} has shape {tuple(out.shape)}, expected {tuple(expected)} "
                                                f"(length before heads, as declared; returned a {type(y).__name__})")
            out = np.swapaxes(out, -3, -2)
        if tuple(out.shape) != tuple(shape):
            raise BackendFailure(self.name, f"{what} has shape {tuple(out.shape)}, expected {tuple(shape)} "
                                            f"(returned a {type(y).__name__})")
        allowed = (dtype,) if isinstance(dtype, str) else dtype
        if dtype is not None and got_dtype not in allowed:
            raise BackendFailure(self.name, f"{what} has dtype {got_dtype}, expected {' or '.join(allowed)}")
        return out

    def raise_hint(self, error: Exception) -> str:
        """What the adapter knows to be a likely cause of `error`, a native call's raise ('' when nothing)."""
        return ""

    def _call(self, what, fn, *args):
        try:
            return fn(*args)
        except (Unsupported, BackendFailure):
            raise
        except Exception as e:  # noqa: BLE001 - a raising backend fails alone, clearly
            hint = self.raise_hint(e)
            raise BackendFailure(self.name, f"{what} raised {type(e).__name__}: {e}"
                                            + (f" ({hint})" if hint else "")) from e

    def with_knobs(self, call: Call, knobs: dict | None) -> Call:
        """The call at a setting of `knobs` (None or {}: every knob at its default); a knob the backend does
        not declare is a ValueError naming it.  Every call that builds a Call passes through here: the padded
        forward and the format calls alike (a split count acts on a decode's paged call above all)."""
        if not knobs:
            return call
        unknown = sorted(set(knobs) - set(self.knobs))
        if unknown:
            raise ValueError(f"knobs: {self.name} has no knob {unknown}; it declares {sorted(self.knobs)}")
        return replace(call, knobs=dict(knobs))

    def forward(self, q, k, v, mask=None, is_causal=False, scale=None, dtype="float64", *, return_lse=False,
                layout="contiguous", knobs=None, **fields):
        """Output (..., Lq, Ev) as NumPy in `dtype` (bfloat16 -> float32); with return_lse, (output, lse).

        Inputs: float64 NumPy; ``fields``: the optional problem fields of `specs.problem.validate`;
        ``layout``: the memory layout q, k, v reach the native call in (LAYOUTS); ``knobs``: a setting of
        `knobs` (None: the defaults).  The LSE comes back natural (a declared base 2 converted).
        """
        if "padded" not in self.capabilities.formats:  # a varlen or paged kernel: through its format
            from attnspec.backends.serving import forward_via_format
            return forward_via_format(self, q, k, v, mask, is_causal, scale, dtype, return_lse,
                                      {**fields, "knobs": knobs} if knobs else fields)  # LSE natural
        p = validate(q, k, v, mask, is_causal, scale, **fields)  # a caller's mistake is a ValueError
        self.check_supported(dtype, "forward", problem=p, return_lse=return_lse)
        self._check_shapes(p)
        if layout not in self.capabilities.layouts:
            raise Unsupported(f"{self.name} cannot be handed {layout} inputs (declares {self.capabilities.layouts})")
        qn, kn, vn = (self.relayout(x, layout) for x in self._inputs(dtype, q, k, v))
        call = self.with_knobs(self._call_of(p, dtype, return_lse, scale), knobs)
        y = self._call("forward", self.native_attention, qn, kn, vn, call)
        out_shape = p.batch_shape + (p.Lq, p.Ev)
        if not return_lse:
            return self._check("forward output", y, out_shape, self.output_dtype(dtype), axes=True)
        if not isinstance(y, (tuple, list)) or len(y) != 2:
            raise BackendFailure(self.name, f"forward with return_lse returned {type(y).__name__}, "
                                            "expected (output, lse)")
        lse = self._check("lse", y[1], p.batch_shape + (p.Lq,), None).astype(np.float64)
        return self._check("forward output", y[0], out_shape, self.output_dtype(dtype), axes=True), self._natural(lse)

    def _natural(self, lse: np.ndarray) -> np.ndarray:
        """The LSE in natural log: a declared log2-sum-exp2 (FlashInfer) times ln 2."""
        return lse * np.log(2.0) if self.semantics.lse_base == "2" else lse

    def forward_as_returned(self, q, k, v, mask=None, is_causal=False, scale=None, dtype="float64", **fields):
        """(output as NumPy, the dtype name it came back in): `forward` without the output-dtype check,
        for the semantics profile's question of which dtype a backend returns."""
        if "padded" not in self.capabilities.formats:  # through its format: the dtype as checked there
            return self.forward(q, k, v, mask, is_causal, scale, dtype, **fields), self.output_dtype(dtype)
        p = validate(q, k, v, mask, is_causal, scale, **fields)
        self.check_supported(dtype, "forward", problem=p)
        self._check_shapes(p)
        qn, kn, vn = self._inputs(dtype, q, k, v)
        y = self._call("forward", self.native_attention, qn, kn, vn, self._call_of(p, dtype, False, scale))
        out = self._check("forward output", y, p.batch_shape + (p.Lq, p.Ev), None, axes=True)
        return out, self.native_dtype(y)

    def backward(self, q, k, v, grad_out, mask=None, is_causal=False, scale=None, dtype="float64", *,
                 return_dsink=False, knobs=None, **fields):
        """(dQ, dK, dV) as NumPy, each shaped like its input; plus dBias when the backend declares
        `bias_gradient` and a bias is given.  With sinks, a native backward returns dSink (Hq,) last;
        return_dsink: then (grads, dsink).  ``knobs``: a setting of `knobs` (None: the defaults)."""
        p = validate(q, k, v, mask, is_causal, scale, **fields)
        if p.sinks is not None:
            return self._backward_with_sinks(p, q, k, v, grad_out, dtype, scale, return_dsink, knobs)
        out_shape = p.batch_shape + (p.Lq, p.Ev)
        if np.shape(grad_out) != out_shape:
            raise ValueError(f"grad_out must be shaped like the output {out_shape}; got {np.shape(grad_out)}")
        if "padded" not in self.capabilities.formats and "packed" in self.capabilities.formats:
            from attnspec.backends.serving import backward_packed  # a varlen kernel: through its packed backward
            self.check_supported(dtype, "forward_backward", problem=p)
            grads, _ = backward_packed(self, q, k, v, grad_out, dtype, rng=0, mask=mask, is_causal=is_causal,
                                       scale=scale, knobs=knobs, **fields)
            return tuple(g.reshape(np.shape(x)) for g, x in zip(grads, (q, k, v), strict=True))
        self.check_supported(dtype, "forward_backward", problem=p)
        self._check_shapes(p)
        qn, kn, vn, gn = self._inputs(dtype, q, k, v, grad_out)  # no fp8 backward: q in dtype too
        call = self.with_knobs(self._call_of(p, dtype, False, scale), knobs)
        grads = self._call("backward", self.native_attention_backward, qn, kn, vn, gn, call)
        wants_dbias = p.bias is not None and self.capabilities.bias_gradient
        if not isinstance(grads, (tuple, list)) or len(grads) not in (3, 4) or (wants_dbias and len(grads) != 4):
            expected = "(dq, dk, dv, dbias)" if wants_dbias else "(dq, dk, dv)"
            raise BackendFailure(self.name, f"backward returned {type(grads).__name__}"
                                            f"{f' of {len(grads)}' if isinstance(grads, (tuple, list)) else ''}, "
                                            f"expected {expected}")
        inputs = (q, k, v) + ((fields["bias"],) if wants_dbias else ())
        # a gradient comes back in its input's dtype (autograd), or in the output's by the declared policy
        out_dtype = tuple(dict.fromkeys((dtype, self.output_dtype(dtype))))
        return tuple(self._check(f"d{n}", g, np.shape(x), out_dtype, axes=n != "bias")
                     for n, g, x in zip(("q", "k", "v", "bias"), grads, inputs, strict=False))  # a dbias not asked for: dropped

    def _backward_with_sinks(self, p, q, k, v, grad_out, dtype, scale, return_dsink, knobs):
        """The backward of a problem with sinks: (dq, dk, dv[, dbias], dsink) from the native call."""
        if np.shape(grad_out) != p.batch_shape + (p.Lq, p.Ev):
            raise ValueError(f"grad_out must be shaped like the output {p.batch_shape + (p.Lq, p.Ev)}; "
                             f"got {np.shape(grad_out)}")
        self.check_supported(dtype, "forward_backward", problem=p)
        self._check_shapes(p)
        qn, kn, vn, gn = self._inputs(dtype, q, k, v, grad_out)  # no fp8 backward: q in dtype too
        grads = self._call("backward", self.native_attention_backward, qn, kn, vn, gn,
                           self.with_knobs(self._call_of(p, dtype, False, scale), knobs))
        wants_dbias = p.bias is not None and self.capabilities.bias_gradient
        n = 4 + wants_dbias
        if not isinstance(grads, (tuple, list)) or len(grads) != n:
            raise BackendFailure(self.name, f"backward with sinks returned {type(grads).__name__}"
                                            f"{f' of {len(grads)}' if isinstance(grads, (tuple, list)) else ''}, "
                                            f"expected {n}: (dq, dk, dv{', dbias' if wants_dbias else ''}, dsink)")
        inputs = (q, k, v) + ((p.bias,) if wants_dbias else ())
        out_dtype = tuple(dict.fromkeys((dtype, self.output_dtype(dtype))))
        got = tuple(self._check(f"d{n}", g, np.shape(x), out_dtype, axes=n != "bias")
                    for n, g, x in zip(("q", "k", "v", "bias")[:len(inputs)], grads[:-1], inputs, strict=True))
        dsink = self._check("dsink", grads[-1], (p.Hq,), None)  # the sink's dtype: FlashInfer's is float32 always
        return (got, dsink.astype(np.float64)) if return_dsink else got

    def prepare(self, q, k, v, mask=None, is_causal=False, scale=None, dtype="float32", op="forward", **fields):
        """Convert once; return a no-argument callable that runs the native call and syncs."""
        p = validate(q, k, v, mask, is_causal, scale, **fields)
        self.check_supported(dtype, op, problem=p)
        self._check_shapes(p)
        qn, kn, vn, gn = self._inputs(dtype, q, k, v, np.ones(p.batch_shape + (p.Lq, p.Ev)))
        call = self._call_of(p, dtype, False, scale)
        if op == "forward":
            def run():
                y = self.native_attention(qn, kn, vn, call)
                self.sync(y)
                return y
        else:
            def run():
                grads = self.native_attention_backward(qn, kn, vn, gn, call)
                self.sync(grads[0])
                return grads
        return run

    def describe(self) -> dict:
        ok, why = self.availability()
        c, s = self.capabilities, self.semantics
        return {"name": self.name, "available": ok, "reason": why, "device": c.device,
                "dtypes": list(c.dtypes), "gradients": c.gradients, "masks": c.masks, "causal": c.causal,
                "equal_head_dims": c.equal_head_dims, "head_dim_multiple": c.head_dim_multiple,
                "limits": {"head_dims": list(c.head_dims), "max_head_dim": c.max_head_dim,
                           "head_dim_power_of_two": c.head_dim_power_of_two, "length_multiple": c.length_multiple,
                           "max_length": c.max_length, "causal_equal_lengths": c.causal_equal_lengths,
                           "op_dtypes": {op: list(d) for op, d in c.op_dtypes}},
                "features": [f for f in FEATURES if f in c.features], "bias_gradient": c.bias_gradient,
                "mask_with_causal": c.mask_with_causal, "causal_alignments": list(self.causal_alignments()),
                "layouts": list(c.layouts), "formats": list(c.formats),
                "paged_cache_views": c.paged_cache_views, "length_before_heads": self.length_before_heads,
                "output_dtypes": [list(x) for x in s.output_dtypes], "notes": list(s.notes),
                **{k: v for k, v in self.conventions().items() if k != "backend"},
                "descale_granularity": c.descale_granularity, "fp8_query": c.fp8_query,
                "deviations": [{"property": d.property, "dtypes": list(d.dtypes), "why": d.why} for d in s.deviations]}

    def conventions(self) -> dict:
        """The declarations where the spec leaves a choice or kernels differ (issue 31), as plain values,
        without loading the framework: what the suite records beside its rows and the report's conventions
        table sets beside what the suite observed (None: not declared)."""
        s = self.semantics
        return {"backend": self.name, "fully_masked": s.fully_masked, "padded_rows": s.padded_rows,
                "causal_alignment": s.causal_alignment, "effective_precision": s.effective_precision,
                "lse_base": s.lse_base, "empty_lse": s.empty_lse, "lse_with_sinks": s.lse_with_sinks,
                "deterministic": s.deterministic, "batch_invariant": s.batch_invariant,
                "knobs": {n: list(d) for n, d in self.knobs.items()}, "knob_exact": s.knob_exact,
                "merge": self.merge_offered(), "rejects_bad_indices": s.rejects_bad_indices,
                "p_dtypes": dict(s.p_dtypes)}

    def __repr__(self) -> str:
        return f"<Backend {self.name}>"


def _descales_vary(p) -> bool:
    """Whether a problem's descales differ between batch elements or KV heads (not one per tensor)."""
    return any(d is not None and np.ptp(np.asarray(d, dtype=np.float64)) > 0
               for d in (p.q_descale, p.k_descale, p.v_descale))


def _overrides(backend, hook: str) -> bool:
    return getattr(type(backend), hook) is not getattr(Backend, hook)

