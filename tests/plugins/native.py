"""torch plug-ins in the forms kernels take: an nn.Module instance and an autograd.Function.

- `module_sdpa`: an ``nn.Module`` instance, declared, (B, L, H, E): correct.
- `function_sdpa`: a function calling an ``autograd.Function`` with its own forward and backward
  (as a Triton kernel ships), correct: its hand-written backward is what the suite checks.
- `wrong_dq`: the same autograd.Function with dQ missing the softmax scale: the gradient
  properties must reject it while the forward passes.
torch is imported when the module is (a plug-in's own choice; attnspec's modules do not).
"""
from __future__ import annotations

import torch

from attnspec.backends import declare

DTYPES = ("float16", "bfloat16", "float32")


def _scores(q, k, scale, is_causal):  # (B, H, L, E) -> (B, H, Lq, Lk)
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return s


class Attention(torch.nn.Module):
    def forward(self, query, key, value, attn_mask=None, is_causal=False, scale=None):  # (B, L, H, E)
        q, k, v = (x.transpose(1, 2) for x in (query, key, value))
        s = _scores(q, k, scale, is_causal)
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf"))
        return (s.softmax(-1).nan_to_num(0.0) @ v).transpose(1, 2)  # (B, Lq, H, Ev)


module_sdpa = declare(Attention(), framework="torch", layout="BLHE", dtypes=DTYPES, fully_masked="zeros", masks=True)


class _Attention(torch.autograd.Function):
    """Forward and a hand-written backward (B, H, L, E); ``dq_scale`` plants a slip in dQ."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, dq_scale):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        p = _scores(q, k, scale, is_causal).softmax(-1)  # (B, H, Lq, Lk)
        ctx.save_for_backward(q, k, v, p)
        ctx.scale, ctx.dq_scale = scale, dq_scale
        return p @ v

    @staticmethod
    def backward(ctx, do):
        q, k, v, p = ctx.saved_tensors
        dv = p.transpose(-1, -2) @ do
        dp = do @ v.transpose(-1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))  # softmax's Jacobian
        dq = ds @ k * (ctx.scale if ctx.dq_scale else 1.0)
        return dq, ds.transpose(-1, -2) @ q * ctx.scale, dv, None, None, None


@declare(framework="torch", dtypes=DTYPES, masks=False)
def function_sdpa(query, key, value, attn_mask=None, is_causal=False, scale=None):
    return _Attention.apply(query, key, value, is_causal, scale, True)  # apply takes no keywords


@declare(framework="torch", dtypes=DTYPES, masks=False)
def wrong_dq(query, key, value, attn_mask=None, is_causal=False, scale=None):
    return _Attention.apply(query, key, value, is_causal, scale, False)
