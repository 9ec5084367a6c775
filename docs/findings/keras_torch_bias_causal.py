"""Keras 3 (torch backend): keras.ops.dot_product_attention(bias=..., is_causal=True) raises with one
key/value head (multi-query attention).

The docstring takes a bias, is_causal and K = 1 together.  The torch backend folds causality into a
boolean mask only; a bias goes to torch's SDPA as attn_mask together with is_causal=True, and with one
KV head (not repeated: K > 1 is) torch refuses it ("Explicit attn_mask should not be set when
is_causal=True").  The controls: the same K = 1 call without is_causal, or without the bias, runs;
and K = 2 KV heads (N = 4 query heads) with the bias and is_causal=True runs and matches the
reference (bias added, top-left causal mask).
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
T = S = 4
q = torch.tensor(rng.standard_normal((1, T, 4, 8)), dtype=torch.float32)  # (B, T, N=4, H)
bias_np = rng.standard_normal((1, 4, T, S))  # (B, N, T, S)
bias = torch.tensor(bias_np, dtype=torch.float32)
causal = np.tril(np.ones((T, S), dtype=bool))


def reference(kv_heads):
    """Attention with the bias added and the top-left causal mask, KV head h // (N / K) per query head."""
    k = np.repeat(np.swapaxes(kv_heads.numpy(), 1, 2), 4 // kv_heads.shape[2], axis=1)
    s = np.swapaxes(q.numpy(), 1, 2).astype(np.float64) @ np.swapaxes(k, -1, -2) / np.sqrt(8) + bias_np
    s = np.where(causal, s, -np.inf)  # softmax(q k^T / sqrt(H) + bias) over the visible keys
    w = np.exp(s - s.max(-1, keepdims=True))
    return np.swapaxes((w / w.sum(-1, keepdims=True)) @ k, 1, 2)


one = torch.tensor(rng.standard_normal((1, S, 1, 8)), dtype=torch.float32)  # (B, S, K=1, H)
two = torch.tensor(rng.standard_normal((1, S, 2, 8)), dtype=torch.float32)  # (B, S, K=2, H)
keras.ops.dot_product_attention(q, one, one, bias=bias)  # K = 1 runs without is_causal
keras.ops.dot_product_attention(q, one, one, is_causal=True)  # and without the bias
grouped = keras.ops.dot_product_attention(q, two, two, bias=bias, is_causal=True)  # K = 2: both together
grouped_right = np.allclose(np.asarray(grouped), reference(two), atol=1e-5)
try:
    out = keras.ops.dot_product_attention(q, one, one, bias=bias, is_causal=True)
    verdict(False, f"keras {keras.__version__} returned shape {tuple(out.shape)} "
            f"(matches the reference: {np.allclose(np.asarray(out), reference(one), atol=1e-5)})")
except RuntimeError as e:
    verdict("Explicit attn_mask should not be set when is_causal=True" in str(e) and grouped_right,
            f"keras {keras.__version__}, torch {torch.__version__}, one KV head, a bias and is_causal=True: "
            f"RuntimeError: {e}; K = 2 with both runs and matches the reference: {grouped_right}")
