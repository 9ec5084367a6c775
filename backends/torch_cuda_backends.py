"""PyTorch's SDPA pinned to one CUDA kernel: flash, mem-efficient, cuDNN, math.

Same adapter as the CPU ones (backends/torch_backends.py: ``sdpa_kernel([that kernel])`` only,
a refusal is ``Unsupported`` with PyTorch's reason).  What each declares was run on an NVIDIA
H200 (tools/gpu_check.sh runs the suite there); the findings are in the deviations and notes.
"""
from __future__ import annotations

from attnspec.backends.base import Capabilities, Deviation, Semantics, Unsupported
from attnspec.backends.torch_backends import _ALL, _HALF, _SDPA_FEATURES, TorchSdpa

_CUDA_NOTE = "run on an NVIDIA H200 with torch 2.11.0+cu130 (tools/gpu_check.sh)"
_CUDA_LSE = ("the log-sum-exp comes from the private op SDPA dispatches to (aten._scaled_dot_product_{flash,"
             "efficient,cudnn}_attention), called after the pinned SDPA call accepted the same arguments: "
             "natural log of the scaled, masked scores, float32")


class _CudaLse:
    """The log-sum-exp of a pinned CUDA kernel: its private op, given the inputs as SDPA gives them.

    SDPA itself returns no LSE.  The op is called only after the pinned SDPA call accepted the same
    arguments, so what the kernel refuses stays Unsupported with PyTorch's reason."""

    def _with_lse(self, q, k, v, attn_mask, is_causal, call):
        torch = self.torch
        from torch.nn.attention.bias import CausalBias

        self._pinned(q, k, v, dict(attn_mask=attn_mask, is_causal=is_causal, scale=call.scale,
                                   enable_gqa=call.enable_gqa))  # PyTorch's own verdict on the call
        bottom_right = isinstance(attn_mask, CausalBias)
        if bottom_right:
            attn_mask = None
        elif attn_mask is not None and attn_mask.dtype == torch.bool:  # SDPA's conversion of a boolean mask
            attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~attn_mask,
                                                                                                 float("-inf"))
        return self._op(q, k, v, attn_mask, is_causal, bottom_right, call.scale)

    def _aligned_bias(self, bias, q, k):
        """(B, N, Lq, Lk) in q's dtype, rows padded in memory to 16 elements (SDPA's pad_bias)."""
        B, N, Lq, Lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        buf = self.torch.zeros(B, N, Lq, Lk + (-Lk % 16), dtype=q.dtype, device=q.device)  # (B, N, Lq, Lk + pad)
        buf[..., :Lk] = bias.to(q.dtype).expand(B, N, Lq, Lk)
        return buf[..., :Lk]  # (B, N, Lq, Lk) aligned strides


class TorchSdpaCudaFlash(_CudaLse, TorchSdpa):
    name, kernel, device = "torch-sdpa-cuda-flash", "FLASH_ATTENTION", "cuda"
    capabilities = Capabilities(dtypes=_HALF, device="cuda", gradients=True, masks=False, equal_head_dims=True,
                                max_head_dim=256,  # flash-attention 2's head dims
                                features=frozenset(("gqa", "causal_bottom_right", "lse")), mask_with_causal=False)
    semantics = Semantics(fully_masked=None, causal_alignment="top_left",
                          notes=("takes no attn_mask; is_causal only (causal_lower_right runs the flash op with "
                                 "its own bottom-right causal)", _CUDA_NOTE, _CUDA_LSE))

    def _op(self, q, k, v, bias, is_causal, bottom_right, scale):
        import torch.nn.functional as F

        E, Ev = q.shape[-1], v.shape[-1]
        pad = -E % 8  # as SDPA does: the op takes head dims that are multiples of 8, the scale of the true E
        q, k, v = (F.pad(x, (0, pad)) if pad else x for x in (q, k, v))  # (B, N, L, E + pad)
        out, lse = self.torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, is_causal or bottom_right, scale=E ** -0.5 if scale is None else scale)[:2]
        return out[..., :Ev], lse  # the op's causal is bottom-right; SDPA refuses top-left with Lq != Lk


# tools/gpu_probe.py, torch 2.11.0+cu130 on an H200: sdpa_kernel([EFFICIENT_ATTENTION]) with
# attn_mask=causal_lower_right(9, 8) (float32, E = 8) weights all 8 keys in every row; the documented
# mask (tril(ones(9, 8), -1)) leaves row 0 none and row i the keys j <= i - 1.  Lq <= Lk is right.
_NO_CAUSAL_WHEN_LQ_EXCEEDS_LK = ("causal_lower_right with Lq > Lk applies no causal mask at all (torch 2.11, H200: "
                                 "Lq = 9, Lk = 8, every row weights every key; CausalBias dispatches to "
                                 "_efficient_attention_forward with custom_mask_type=2); Lq <= Lk is right "
                                 "(docs/findings.md: torch-cuda-efficient-lower-right)")


class TorchSdpaCudaEfficient(_CudaLse, TorchSdpa):
    name, kernel, device = "torch-sdpa-cuda-efficient", "EFFICIENT_ATTENTION", "cuda"
    # SDPA's docstring: grouped KV heads work only with the flash and math kernels on CUDA
    capabilities = Capabilities(dtypes=("float16", "bfloat16", "float32"), device="cuda", gradients=True,
                                features=frozenset(("bias", "causal_bottom_right", "lse")), bias_gradient=True,
                                mask_with_causal=False)
    semantics = Semantics(
        fully_masked=None, causal_alignment="top_left", notes=(_CUDA_NOTE, _CUDA_LSE),
        deviations=tuple(Deviation(prop, _NO_CAUSAL_WHEN_LQ_EXCEEDS_LK)
                         for prop in ("causal_alignment_as_asked", "zero_future_mass", "future_changes_nothing")))

    def _op(self, q, k, v, bias, is_causal, bottom_right, scale):
        if bottom_right:
            raise Unsupported(f"{self.name}: no log-sum-exp with causal_lower_right (the op SDPA uses for it, "
                              "_efficient_attention_forward, is not the one whose LSE this adapter reads)")
        bias = None if bias is None else self._aligned_bias(bias, q, k)
        out, lse = self.torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, True, 0.0, is_causal, scale=scale)[:2]
        return out, lse[..., :q.shape[-2]]  # (B, N, Lq): the op pads the LSE's rows to a multiple of 32


class TorchSdpaCudaCudnn(_CudaLse, TorchSdpa):
    name, kernel, device = "torch-sdpa-cuda-cudnn", "CUDNN_ATTENTION", "cuda"
    capabilities = Capabilities(dtypes=_HALF, device="cuda", gradients=True, mask_with_causal=False,
                                max_head_dim=256,  # cuDNN's fused attention: head dims up to 256
                                features=frozenset(("gqa", "lse")))
    semantics = Semantics(fully_masked=None, causal_alignment="top_left",
                          notes=("needs an sm80+ GPU and cuDNN >= 9", _CUDA_NOTE, _CUDA_LSE))

    def _op(self, q, k, v, bias, is_causal, bottom_right, scale):
        bias = None if bias is None else bias.to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        out, lse = self.torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, bias, True, 0.0, is_causal, False, scale=scale)[:2]
        return out, lse.reshape(q.shape[:3])  # (B, N, Lq, 1) -> (B, N, Lq)


class TorchSdpaCudaMath(TorchSdpa):
    name, kernel, device = "torch-sdpa-cuda-math", "MATH", "cuda"
    capabilities = Capabilities(dtypes=_ALL, device="cuda", gradients=True, features=_SDPA_FEATURES,
                                bias_gradient=True, mask_with_causal=False)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", notes=(_CUDA_NOTE,))
