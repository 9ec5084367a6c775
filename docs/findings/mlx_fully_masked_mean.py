"""MLX: mlx.core.fast.scaled_dot_product_attention gives a fully masked row the mean of the values.

A boolean mask that hides every key of a query row: the docstring says nothing of such a row;
the result is the mean of V (as if every score were equal), not NaN (softmax over nothing) or zeros.
"""
from _common import need, verdict

mx = need("mlx.core")
import numpy as np  # noqa: E402

rng = np.random.default_rng(0)
q, k = (mx.array(rng.standard_normal((1, 1, 3, 4)).astype("float32")) for _ in range(2))
v = mx.array((rng.standard_normal((1, 1, 3, 4)) + 2).astype("float32"))
mask = np.ones((1, 1, 3, 3), dtype=bool)
mask[..., 1, :] = False  # query 1 sees nothing
out = np.array(mx.fast.scaled_dot_product_attention(q, k, v, scale=0.5, mask=mx.array(mask)))
mean = np.array(v).mean(axis=-2)[..., 0, :]
verdict(np.allclose(out[..., 1, :], mean, atol=1e-5), f"mlx {mx.__version__}: row 1 = {out[0, 0, 1].round(4).tolist()}, "
        f"mean of V = {mean[0].round(4).tolist()}")
