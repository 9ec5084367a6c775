"""Flax: ``flax.linen.dot_product_attention`` and ``flax.nnx.dot_product_attention`` (on JAX).

What their documentation says (Flax 0.12): query, key, value shaped [batch..., length, heads,
depth], key and value with the query's number of heads; ``bias`` and a boolean ``mask`` (False =
masked out) broadcastable to [batch..., heads, q_length, kv_length]; no scale argument - the
query is divided by sqrt(depth), so another scale is the caller's to fold into the query (the
adapter passes q * scale * sqrt(depth), as a user would); linen has no causal flag (causality is a
mask: ``flax.linen.make_attention_mask(q_pos, kv_pos, jnp.greater_equal)``, which the adapter
builds for positions 0..Lq-1 and 0..Lk-1, top-left), nnx has ``is_causal``.  nnx hands the call to
``jax.nn.dot_product_attention`` when there is no dropout; linen computes it itself.  Nothing is
said of a fully masked row (linen fills masked logits with the dtype's most negative finite value)
or of the alignment: the suite records them.  float64 runs in JAX's x64 mode, scoped to the call;
gradients by jax.vjp; JAX's compilation cache follows ATTNSPEC_JAX_CACHE.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from attnspec.backends.base import Backend, BackendUnavailable, Capabilities, Semantics, Unsupported

_ALL = ("float16", "bfloat16", "float32", "float64")
_NOTES = ("layout [batch, length, heads, depth]: declared (length_before_heads); the arrays are swapped on the host, "
          "never in the call",
          "no scale argument: the query is divided by sqrt(depth); another scale is folded into the query "
          "(q * scale * sqrt(depth)), as a caller would")


class _Flax(Backend):
    compiles_per_shape = True  # eager JAX compiles each op per shape and dtype on first sight
    length_before_heads = True  # [batch..., length, heads, depth]
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=True, features=frozenset({"bias"}))

    def load(self):
        try:
            import jax
            import jax.numpy as jnp
            from flax import linen, nnx
        except ImportError as e:
            raise BackendUnavailable(f"flax is not installed ({e}); pip install 'attnspec[zoo]'") from None
        from attnspec.backends import jax_programs
        self.jax, self.jnp, self.linen, self.nnx = jax, jnp, linen, nnx
        jax_programs.from_environment(jax)

    def _x64(self, dtype):
        return self.jax.enable_x64(True) if np.dtype(dtype) == np.float64 else contextlib.nullcontext()

    def to_native(self, x, dtype):
        x = np.asarray(x).astype(self.jnp.dtype(dtype or bool))
        with self._x64(x.dtype):
            return self.jax.device_put(x)

    def from_native(self, y):
        y = np.asarray(y)
        return y.astype(np.float32) if y.dtype.name == "bfloat16" else y

    def sync(self, y):
        y.block_until_ready()

    def _query(self, q, scale):
        """The query Flax divides by sqrt(depth): multiplied by scale * sqrt(depth) for another scale."""
        if scale is None:
            return q
        return q * self.jnp.asarray(scale * math.sqrt(q.shape[-1]), dtype=q.dtype)

    def _attention(self, q, k, v, call):  # (B, L, H, E) in and out
        return self._flax(self._query(q, call.scale), k, v, call)

    def native_attention(self, q, k, v, call):
        with self._x64(q.dtype):
            return self._attention(q, k, v, call)

    def native_attention_backward(self, q, k, v, grad_out, call):
        with self._x64(q.dtype):
            _, pullback = self.jax.vjp(lambda a, b, c: self._attention(a, b, c, call), q, k, v)
            return pullback(grad_out)


class FlaxLinen(_Flax):
    """flax.linen.dot_product_attention; causal through the library's make_attention_mask."""

    name = "flax-linen"
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=True, features=frozenset({"bias"}),
                                mask_with_causal=True)
    semantics = Semantics(notes=_NOTES + ("linen has no causal flag: the adapter builds the library's own "
                                          "make_attention_mask(arange(Lq), arange(Lk), jnp.greater_equal)",))

    def _flax(self, q, k, v, call):
        mask = call.mask
        if call.is_causal:
            Lq, Lk = q.shape[-3], k.shape[-3]
            causal = self.linen.make_attention_mask(self.jnp.arange(Lq), self.jnp.arange(Lk),
                                                    self.jnp.greater_equal)  # (1, Lq, Lk)
            mask = causal if mask is None else self.jnp.logical_and(mask, causal)
        return self.linen.dot_product_attention(q, k, v, bias=call.bias, mask=mask, deterministic=True)


class FlaxNnx(_Flax):
    """flax.nnx.dot_product_attention (no dropout: jax.nn.dot_product_attention underneath).

    Its docstring takes a value depth of its own (v_depth_per_head), but the jax.nn path it takes
    refuses Ev != E ("value shape should be ..."): such a call is declined with that reason
    (docs/findings.md: flax-nnx-value-depth).  jax.nn's softmax runs in float32, float64 input too:
    float64 results are float32-accurate (declared)."""

    name = "flax-nnx"
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=True, features=frozenset({"bias"}),
                                mask_with_causal=True)
    semantics = Semantics(effective_precision="float32", notes=_NOTES + (
        "float64 is float32-accurate: nnx hands the call to jax.nn.dot_product_attention, whose softmax runs in "
        "float32",
        "Ev != E is declined: the docstring allows v_depth_per_head, jax.nn's path refuses it (a finding)"))

    def _flax(self, q, k, v, call):
        try:
            return self.nnx.dot_product_attention(q, k, v, bias=call.bias, mask=call.mask, is_causal=call.is_causal,
                                                  deterministic=True)
        except ValueError as e:
            if "value shape should be" in str(e):
                raise Unsupported(f"{self.name}: a value depth other than the key's, which its docstring allows, "
                                  f"is refused by the jax.nn path it takes: {e}") from None
            raise
