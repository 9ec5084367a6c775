"""JAX backends: jnp ops (jax-naive) and jax.nn.dot_product_attention (jax-dpa, -cudnn).

jax is imported in ``load``.  float64 needs JAX's x64 mode: it is switched on with
``jax.enable_x64`` around each conversion and call, never globally.  Each backend jits
its forward and its vjp once per (is_causal, scale) and reuses them; jit itself caches
per shape and dtype, so a benchmark's timed call never retraces.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from .base import Backend, BackendUnavailable, Capabilities, Semantics, Unsupported

_ALL = ("float16", "bfloat16", "float32", "float64")


class JaxBackend(Backend):
    """Conversion, x64 scoping, jit caching and vjp; subclasses define `_attend` in jnp."""

    platform = "cpu"
    compiles_per_shape = True  # the first call at a new shape or dtype traces and compiles
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=True)

    def load(self):
        try:
            import jax
            import jax.numpy as jnp
        except ImportError as e:
            raise BackendUnavailable(f"jax is not installed ({e})") from None
        self.jax, self.jnp = jax, jnp
        try:
            self.jax_device = jax.devices(self.platform)[0]
        except RuntimeError:
            raise BackendUnavailable(f"no {self.platform.upper()} device for JAX") from None
        if not hasattr(self, "_compiled"):
            self._compiled = {}

    def _x64(self, wide: bool):
        if not wide:
            return contextlib.nullcontext()
        scoped = getattr(self.jax, "enable_x64", None)  # jax >= 0.8; older: jax.experimental's
        if scoped is None:
            from jax.experimental import enable_x64 as scoped
        return scoped(True)

    def to_native(self, x, dtype):
        with self._x64(dtype == "float64"):
            return self.jax.device_put(self.jnp.asarray(x, dtype=dtype or bool), self.jax_device)

    def from_native(self, y):
        y = np.asarray(y)
        return y.astype(np.float32) if y.dtype.name == "bfloat16" else y  # exact widening

    def sync(self, y):
        y.block_until_ready()

    def _jitted(self, op, is_causal, scale):
        key = (op, is_causal, scale)
        if key not in self._compiled:
            def forward(q, k, v, mask):
                return self._attend(q, k, v, mask, is_causal, scale)  # (..., Lq, Ev)

            def backward(q, k, v, grad_out, mask):
                _, pullback = self.jax.vjp(lambda a, b, c: forward(a, b, c, mask), q, k, v)
                return pullback(grad_out)  # (dq, dk, dv), each shaped like its input

            self._compiled[key] = self.jax.jit(forward if op == "forward" else backward)
        return self._compiled[key]

    def native_forward(self, q, k, v, mask, is_causal, scale):
        with self._x64(q.dtype == np.float64):
            return self._jitted("forward", is_causal, scale)(q, k, v, mask)

    def native_backward(self, q, k, v, grad_out, mask, is_causal, scale):
        with self._x64(q.dtype == np.float64):
            return tuple(self._jitted("backward", is_causal, scale)(q, k, v, grad_out, mask))


class JaxNaive(JaxBackend):
    """The textbook computation in jnp; a guarded row max keeps empty rows at zero."""

    name = "jax-naive"
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left")

    def _attend(self, q, k, v, mask, is_causal, scale):
        jnp, lax = self.jnp, self.jax.lax
        sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        s = (q @ jnp.swapaxes(k, -1, -2)) * jnp.asarray(sc, q.dtype)  # (..., Lq, Lk)
        vis = jnp.ones(s.shape[-2:], dtype=bool)  # (Lq, Lk) fused away by XLA
        if is_causal:
            vis = jnp.tril(vis)  # (Lq, Lk) top-left: key j <= query i
        if mask is not None:
            vis = vis & mask  # (..., Lq, Lk)
        s = jnp.where(vis, s, -jnp.inf)  # (..., Lq, Lk)
        row_max = lax.stop_gradient(s.max(axis=-1, keepdims=True))  # (..., Lq, 1)
        row_max = jnp.where(jnp.isfinite(row_max), row_max, 0)
        e = jnp.exp(s - row_max)  # (..., Lq, Lk) exp(-inf) = 0 on hidden pairs
        total = e.sum(axis=-1, keepdims=True)  # (..., Lq, 1)
        return (e / jnp.where(total == 0, 1, total)) @ v  # (..., Lq, Ev)


class JaxDpa(JaxBackend):
    """jax.nn.dot_product_attention(implementation='xla'); layout (B, T, N, H) in the adapter."""

    name = "jax-dpa"
    implementation = "xla"
    # float16 on CPU: XLA:CPU has no float16 dot with float32 accumulation (jax 0.10.2 raises
    # "precision 'F16_F16_F32' is not supported by dot_general on CPU")
    capabilities = Capabilities(dtypes=("bfloat16", "float32", "float64"), device="cpu", gradients=True,
                                equal_head_dims=True)
    semantics = Semantics(
        fully_masked="mean_of_values", causal_alignment="top_left", effective_precision="float32",
        notes=("softmax runs in float32 even for float64 input (jax _dot_product_attention_core): "
               "float64 results are float32-accurate",
               "masks with a large finite negative, so an all-masked row averages the values",
               "no float16 on CPU (XLA:CPU lacks the float16 dot it asks for)",
               "bfloat16 with Lq = Lk = 1 on CPU: XLA:CPU fails to compile it "
               "(ALG_DOT_BF16_BF16_F32 not supported by the ElementalIrEmitter): declared unsupported"))

    def native_forward(self, q, k, v, mask, is_causal, scale):
        self._refuse_degenerate_bf16(q, k)
        return super().native_forward(q, k, v, mask, is_causal, scale)

    def native_backward(self, q, k, v, grad_out, mask, is_causal, scale):
        self._refuse_degenerate_bf16(q, k)
        return super().native_backward(q, k, v, grad_out, mask, is_causal, scale)

    def _refuse_degenerate_bf16(self, q, k):
        # jax 0.10.2, XLA:CPU: a 1x1 bfloat16 score matrix lowers to an elemental dot that
        # cannot accumulate in float32 and the compile fails; other shapes run.
        if self.platform == "cpu" and str(q.dtype) == "bfloat16" and q.shape[-2] == k.shape[-2] == 1:
            raise Unsupported(f"{self.name}: XLA:CPU cannot compile a bfloat16 call with Lq = Lk = 1 "
                              "(ALG_DOT_BF16_BF16_F32 not supported by the ElementalIrEmitter)")

    def _attend(self, q, k, v, mask, is_causal, scale):
        jnp = self.jnp
        batch = jnp.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        Lq, Lk = q.shape[-2], k.shape[-2]
        lead = (math.prod(batch[:-1]), batch[-1]) if batch else (1, 1)  # (B, N)

        def bthn(x):
            x = jnp.broadcast_to(x, batch + x.shape[-2:]).reshape(lead + x.shape[-2:])  # (B, N, L, H)
            return jnp.swapaxes(x, 1, 2)  # (B, L, N, H)

        if mask is not None:
            mask = jnp.broadcast_to(mask, batch + (Lq, Lk)).reshape(lead + (Lq, Lk))  # (B, N, Lq, Lk)
        y = self.jax.nn.dot_product_attention(bthn(q), bthn(k), bthn(v), mask=mask, scale=scale,
                                             is_causal=is_causal, implementation=self.implementation)  # (B, Lq, N, Ev)
        return jnp.swapaxes(y, 1, 2).reshape(batch + (Lq, v.shape[-1]))  # (..., Lq, Ev)


class JaxDpaCudnn(JaxDpa):
    name, implementation, platform = "jax-dpa-cudnn", "cudnn", "gpu"
    capabilities = Capabilities(dtypes=("float16", "bfloat16"), device="gpu", gradients=True, equal_head_dims=True)
    semantics = Semantics(fully_masked=None, causal_alignment="top_left",
                          notes=("cuDNN fused attention; declared from JAX's documentation, "
                                 "not verified on this machine",))
