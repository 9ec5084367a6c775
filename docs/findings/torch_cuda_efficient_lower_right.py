"""PyTorch (CUDA): the memory-efficient SDPA kernel with causal_lower_right and Lq > Lk applies no
causal mask at all (seen with torch 2.11 on an H200: with Lq = 9, Lk = 8 every row weights all 8 keys).

Bottom-right alignment with Lq > Lk hides keys from the first rows; the kernel's rows each weigh
every key.  Needs a CUDA device (exit 77 without).
"""
from _common import attention, need, verdict

torch = need("torch")
if not torch.cuda.is_available():
    print("SKIPPED: no CUDA device")
    raise SystemExit(77)
import numpy as np  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.attention.bias import causal_lower_right  # noqa: E402

rng = np.random.default_rng(0)
Lq, Lk = 9, 8
q, k, v = (rng.standard_normal((1, 1, L, 16)) for L in (Lq, Lk, Lk))
with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
    out = torch.nn.functional.scaled_dot_product_attention(
        *(torch.tensor(x, dtype=torch.float16, device="cuda") for x in (q, k, v)), attn_mask=causal_lower_right(Lq, Lk))
out = out.float().cpu().numpy()
unmasked = attention(q, k, v)
verdict(np.allclose(out[..., -1, :], unmasked[..., -1, :], atol=1e-2) and np.allclose(out, unmasked, atol=1e-2),
        f"torch {torch.__version__}: every row equals the unmasked attention")
