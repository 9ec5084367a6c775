"""MLX: ``mlx.core.fast.scaled_dot_product_attention`` (the CPU build, ``pip install "mlx[cpu]"`` on Linux).

What its documentation says (MLX 0.32): q [B, N_q, T_q, D], k and v [B, N_kv, T_kv, D] (the same
D: Ev = E), grouped and multi-query attention without tiling K/V; ``scale`` is required; ``mask``
is an array - boolean or additive, broadcastable to [B, N, T_q, T_kv] - or the string
``"causal"``, which "uses lower-right alignment where the last query aligns with the last key"
(declared: bottom-right), never both; "the softmax operation is performed in float32 regardless of
the input precision" (declared: float64 is float32-accurate).  A mask with a causal problem is the
causal triangle folded into the mask (by the suite); a bias is an additive mask (-inf where a
boolean mask hides).  Gradients: ``mlx.core.vjp``.

Attention sinks (issue 31): MLX 0.32's signature has ``sinks: array | None`` - measured here on 0.32.4: one
logit per query head ``[N_q]``, in the denominator only (the reference's output within float32's rounding,
with grouped heads, "causal" and masks), an empty row 0 when its head's sink is finite, and ``mx.vjp``
differentiates it (dSink as `specs.reference.dsink`).  It refuses sinks whose type does not promote to
the output's ("Type of sinks must promote to output type float16"): for 16-bit inputs the sinks are
rounded to the input dtype here (a note, and the sinks' budget judges it); it returns no LSE, so
``lse_with_sinks`` has nothing to declare.
"""
from __future__ import annotations

import math

import numpy as np

from attnspec.backends.base import Backend, BackendUnavailable, Capabilities, Semantics


class MlxFastSdpa(Backend):
    """mlx.core.fast.scaled_dot_product_attention on MLX's CPU device."""

    name = "mlx-sdpa"
    capabilities = Capabilities(dtypes=("float16", "bfloat16", "float32", "float64"), device="cpu", gradients=True,
                                features=frozenset(("gqa", "bias", "sinks")), equal_head_dims=True,
                                mask_with_causal=False)
    semantics = Semantics(causal_alignment="bottom_right", effective_precision="float32", notes=(
        "mask='causal' is bottom-right (the docstring: the last query aligns with the last key)",
        "the softmax runs in float32 whatever the input (the docstring): float64 is float32-accurate",
        "a mask and 'causal' are never passed together: the suite folds the triangle into the mask",
        "a bias is an additive mask; with a boolean mask, -inf where it hides",
        "sinks are passed in the input dtype (MLX refuses a wider type for 16-bit inputs): rounded to it"))

    def load(self):
        try:
            import mlx.core as mx
        except ImportError as e:
            raise BackendUnavailable(f"mlx is not installed ({e}); pip install 'mlx[cpu]' (attnspec[zoo])") from None
        self.mx = mx

    def to_native(self, x, dtype):
        if dtype is None:
            return self.mx.array(np.asarray(x, dtype=bool))
        if dtype == "bfloat16":  # exact: the suite's values are bfloat16 numbers
            return self.mx.array(np.asarray(x, dtype=np.float32)).astype(self.mx.bfloat16)
        return self.mx.array(np.asarray(x, dtype=dtype), dtype=getattr(self.mx, dtype))

    def from_native(self, y):
        mx = self.mx
        return np.array(y.astype(mx.float32) if y.dtype == mx.bfloat16 else y)

    def native_dtype(self, y):
        return str(y.dtype).replace("mlx.core.", "")

    def sync(self, y):
        self.mx.eval(y)

    def _mask(self, call):
        """The mask argument: "causal", an array (boolean, or additive for a bias), or None."""
        mx = self.mx
        if call.bias is None:
            return "causal" if call.is_causal else call.mask
        if call.mask is None:
            return call.bias
        return mx.where(call.mask, call.bias, mx.array(-math.inf, dtype=call.bias.dtype))

    def _sinks(self, call, q):
        """(N_q,) in the input dtype, or None: MLX requires the sinks' type to promote to the output's."""
        return None if call.sinks is None else call.sinks.astype(q.dtype)

    def _attention(self, q, k, v, call, sinks=None):
        scale = call.scale if call.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        return self.mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=self._mask(call), sinks=sinks)

    def native_attention(self, q, k, v, call):
        y = self._attention(q, k, v, call, self._sinks(call, q))
        self.mx.eval(y)
        return y

    def native_attention_backward(self, q, k, v, grad_out, call):
        """(dq, dk, dv), and dSink (N_q,) last when the call has sinks (mx.vjp differentiates them)."""
        sinks = self._sinks(call, q)
        primals = [q, k, v] + ([] if sinks is None else [sinks])
        _, grads = self.mx.vjp(lambda a, b, c, *s: self._attention(a, b, c, call, *s), primals, [grad_out])
        self.mx.eval(grads)
        return tuple(grads)
