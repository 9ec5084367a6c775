"""Keras 3 (torch backend): keras.ops.dot_product_attention(bias=..., is_causal=True) raises with one
key/value head (multi-query attention).

The docstring takes a bias, is_causal and K = 1 together.  The torch backend folds causality into a
boolean mask only; a bias goes to torch's SDPA as attn_mask together with is_causal=True, and with one
KV head (not repeated: K > 1 is) torch refuses it ("Explicit attn_mask should not be set when
is_causal=True").  With K = N the same call runs.
"""
import os

from _common import need, verdict

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = need("keras")
torch = need("torch")
import numpy as np  # noqa: E402

if keras.backend.backend() != "torch":
    print(f"SKIPPED: KERAS_BACKEND is {keras.backend.backend()}, this finding is the torch backend's")
    raise SystemExit(77)
rng = np.random.default_rng(0)
q = torch.tensor(rng.standard_normal((1, 4, 2, 8)), dtype=torch.float32)  # (B, T, N=2, H)
kv = torch.tensor(rng.standard_normal((1, 4, 1, 8)), dtype=torch.float32)  # (B, S, K=1, H)
bias = torch.zeros((1, 2, 4, 4))  # (B, N, T, S)
keras.ops.dot_product_attention(q, kv, kv, bias=bias)  # runs without is_causal
keras.ops.dot_product_attention(q, kv, kv, is_causal=True)  # and without the bias
try:
    out = keras.ops.dot_product_attention(q, kv, kv, bias=bias, is_causal=True)
    verdict(False, f"keras {keras.__version__} returned shape {tuple(out.shape)}")
except RuntimeError as e:
    verdict(True, f"keras {keras.__version__}, torch {torch.__version__}, one KV head, a bias and is_causal=True: "
                  f"RuntimeError: {e}")
