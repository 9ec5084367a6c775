"""Keras 3 (NumPy backend): keras.ops.dot_product_attention raises on grouped KV heads.

Its docstring: "key: (B, S, K, H). When K equals N, multi-headed attention (MHA) is performed.
Otherwise, grouped query attention (GQA) is performed if N is a multiple of K."  The NumPy
backend computes the logits with einsum("BTNH,BSNH->BNTS", ...), which needs K == N.
"""
import os

from _common import need, verdict

os.environ.setdefault("KERAS_BACKEND", "numpy")
keras = need("keras")
import numpy as np  # noqa: E402

rng = np.random.default_rng(0)
q = rng.standard_normal((1, 3, 4, 8)).astype("float32")  # (B, T, N=4, H)
kv = rng.standard_normal((1, 5, 2, 8)).astype("float32")  # (B, S, K=2, H): N is a multiple of K
if keras.backend.backend() != "numpy":
    print(f"SKIPPED: KERAS_BACKEND is {keras.backend.backend()}, this finding is the NumPy backend's")
    raise SystemExit(77)
try:
    out = keras.ops.dot_product_attention(q, kv, kv)
    verdict(False, f"keras {keras.__version__} returned shape {np.shape(out)}")
except ValueError as e:
    verdict(True, f"keras {keras.__version__}, NumPy backend, N=4 query heads on K=2 KV heads: ValueError: {e}")
