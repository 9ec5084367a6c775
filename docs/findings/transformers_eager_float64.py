"""transformers: eager_attention_forward computes float64 input in float32.

softmax(attn_weights, dim=-1, dtype=torch.float32) - commented "upcast attention to fp32" - is a
downcast for float64 input: the float64 result differs from a float64 reference by ~1e-8.
"""
import types

from _common import attention, need, verdict

torch = need("torch")
need("transformers")
import numpy as np  # noqa: E402
import transformers  # noqa: E402
from transformers.models.llama.modeling_llama import eager_attention_forward  # noqa: E402

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 2, 16, 16)) for _ in range(3))  # (B, H, L, E) float64
module = types.SimpleNamespace(num_key_value_groups=1, training=False)
out, _ = eager_attention_forward(module, *(torch.tensor(x) for x in (q, k, v)), None, scaling=16 ** -0.5)
out = out.transpose(1, 2).numpy()
err = float(np.abs(out - attention(q, k, v)).max())
verdict(out.dtype == np.float64 and err > 1e-12,
        f"transformers {transformers.__version__}: float64 output, max error {err:.3g} against float64")
