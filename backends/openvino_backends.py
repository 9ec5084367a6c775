"""OpenVINO: the opset-13 `ScaledDotProductAttention` op, compiled for the CPU plugin.

Built with OpenVINO's Python graph API (``openvino.opset13``), imported in ``load``.  Inputs are
packed into rank-4 (B, H, L, E) tensors (`layout4d`); shapes are dynamic, so one compiled model
per (dtype, mask kind, causal, scale given) serves every shape (a compile is cheap: docs/measurements.md).
A given scale is an input, not a constant, so new scales do not recompile.

openvino-sdpa keeps the plugin's default inference precision - bfloat16 on CPUs with AVX512-BF16
or AMX: every input dtype is computed in it - and declares the precision it finds at ``load``;
openvino-sdpa-f32 sets INFERENCE_PRECISION_HINT = f32.  What the op's specification says and
OpenVINO 2026.4 does, as measured here (tests/test_backends_runtimes.py):
- ``causal`` is top-left (the spec's ``triu(-inf, k=1)``) and the attention_mask is ignored when
  it is set (documented): a mask or bias with is_causal has the triangle folded in instead.
- a fully masked row: NaN (softmax over all -inf, the spec's pseudo-code) for float32, float16 and
  bfloat16 inputs; float64 inputs give the mean of V instead (a finding; see the report), and so do
  bfloat16 inputs on a CPU without bfloat16 kernels (declared at ``load`` from the plugin's
  OPTIMIZATION_CAPABILITIES).
- no grouped KV heads: K/V heads broadcast NumPy-style only (Hkv = 1 or Hq).
- the scale input must have the query's element type, so a bfloat16 call rounds it to bfloat16.
- the CPU plugin has no float64 kernels: float64 is computed in float32 and returned as float64;
  at bf16 precision float64 inputs are truncated to bfloat16 (float32 ones rounded to nearest), so
  openvino-sdpa declines float64 (a finding) and openvino-sdpa-f32 takes it.
- a finding: when the kernel runs in bfloat16 (the default here, or bfloat16 inputs), a call with
  head size E = 1 corrupts later calls of the same compiled model with E >= 16 (NaN or wrong rows).
  So where the kernel runs in bfloat16 the adapter compiles one model per configuration *and
  head sizes* (E, Ev) (``static_shapes``; a compile is cheap beside the suite's calls, the last 512
  kept): no model sees a call of another head size, and the finding stays a finding of its own
  (tests/test_backends_runtimes.py replays it on one dynamic-shape model, as a deployment keeps
  it: ``static_shapes = False``).  Lengths and batch sizes do change within a model (five
  seeds of the suite and its edge grid, no wrong row; a model per shape made the suite slower:
  docs/measurements.md).
  The float32 kernel is not affected: one model serves every shape, as in a deployment.
- attention sinks (issue 31): the opset-13 op takes a sixth input, ``sink``, that the Python helper
  ``opset13.scaled_dot_product_attention`` does not expose (it stops at ``scale``); built through
  ``NodeFactory("opset13")`` it is one logit per query head shaped like the query's rank, (1, Hq, 1, 1),
  of the query's element type (a rank-1 (Hq,) is refused: "sink_rank_correctness").  Measured on 2026.4
  (this CPU's float32 kernel): the reference's output within float32's rounding, a row that sees nothing
  0 where its head's sink is finite (a -inf sink: the op's own NaN, or the mean of V for float64).  The
  CPU plugin carries the message "Only Constant operation on sink input is supported" (a Parameter sink
  did compute here, but the bfloat16 kernels could not be measured on this CPU), so a call with sinks
  compiles a model with its sinks as a Constant (the cache keys on their values: one compile a new set),
  passes the scale (1/sqrt(E) when none is given: the sink input comes after it) and a scalar-zero mask
  placeholder, and the sinks are rounded to the query's element type.
bfloat16 travels as uint16 bit patterns (NumPy has no bfloat16; OpenVINO's Python API takes them).
"""
from __future__ import annotations

import numpy as np

from attnspec.backends.base import Backend, BackendUnavailable, Capabilities, Deviation, Semantics
from attnspec.backends.declarations import NAN_IN_OUTPUT
from attnspec.backends.layout4d import Packing

_BF16_NEG_INF = np.uint16(0xFF80)
_PRECISIONS = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}  # INFERENCE_PRECISION_HINT names
_NOTES = ("attention_mask is ignored when causal is set (documented): a mask or bias with is_causal has the "
          "causal triangle folded in",
          "fully masked rows: NaN for float32/float16/bfloat16 inputs (the spec's softmax over -inf); "
          "float64 inputs give the mean of V (disagrees with the spec)",
          "no grouped KV heads (SDPA-13 broadcasts K/V heads NumPy-style only)",
          "the scale input has the query's element type: bfloat16 and float16 calls round it",
          "float64 is computed in float32 by the CPU plugin and returned as float64; at bf16 precision float64 "
          "inputs are truncated to bfloat16 (float32 inputs rounded to nearest): openvino-sdpa declines float64",
          "bfloat16 kernels (default precision, or bfloat16 inputs): after a call with head size 1, later calls "
          "of the same compiled model with head size >= 16 give NaN or wrong rows (a finding)",
          "results below float32's smallest normal come back as 0 (exp underflows early)",
          "sinks: the op's sixth input, a Constant on the CPU plugin: a model compiled per sinks' values, the sinks "
          "rounded to the query's element type")


# OpenVINO 2026.4, CPU plugin; found by the suite (reproducers in the report)
_DEVIATIONS = (
    Deviation("empty_sizes",
              "no key at all (Lk = 0): the output is not the declared NaN rows but finite values left in the "
              "output buffer by an earlier call (uninitialised memory, zeros among them; docs/findings.md: "
              "openvino-lk0-stale)", when=r"empty sizes does '(zeros|other|Lk=0: )"),
    Deviation("fully_masked_rows", "float64 inputs give the mean of V on a fully masked row, the other dtypes "
              "NaN (the spec's softmax over -inf)", dtypes=("float64",)),
)


# measured on a CPU whose plugin lists no BF16 among its OPTIMIZATION_CAPABILITIES (AMD EPYC, FP32 only):
# CPUs with bfloat16 kernels give NaN there, as for the other dtypes
_EMULATED_BF16_MASKED = Deviation(
    "fully_masked_rows", "on a CPU without bfloat16 kernels (no BF16 in the plugin's OPTIMIZATION_CAPABILITIES) "
    "bfloat16 inputs give the mean of V on a row a boolean mask hides entirely (a -inf bias still gives "
    "NaN), not the NaN of the other dtypes",
    dtypes=("bfloat16",), when="does 'mean_of_values'")


# measured on an Intel Xeon with AMX (bfloat16 kernels); a CPU that emulates bfloat16 was not measured
_SINK_NAN_LEAK = ("with a -inf sink the bfloat16 kernel carries the NaN of a row that sees no key into the row "
                  "before it (Lq = Lk = 100: 64 of the 100 rows hidden alone; a finite sink, the float32 kernel, "
                  "no sink: none; docs/findings.md: openvino-bf16-sink-nan-leak)")


def _bf16_bits(x) -> np.ndarray:
    """float64 -> bfloat16 bit patterns, round to nearest even (via float32: a double rounding,
    off by one bfloat16 ulp only for float64 values within 2^-32 relative of a tie)."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.reshape(-1).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded.reshape(x.shape))


def _widen_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)  # exact


class OpenVinoSdpa(Backend):
    """ScaledDotProductAttention-13 on OpenVINO's CPU plugin, at its default inference precision."""

    name = "openvino-sdpa"
    precision_hint: str | None = None  # None: the plugin's default; "f32" for the -f32 backend
    compiles_per_shape = False  # a compile is cheap (docs/measurements.md): the suite needs no shape menu
    static_shapes = True  # bfloat16 kernel: a compiled model per head size too (the finding above)
    cache_size = 512  # models kept (a few MB): the suite draws ~300 configurations and head sizes
    # float64 is declined: at the plugin's bf16 precision float64 inputs reach the kernel truncated to
    # bfloat16 (round toward zero; float32 inputs are rounded to nearest), an error no declaration
    # expresses (a finding).  openvino-sdpa-f32 takes float64.
    capabilities = Capabilities(dtypes=("float16", "bfloat16", "float32"), device="cpu",
                                gradients=False, features=frozenset(("bias", "sinks")), mask_with_causal=False)
    # effective_precision is what the plugin reports at load(): set there for this machine
    semantics = Semantics(fully_masked="nan", causal_alignment="top_left", notes=_NOTES, deviations=_DEVIATIONS)

    def load(self):
        if getattr(self, "core", None) is not None:
            return  # loaded: every call checks (a new Core and its property query a call would cost more than small calls)
        try:
            import openvino
            from openvino import opset13
        except ImportError as e:
            raise BackendUnavailable(f"openvino is not installed ({e}); pip install 'attnspec[openvino]'") from None
        core = openvino.Core()
        if "CPU" not in core.available_devices:
            raise BackendUnavailable(f"OpenVINO has no CPU device (devices: {core.available_devices})")
        self.ov, self.ops, self.core = openvino, opset13, core
        self.config = {} if self.precision_hint is None else {"INFERENCE_PRECISION_HINT": self.precision_hint}
        hint = self.precision_hint or core.get_property("CPU", "INFERENCE_PRECISION_HINT").to_string()
        self.inference_precision = _PRECISIONS.get(hint, hint)
        bf16_kernels = "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        in_bf16 = tuple(d for d in self.capabilities.dtypes if self.runs_in_bfloat16(d))
        sink_leak = Deviation("*", _SINK_NAN_LEAK, dtypes=in_bf16, feature="sinks", when=NAN_IN_OUTPUT)
        self.semantics = Semantics(
            fully_masked="nan", causal_alignment="top_left", effective_precision=self.inference_precision,
            deviations=_DEVIATIONS + (sink_leak,) + (() if bf16_kernels else (_EMULATED_BF16_MASKED,)),
            notes=(f"computes every dtype in {self.inference_precision} (CPU plugin INFERENCE_PRECISION_HINT "
                   f"{'set to' if self.precision_hint else 'default on this CPU:'} {hint})",) + _NOTES)
        if not hasattr(self, "_compiled"):
            self._compiled = {}

    def to_native(self, x, dtype):
        if dtype == "bfloat16":
            return _bf16_bits(x)  # (...) uint16
        return super().to_native(x, dtype)

    def native_dtype(self, y) -> str:
        return "bfloat16" if y.dtype == np.uint16 else str(y.dtype)

    def from_native(self, y):
        return _widen_bf16(y) if y.dtype == np.uint16 else np.asarray(y)

    def _element(self, dtype: str):
        t = self.ov.Type
        return {"float16": t.f16, "bfloat16": t.bf16, "float32": t.f32, "float64": t.f64}[dtype]

    def per_head_size(self, dtype: str) -> bool:
        """A model per head size where the kernel runs in bfloat16 (the finding above); the float32
        kernel keeps no state across shapes (tests/test_backends_runtimes.py): one model serves all."""
        return self.static_shapes and self.runs_in_bfloat16(dtype)

    def runs_in_bfloat16(self, dtype: str) -> bool:
        """Whether calls of this dtype run the bfloat16 kernel: bfloat16 inputs, or the plugin's precision."""
        return "bfloat16" in (dtype, self.inference_precision)

    def request(self, dtype: str, mask_kind: str | None, causal: bool, scaled: bool, shapes: tuple = (),
                sinks=None):
        """An infer request of the cached compiled model for this configuration (and shapes); sinks: the
        (1, Hq, 1, 1) Constant of the op's sixth input, in the query's element type (its values in the key)."""
        heads = (shapes[0][-1], shapes[2][-1]) if shapes and self.per_head_size(dtype) else ()  # (E, Ev)
        baked = () if sinks is None else (sinks.dtype.str, sinks.tobytes())
        key = (dtype, mask_kind, bool(causal), bool(scaled)) + heads + baked
        if key not in self._compiled:
            while len(self._compiled) >= self.cache_size:
                self._compiled.pop(next(iter(self._compiled)))  # the oldest
            ops, elem = self.ops, self._element(dtype)
            dynamic4 = self.ov.PartialShape([-1] * 4)
            params = [ops.parameter(dynamic4, elem, name=n) for n in ("query", "key", "value")]
            args = list(params)
            if mask_kind is not None:
                mask_type = self.ov.Type.boolean if mask_kind == "bool" else elem
                params.append(ops.parameter(dynamic4, mask_type, name="attention_mask"))
                args.append(params[-1])
            if scaled:
                if mask_kind is None:  # the spec's placeholder: a scalar zero of the query's type
                    args.append(ops.convert(ops.constant(np.float32(0)), elem))
                params.append(ops.parameter(self.ov.PartialShape([]), elem, name="scale"))
                args.append(params[-1])
            if sinks is None:
                sdpa = ops.scaled_dot_product_attention(*args, causal=bool(causal))
            else:  # the sixth input, which opset13's Python helper does not take: the op through its factory
                from openvino.utils.node_factory import NodeFactory
                # copied into the model (a Tensor's Constant shares the host's memory by default: `sinks`
                # is gone after this call, and the cached model would read whatever is there next)
                sink = (ops.constant(self.ov.Tensor(sinks, sinks.shape, elem), False) if dtype == "bfloat16"
                        else ops.constant(sinks))
                sdpa = NodeFactory("opset13").create("ScaledDotProductAttention", [a.output(0) for a in args]
                                                     + [sink.output(0)], {"causal": bool(causal)})
            model = self.ov.Model([sdpa], params, "attnspec_sdpa")
            self._compiled[key] = self.core.compile_model(model, "CPU", self.config).create_infer_request()
        return self._compiled[key]

    def _tensor(self, x):
        x = np.array(x, order="C", copy=None)  # not ascontiguousarray: it turns a 0-d scale into shape (1,)
        if x.dtype == np.uint16:  # bfloat16 bit patterns
            return self.ov.Tensor(x, x.shape, self.ov.Type.bf16)
        return self.ov.Tensor(x)

    def _neg_inf(self, dtype: str):
        return _BF16_NEG_INF if dtype == "bfloat16" else np.dtype(dtype).type(-np.inf)

    def native_attention(self, q, k, v, call):
        mask, bias, causal = call.mask, call.bias, call.is_causal
        Lq, Lk = q.shape[-2], k.shape[-2]
        if causal and bias is not None:  # the op would ignore the bias: fold the triangle in, as for masks
            mask = np.tril(np.ones((Lq, Lk), dtype=bool)) & (True if mask is None else mask)  # (..., Lq, Lk)
            causal = False
        pack = Packing(q, k, v, call, (mask, bias))
        feed = [pack.qkv(q, pack.hq), pack.qkv(k, pack.hkv), pack.qkv(v, pack.hkv)]  # (B, H, L, E)
        kind = None
        if bias is not None:  # one additive attention_mask: -inf where the boolean mask hides a pair
            scores = bias if mask is None else np.where(mask, bias, self._neg_inf(call.dtype))  # (..., Lq, Lk)
            feed.append(pack.scores(scores))  # (B|1, Hq|1, Lq, Lk)
            kind = "float"
        elif mask is not None:
            feed.append(pack.scores(mask))
            kind = "bool"
        sinks, scale = None, call.scale
        if call.sinks is not None:  # (1, Hq, 1, 1) after the scale: the scale is passed, its default too
            sinks = self.to_native(np.asarray(call.sinks, np.float64).reshape(1, -1, 1, 1), call.dtype)
            sinks = np.ascontiguousarray(np.broadcast_to(sinks, (1, pack.hq, 1, 1)))
            scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
        if scale is not None:
            feed.append(self.to_native(np.asarray(scale, dtype=np.float64), call.dtype))  # () query's type
        request = self.request(call.dtype, kind, causal, scale is not None, tuple(np.shape(x) for x in feed), sinks)
        request.infer([self._tensor(x) for x in feed])
        y = request.get_output_tensor(0)
        out = y.data.view(np.uint16) if y.element_type == self.ov.Type.bf16 else y.data
        return pack.output(out.copy())  # (..., Lq, Ev); copied: the request reuses its output buffer


class OpenVinoSdpaF32(OpenVinoSdpa):
    """The same op with the CPU plugin's INFERENCE_PRECISION_HINT set to f32."""

    name = "openvino-sdpa-f32"
    precision_hint = "f32"
    capabilities = Capabilities(dtypes=("float16", "bfloat16", "float32", "float64"), device="cpu",
                                gradients=False, features=frozenset(("bias", "sinks")), mask_with_causal=False)
    semantics = Semantics(fully_masked="nan", causal_alignment="top_left", effective_precision="float32",
                          notes=_NOTES, deviations=_DEVIATIONS)
