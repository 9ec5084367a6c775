"""Keras 3: ``keras.ops.dot_product_attention`` on the NumPy, JAX and PyTorch backends.

What its documentation says (keras.ops.dot_product_attention, Keras 3.15): query (B, T, N, H),
key and value (B, S, K, H) - value "with the same shape of key" (so Ev = E) - grouped heads when N
is a multiple of K; ``bias`` added to the logits and ``mask`` boolean (True = takes part), each
broadcastable to (B, N, T, S); ``scale`` defaults to 1/sqrt(H); ``is_causal``;
``attn_logits_soft_cap`` on JAX's TPU only.  Nothing is said of the causal alignment or of a
fully masked row: the suite records them.  Keras' dtype policy converts float64 to float32 on
every backend but TensorFlow (keras/src/backend/common/dtypes.py, BIT64_TO_BIT32_DTYPE):
declared as an output dtype policy.

keras.ops dispatches to the backend chosen by ``KERAS_BACKEND`` when keras is first imported, one
per process; the adapters call the function it dispatches to for each backend
(``keras.src.backend.<name>.nn.dot_product_attention``: keras.ops adds only the soft-cap check),
so the three run side by side in one process.  ``KERAS_BACKEND`` is set to the adapter's backend
when keras has not been imported yet (its default, TensorFlow, is not installed here).
Gradients: the framework's own autograd through that function (jax.vjp, torch.autograd), what a
Keras model trained on that backend runs; none on NumPy.  What the suite found: docs/findings.md.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys

import numpy as np

from attnspec.backends.base import Backend, BackendUnavailable, Capabilities, Deviation, Semantics, Unsupported

_ALL = ("float16", "bfloat16", "float32", "float64")
_FEATURES = frozenset(("gqa", "bias"))
_POLICY = (("float64", "float32"),)  # Keras' BIT64_TO_BIT32_DTYPE: float64 becomes float32 off TensorFlow
_NOTES = ("keras.ops.dot_product_attention, called through the backend's own nn module",
          "layout (B, T, N, H): declared (length_before_heads); the arrays are swapped on the host, never in the call",
          "float64 comes back float32: Keras' dtype policy off TensorFlow (BIT64_TO_BIT32_DTYPE)",
          "value must have the key's shape (the docstring): Ev = E")


def _caps(gradients: bool) -> Capabilities:
    return Capabilities(dtypes=_ALL, device="cpu", gradients=gradients, features=_FEATURES, equal_head_dims=True)


class _Keras(Backend):
    keras_backend = "numpy"
    length_before_heads = True  # query (B, T, N, H), key and value (B, S, K, H)
    capabilities = _caps(False)
    semantics = Semantics(output_dtypes=_POLICY, notes=_NOTES)

    def load(self):
        if "keras" not in sys.modules:
            os.environ.setdefault("KERAS_BACKEND", self.keras_backend)  # keras' default, tensorflow, is absent
        try:
            self.framework = importlib.import_module(self.keras_backend)
            self.nn = importlib.import_module(f"keras.src.backend.{self.keras_backend}.nn")
        except ImportError as e:
            raise BackendUnavailable(f"keras with its {self.keras_backend} backend is not importable ({e}); "
                                     "pip install 'attnspec[zoo]'") from None

    def _attention(self, q, k, v, call, bias=None, mask=None):
        return self.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=call.scale,
                                             is_causal=call.is_causal)  # (B, T, N, H)

    def native_attention(self, q, k, v, call):
        return self._attention(q, k, v, call, call.bias, call.mask)


class KerasNumpy(_Keras):
    """keras.ops.dot_product_attention with KERAS_BACKEND=numpy (forward only)."""

    name = "keras-numpy"
    keras_backend = "numpy"
    semantics = Semantics(output_dtypes=_POLICY, notes=_NOTES, deviations=(
        Deviation("*", "Keras' NumPy backend computes the logits with einsum('BTNH,BSNH->BNTS'), which needs as "
                  "many key/value heads as query heads: grouped heads raise ValueError (operands could not be "
                  "broadcast), though the docstring promises GQA (docs/findings.md: keras-numpy-gqa)",
                  feature="gqa", when="operands could not be broadcast"),
        Deviation("*", "float16 sums P V in float16: np.einsum in the inputs' dtype (keras-team/keras#20615) adds "
                  "each key's product into the float16 output, ~10x the error of a float32-accumulating kernel, "
                  "beyond the budget on long rows, Lk >= 30 (docs/findings.md: keras-numpy-float16-accumulation)",
                  dtypes=("float16",), when="exceeds row", problems=r"\bLk=(?:[3-9]\d|\d{3,})\b"),))

    def to_native(self, x, dtype):
        if dtype == "bfloat16":
            import ml_dtypes
            return np.asarray(x).astype(ml_dtypes.bfloat16)
        return np.asarray(x, dtype=bool if dtype is None else dtype)

    def from_native(self, y):
        y = np.asarray(y)
        return y.astype(np.float32) if y.dtype.name == "bfloat16" else y


class KerasTorch(_Keras):
    """keras.ops.dot_product_attention with KERAS_BACKEND=torch; gradients by torch.autograd."""

    name = "keras-torch"
    keras_backend = "torch"
    capabilities = _caps(True)
    semantics = Semantics(output_dtypes=_POLICY, notes=_NOTES + (
        "a bias and a mask together: Keras' torch backend raises ('Only one of `bias` and `mask`'): declined",), deviations=(
        Deviation("*", "Keras' torch backend folds the causal triangle into a boolean mask but hands a bias to "
                  "torch's SDPA together with is_causal=True; with one KV head (not repeated) torch raises "
                  "('Explicit attn_mask should not be set when is_causal=True') (docs/findings.md: "
                  "keras-torch-bias-causal)", problems=r"Hkv=1 [^)]*is_causal=True[^)]*bias=",
                  when="Explicit attn_mask should not be set when is_causal=True"),))

    def to_native(self, x, dtype):
        t = self.framework.from_numpy(np.ascontiguousarray(x))
        return t if dtype is None else t.to(getattr(self.framework, dtype))

    def from_native(self, y):
        y = y.detach()
        return (y.float() if y.dtype == self.framework.bfloat16 else y).cpu().numpy()

    def native_dtype(self, y):
        return str(y.dtype).replace("torch.", "")

    def _attention(self, q, k, v, call, bias=None, mask=None):
        if bias is not None and mask is not None:
            raise Unsupported(f"{self.name}: Keras' torch backend takes a bias or a mask, not both "
                              "('Only one of `bias` and `mask` can be provided')")
        return super()._attention(q, k, v, call, bias, mask)

    def native_attention(self, q, k, v, call):
        with self.framework.no_grad():
            return super().native_attention(q, k, v, call)

    def native_attention_backward(self, q, k, v, grad_out, call):
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        y = super().native_attention(*leaves, call)  # (B, T, N, H) in the output dtype (float32 for float64)
        return self.framework.autograd.grad(y, leaves, grad_out.to(y.dtype))


class KerasJax(_Keras):
    """keras.ops.dot_product_attention with KERAS_BACKEND=jax, called eagerly as keras.ops runs it
    (jitted, XLA:CPU cannot compile its 16-bit dot products); gradients by jax.vjp.  float64 runs in
    JAX's x64 mode, scoped to the call; JAX's compilation cache follows ATTNSPEC_JAX_CACHE."""

    name = "keras-jax"
    keras_backend = "jax"
    compiles_per_shape = True  # eager JAX compiles each op per shape and dtype on first sight
    capabilities = _caps(True)

    def load(self):
        super().load()
        from attnspec.backends import jax_programs
        jax_programs.from_environment(self.framework)

    def _x64(self, dtype):
        return self.framework.enable_x64(True) if np.dtype(dtype) == np.float64 else contextlib.nullcontext()

    def to_native(self, x, dtype):
        x = np.asarray(x).astype(self.framework.numpy.dtype(dtype or bool))
        with self._x64(x.dtype):
            return self.framework.device_put(x)

    def from_native(self, y):
        y = np.asarray(y)
        return y.astype(np.float32) if y.dtype.name == "bfloat16" else y

    def sync(self, y):
        y.block_until_ready()

    def native_attention(self, q, k, v, call):
        with self._x64(q.dtype):
            return super().native_attention(q, k, v, call)

    def native_attention_backward(self, q, k, v, grad_out, call):
        with self._x64(q.dtype):
            y, pullback = self.framework.vjp(lambda a, b, c: self._attention(a, b, c, call, call.bias, call.mask),
                                             q, k, v)
            return pullback(grad_out.astype(y.dtype))  # the cotangent in the output's dtype
