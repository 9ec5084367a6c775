"""transformers: sdpa_attention_forward drops is_causal for a one-row query and with any mask.

is_causal = q_length > 1 and attention_mask is None and is_causal: a decode step (Lq = 1) sees
every key (bottom-right, as a KV cache wants) while 1 < Lq < Lk is top-left (keys past Lq are
cropped); with a mask, is_causal is ignored (an all-visible mask with is_causal=True attends to
every key).  Undocumented in the function's signature.  Each output is matched against the
three answers it could be (top-left causal, bottom-right causal, no causal mask), which differ
at these shapes (for Lq = 1 bottom-right is no causal mask); the finding holds when the alignments are exactly these three.
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
LK = 4
k, v = (rng.standard_normal((1, 1, LK, 8)) for _ in range(2))


def alignment(Lq: int, mask=None) -> str:
    """Which answer sdpa_attention_forward(is_causal=True) gives for an Lq-row query and 4 keys."""
    q = rng.standard_normal((1, 1, Lq, 8))
    given = None if mask is None else torch.tensor(mask)
    out, _ = sdpa_attention_forward(module, *(torch.tensor(x) for x in (q, k, v)), given, is_causal=True)
    out = out.transpose(1, 2).numpy()
    answers = {"top_left": np.tril(np.ones((Lq, LK), dtype=bool)),
               "bottom_right": np.tril(np.ones((Lq, LK), dtype=bool), k=LK - Lq),
               "not_causal": np.ones((Lq, LK), dtype=bool)}
    if Lq == 1:  # one row: bottom-right sees every key, the same answer as no causal mask
        del answers["not_causal"]
    matches = [name for name, m in answers.items() if np.allclose(out, attention(q, k, v, mask=m))]
    return matches[0] if len(matches) == 1 else f"other ({matches})"


seen = {"Lq=1": alignment(1), "Lq=3": alignment(3),
        "Lq=3, an all-visible mask": alignment(3, mask=np.ones((1, 1, 3, LK), dtype=bool))}
expected = {"Lq=1": "bottom_right", "Lq=3": "top_left", "Lq=3, an all-visible mask": "not_causal"}
verdict(seen == expected, f"transformers {transformers.__version__}, is_causal=True with 4 keys: "
        + ", ".join(f"{case} is {answer}" for case, answer in seen.items()))
