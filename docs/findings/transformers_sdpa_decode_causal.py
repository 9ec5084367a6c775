"""transformers: sdpa_attention_forward drops is_causal for a one-row query.

is_causal = q_length > 1 and attention_mask is None and is_causal: a decode step (Lq = 1) sees
every key (bottom-right, as a KV cache wants) while 1 < Lq < Lk is top-left (keys past Lq are
cropped); with a mask, is_causal is ignored.  Undocumented in the function's signature.
"""
import types

from _common import attention, need, verdict

torch = need("torch")
need("transformers")
import numpy as np  # noqa: E402
import transformers  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

rng = np.random.default_rng(0)
module = types.SimpleNamespace(num_key_value_groups=1, is_causal=True, training=False)
k, v = (rng.standard_normal((1, 1, 4, 8)) for _ in range(2))
seen = {}
for Lq in (1, 3):
    q = rng.standard_normal((1, 1, Lq, 8))
    out, _ = sdpa_attention_forward(module, *(torch.tensor(x) for x in (q, k, v)), None, is_causal=True)
    out = out.transpose(1, 2).numpy()
    top_left = attention(q, k, v, mask=np.tril(np.ones((Lq, 4), dtype=bool)))
    bottom_right = attention(q, k, v, mask=np.tril(np.ones((Lq, 4), dtype=bool), k=4 - Lq))
    seen[Lq] = "top_left" if np.allclose(out, top_left) else "bottom_right" if np.allclose(out, bottom_right) else "other"
verdict(seen[1] != seen[3], f"transformers {transformers.__version__}, is_causal=True with 4 keys: "
        f"Lq=1 is {seen[1]}, Lq=3 is {seen[3]}")
