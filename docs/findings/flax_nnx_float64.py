"""Flax NNX: flax.nnx.dot_product_attention computes float64 input in float32.

Undocumented in its docstring; it hands the call to jax.nn.dot_product_attention, whose softmax runs
in float32: the float64 result differs from a float64 reference by ~1e-8 (float64 rounding: ~1e-16).
"""
from _common import attention, need, verdict

jax = need("jax")
nnx = need("flax.nnx")
import flax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 2, 16, 16)) for _ in range(3))  # (B, H, L, E)
with jax.enable_x64(True):
    out = nnx.dot_product_attention(*(jnp.swapaxes(jnp.asarray(x), 1, 2) for x in (q, k, v)))  # float64
    out = np.swapaxes(np.asarray(out), 1, 2)
err = float(np.abs(out - attention(q, k, v)).max())
verdict(out.dtype == np.float64 and err > 1e-12,
        f"flax {flax.__version__}, jax {jax.__version__}: float64 output, max error {err:.3g} against float64")
