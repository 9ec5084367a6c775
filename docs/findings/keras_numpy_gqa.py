"""Keras 3 (NumPy backend): keras.ops.dot_product_attention raises on grouped KV heads.

Its docstring: "key: (B, S, K, H). When K equals N, multi-headed attention (MHA) is performed.
Otherwise, grouped query attention (GQA) is performed if N is a multiple of K."  The NumPy
backend computes the logits with einsum("BTNH,BSNH->BNTS", ...), which needs K == N: NumPy's
"operands could not be broadcast".  The control: the same problem with the KV heads repeated
(K == N, query head h on KV head h // 2, what GQA means) runs and matches the reference.
"""
import os

from _common import attention, need, verdict

os.environ.setdefault("KERAS_BACKEND", "numpy")
keras = need("keras")
import numpy as np  # noqa: E402

if keras.backend.backend() != "numpy":
    print(f"SKIPPED: KERAS_BACKEND is {keras.backend.backend()}, this finding is the NumPy backend's")
    raise SystemExit(77)
rng = np.random.default_rng(0)
q = rng.standard_normal((1, 3, 4, 8)).astype("float32")  # (B, T, N=4, H)
kv = rng.standard_normal((1, 5, 2, 8)).astype("float32")  # (B, S, K=2, H): N is a multiple of K
repeated = np.repeat(kv, 2, axis=2)  # K = N: query head h reads KV head h // 2
heads_first = [np.swapaxes(x, 1, 2) for x in (q, repeated, repeated)]  # (B, N, T, H)
control = np.swapaxes(np.asarray(keras.ops.dot_product_attention(q, repeated, repeated)), 1, 2)
control_right = np.allclose(control, attention(*heads_first), atol=1e-5)
try:
    out = keras.ops.dot_product_attention(q, kv, kv)
    verdict(False, f"keras {keras.__version__} returned shape {np.shape(out)} (matches GQA: "
            f"{np.allclose(np.swapaxes(np.asarray(out), 1, 2), attention(*heads_first), atol=1e-5)})")
except ValueError as e:
    verdict("could not be broadcast" in str(e) and control_right,
            f"keras {keras.__version__}, NumPy backend, N=4 query heads on K=2 KV heads: ValueError: {e}; "
            f"the KV heads repeated to K=N: matches the reference {control_right}")
