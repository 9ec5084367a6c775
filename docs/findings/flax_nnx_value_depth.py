"""Flax NNX: flax.nnx.dot_product_attention refuses a value depth other than the key's.

Its docstring: "value: values to be used in attention with shape of [batch..., kv_length,
num_heads, v_depth_per_head]".  Without dropout it hands the call to
jax.nn.dot_product_attention, which requires value's shape to equal key's.
"""
from _common import need, verdict

need("jax")
nnx = need("flax.nnx")
import flax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

rng = np.random.default_rng(0)
q = jnp.asarray(rng.standard_normal((1, 3, 2, 8)), dtype=jnp.float32)  # [batch, q_length, heads, depth]
k = jnp.asarray(rng.standard_normal((1, 5, 2, 8)), dtype=jnp.float32)
v = jnp.asarray(rng.standard_normal((1, 5, 2, 4)), dtype=jnp.float32)  # v_depth_per_head = 4
try:
    out = nnx.dot_product_attention(q, k, v)
    verdict(False, f"flax {flax.__version__} returned shape {out.shape}")
except ValueError as e:
    verdict(True, f"flax {flax.__version__}, v_depth 4 with qk depth 8: ValueError: {e}")
