"""ONNX Runtime: a one-node ONNX model with the opset-23 `Attention` operator, run on CPU.

The question it answers: does my exported model's attention agree with the framework I trained
in?  The model is built with `onnx.helper` and run by ONNX Runtime's CPU execution provider.
onnx and onnxruntime are imported in ``load``.  Inputs are packed into the op's 4-D layout
(B, H, L, E) (`layout4d`); grouped KV heads are 4-D K/V with fewer heads (``q_num_heads`` /
``kv_num_heads`` are the 3-D layout's spelling of the same thing).  Shapes are dynamic, so one
InferenceSession per (dtype, mask kind, is_causal, scale, softcap) serves every shape.

What the op's spec says and ORT 1.32 does, as measured here (tests/test_backends_runtimes.py):
- ``scale`` is a float attribute (32-bit) and the CPU kernel multiplies Q and K each by
  float32(sqrt(float32(scale))), the spec's ``Q*sqrt(scale)``: float64 results carry a
  float32-rounded scale, even the default 1/sqrt(E) - they are float32-accurate (exact only
  where that square root is a float32, E = 4, 16, 256 ...).  Declared: effective_precision.
- ``is_causal`` without ``past_key`` is top-left (offset = past_sequence_length = 0).
- a fully masked row gives zeros (the opset's errata), in every dtype.
- no bfloat16 kernel on the CPU EP; no log-sum-exp output.
- float32/float16 refuse a mask that broadcasts over the query axis (the spec allows it; float64
  takes it): the adapter expands that axis, as it flattens batch axes.
"""
from __future__ import annotations

import numpy as np

from attnspec.backends.base import Backend, BackendUnavailable, Capabilities, Semantics, Unsupported
from attnspec.backends.layout4d import Packing

OPSET = 23
_ONNX_TYPES = {"float16": "FLOAT16", "float32": "FLOAT", "float64": "DOUBLE"}


class OnnxRuntimeAttention(Backend):
    """onnx `Attention` (opset 23) in an InferenceSession on ORT's CPUExecutionProvider."""

    name = "onnxruntime-attention"
    compiles_per_shape = False  # dynamic shapes: one session per static configuration
    capabilities = Capabilities(dtypes=("float16", "float32", "float64"), device="cpu", gradients=False,
                                features=frozenset(("gqa", "bias", "softcap")), mask_with_causal=True)
    semantics = Semantics(
        fully_masked="zeros", causal_alignment="top_left", effective_precision="float32",
        notes=("scale is a float32 attribute and ORT's CPU kernel scales Q and K by float32(sqrt(scale)): "
               "float64 results carry a float32-rounded scale, even the default 1/sqrt(E)",
               "is_causal is top-left without past_key (opset 23: j <= i + past_sequence_length)",
               "a fully masked row outputs zeros (opset 23 errata), every dtype",
               "a boolean mask together with a bias goes in as one float attn_mask: the bias where the mask "
               "is True, -inf elsewhere (the op's own rule for composing them)",
               "no bfloat16: ORT's CPU EP has no bfloat16 Attention kernel (the function-body fallback "
               "fails: no bfloat16 Expand)",
               "no log-sum-exp output (qk_matmul_output gives scores or weights)",
               "float32/float16 refuse an attn_mask broadcast over queries (shape (..., 1, Lk)): 'inconsistent "
               "q_sequence_length'; the spec says broadcastable, float64 takes it: the adapter expands that axis",
               "an empty batch, Lq = 0 or Lk = 0: ORT's kernel refuses them (must be greater than 0): declined"))

    def load(self):
        try:
            import onnx
            import onnxruntime
        except ImportError as e:
            raise BackendUnavailable(f"onnx and onnxruntime are not installed ({e}); "
                                     "pip install 'attnspec[onnxruntime]'") from None
        if "CPUExecutionProvider" not in onnxruntime.get_available_providers():
            raise BackendUnavailable("ONNX Runtime has no CPUExecutionProvider")
        self.onnx, self.ort = onnx, onnxruntime
        if not hasattr(self, "_sessions"):
            self._sessions = {}

    def _model(self, dtype: str, mask_kind: str | None, is_causal: bool, scale, softcap):
        """The serialized one-node model; inputs of unknown size, rank 4."""
        helper, tp = self.onnx.helper, self.onnx.TensorProto
        elem = getattr(tp, _ONNX_TYPES[dtype])
        inputs = [helper.make_tensor_value_info(n, elem, [None] * 4) for n in ("Q", "K", "V")]
        if mask_kind is not None:
            inputs.append(helper.make_tensor_value_info("attn_mask", tp.BOOL if mask_kind == "bool" else elem,
                                                        [None] * 4))
        attrs = {"is_causal": int(is_causal)}
        if scale is not None:
            attrs["scale"] = float(scale)  # stored as a 32-bit float: the op's spec
        if softcap is not None:
            attrs["softcap"] = float(softcap)
        node = helper.make_node("Attention", [i.name for i in inputs], ["Y"], **attrs)
        graph = helper.make_graph([node], "attnspec_attention", inputs,
                                  [helper.make_tensor_value_info("Y", elem, [None] * 4)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 10  # what ORT 1.2x+ reads; onnx's newest IR may be ahead of the runtime
        self.onnx.checker.check_model(model)
        return model.SerializeToString()

    def session(self, dtype: str, mask_kind: str | None, is_causal: bool, scale, softcap):
        """The cached InferenceSession for this static configuration (creating one costs ~ms)."""
        key = (dtype, mask_kind, bool(is_causal), scale, softcap)
        if key not in self._sessions:
            options = self.ort.SessionOptions()
            options.log_severity_level = 4  # fatal only: a failing run raises with the same message
            self._sessions[key] = self.ort.InferenceSession(self._model(*key), options,
                                                            providers=["CPUExecutionProvider"])
        return self._sessions[key]

    def native_attention(self, q, k, v, call):
        mask, bias = call.mask, call.bias
        pack = Packing(q, k, v, call, (mask, bias))
        sizes = {"batch": pack.batch, "heads": pack.hq, "Lq": q.shape[-2], "Lk": k.shape[-2]}
        if 0 in sizes.values():  # ORT's checks: "Batch size / Q sequence length ... must be greater than 0"
            raise Unsupported(f"{self.name}: ORT's Attention kernel needs every size > 0 (got "
                              f"{', '.join(f'{n}={x}' for n, x in sizes.items())})")
        feed = {"Q": pack.qkv(q, pack.hq), "K": pack.qkv(k, pack.hkv), "V": pack.qkv(v, pack.hkv)}  # (B, H, L, E)
        kind = None
        if bias is not None:  # one additive attn_mask: -inf where the boolean mask hides a pair
            scores = bias if mask is None else np.where(mask, bias, bias.dtype.type(-np.inf))  # (..., Lq, Lk)
            feed["attn_mask"], kind = pack.scores(scores), "float"  # (B|1, Hq|1, Lq, Lk)
        elif mask is not None:
            feed["attn_mask"], kind = pack.scores(mask), "bool"
        if kind is not None:  # ORT's float32/float16 kernels refuse a mask broadcast over queries (see notes)
            m = feed["attn_mask"]
            feed["attn_mask"] = np.ascontiguousarray(np.broadcast_to(m, m.shape[:-2] + (q.shape[-2], m.shape[-1])))
        y = self.session(call.dtype, kind, call.is_causal, call.scale, call.softcap).run(None, feed)[0]
        return pack.output(y)  # (..., Lq, Ev)
