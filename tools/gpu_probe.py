"""What PyTorch's CUDA attention ops return beside the output: the facts a log-sum-exp adapter
for torch-sdpa-cuda-{flash,efficient,cudnn} would rest on, measured, printed as JSON.

For each private op SDPA dispatches to, in float16 and bfloat16, on shapes around the kernels'
edges (Lq = 1, Lq != Lk, grouped KV heads, E = 72 and 128): the LSE's shape and dtype, its
largest error against a float64 LSE of the scaled scores (natural log), and whether the op's
output equals the pinned SDPA call's bit for bit.  Needs a CUDA device; run by tools/gpu_check.sh.
"""
from __future__ import annotations

import json
import sys

import numpy as np

CASES = [  # (B, Hq, Hkv, Lq, Lk, E, causal)
    (2, 4, 4, 33, 70, 64, False), (2, 4, 4, 70, 33, 64, True), (1, 8, 2, 17, 130, 64, False),
    (1, 2, 2, 1, 257, 128, False), (1, 2, 2, 40, 40, 72, True), (3, 1, 1, 129, 129, 128, True),
]


def reference_lse(q, k, scale, causal):
    """(B, Hq, Lq) natural-log LSE of the scaled scores in float64, causal top-left."""
    q64, k64 = q.double().cpu().numpy(), k.double().cpu().numpy()
    k64 = np.repeat(k64, q64.shape[1] // k64.shape[1], axis=1)  # (B, Hq, Lk, E)
    s = np.einsum("bhqe,bhke->bhqk", q64, k64) * scale  # (B, Hq, Lq, Lk)
    if causal:
        Lq, Lk = s.shape[-2:]
        s = np.where(np.arange(Lk)[None, :] > np.arange(Lq)[:, None], -np.inf, s)
    m = s.max(-1, keepdims=True)  # (B, Hq, Lq, 1)
    return (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]  # (B, Hq, Lq)


def bottom_right_patterns(torch) -> list:
    """Which keys each query row weights under causal_lower_right, per pinned kernel (V = identity,
    so the output is the weight matrix), against the documented tril(ones(Lq, Lk), Lk - Lq)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    rows = []
    for Lq, Lk in ((9, 8), (8, 9), (40, 33), (33, 40)):
        gen = torch.Generator().manual_seed(Lq * 100 + Lk)
        q = torch.randn(1, 1, Lq, 8, generator=gen).cuda()  # (1, 1, Lq, 8)
        k = torch.randn(1, 1, Lk, 8, generator=gen).cuda()  # (1, 1, Lk, 8)
        eye = torch.eye(Lk).reshape(1, 1, Lk, Lk).cuda()  # (1, 1, Lk, Lk): output = weights
        wanted = torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq)  # (Lq, Lk)
        for kernel in ("EFFICIENT_ATTENTION", "MATH"):
            try:
                with sdpa_kernel([getattr(SDPBackend, kernel)]):
                    w = torch.nn.functional.scaled_dot_product_attention(
                        q, k, eye, attn_mask=causal_lower_right(Lq, Lk))[0, 0].cpu()  # (Lq, Lk)
                seen = w.abs() > 0  # (Lq, Lk)
                wrong = [i for i in range(Lq) if not torch.equal(seen[i], wanted[i])]
                rows.append(dict(kernel=kernel, Lq=Lq, Lk=Lk, wrong_rows=wrong,
                                 first_wrong={i: [seen[i].nonzero().ravel().tolist(), wanted[i].nonzero().ravel().tolist()]
                                              for i in wrong[:3]}))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(kernel=kernel, Lq=Lq, Lk=Lk, error=f"{type(e).__name__}: {str(e)[:200]}"))
    return rows


def main() -> int:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    aten = torch.ops.aten
    ops = {"FLASH_ATTENTION": lambda q, k, v, c, s: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, c, scale=s),
           "EFFICIENT_ATTENTION": lambda q, k, v, c, s: aten._scaled_dot_product_efficient_attention(
               q, k, v, None, True, 0.0, c, scale=s),
           "CUDNN_ATTENTION": lambda q, k, v, c, s: aten._scaled_dot_product_cudnn_attention(
               q, k, v, None, True, 0.0, c, False, scale=s)}
    facts = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "rows": []}
    gen = torch.Generator().manual_seed(0)
    for kernel, op in ops.items():
        for dtype in (torch.float16, torch.bfloat16):
            for B, Hq, Hkv, Lq, Lk, E, causal in CASES:
                q = torch.randn(B, Hq, Lq, E, generator=gen).to(dtype).cuda()  # (B, Hq, Lq, E)
                k = torch.randn(B, Hkv, Lk, E, generator=gen).to(dtype).cuda()  # (B, Hkv, Lk, E)
                v = torch.randn(B, Hkv, Lk, E, generator=gen).to(dtype).cuda()  # (B, Hkv, Lk, E)
                scale = E ** -0.5
                row = dict(kernel=kernel, dtype=str(dtype).split(".")[1], shape=[B, Hq, Hkv, Lq, Lk, E], causal=causal)
                try:
                    res = op(q, k, v, causal, scale)
                    out, lse = res[0], res[1]
                    row.update(out_shape=list(out.shape), lse_shape=list(lse.shape), lse_dtype=str(lse.dtype))
                    got = lse.float().reshape(B, Hq, -1)[..., :Lq].cpu().numpy()  # (B, Hq, Lq)
                    row["lse_max_abs_err"] = float(np.abs(got - reference_lse(q, k, scale, causal)).max())
                    with sdpa_kernel([getattr(SDPBackend, kernel)]):
                        pinned = torch.nn.functional.scaled_dot_product_attention(
                            q, k, v, is_causal=causal, scale=scale, enable_gqa=Hq != Hkv)  # (B, Hq, Lq, E)
                    row["out_equals_sdpa"] = bool(torch.equal(out, pinned))
                except Exception as e:  # noqa: BLE001 - a refusal is a fact too
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                facts["rows"].append(row)
    facts["bottom_right"] = bottom_right_patterns(torch)
    json.dump(facts, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
