"""PyTorch backends: explicit ops, SDPA's default dispatch, and one name per pinned kernel.

torch is imported in ``load`` (never at module import).  A pinned kernel runs under
``torch.nn.attention.sdpa_kernel([that kernel])`` only, so PyTorch cannot fall back to
another one: a combination the kernel refuses becomes ``Unsupported`` carrying
PyTorch's own reason (the "... not used because ..." warnings it emits).
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from .base import Backend, BackendUnavailable, Capabilities, Semantics, Unsupported

_ALL = ("float16", "bfloat16", "float32", "float64")
_HALF = ("float16", "bfloat16")
_CPU_VERIFIED = Semantics(fully_masked="zeros", causal_alignment="top_left")


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise BackendUnavailable(f"torch is not installed ({e})") from None
    return torch


class TorchBackend(Backend):
    """Shared conversion, autograd backward and device handling; subclasses define `_attend`."""

    device = "cpu"
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=True)
    semantics = _CPU_VERIFIED

    def load(self):
        self.torch = _import_torch()
        if self.device == "cuda" and not self.torch.cuda.is_available():
            raise BackendUnavailable("no CUDA device")

    def to_native(self, x, dtype):
        t = self.torch.from_numpy(np.ascontiguousarray(x))
        if dtype is not None:
            t = t.to(getattr(self.torch, dtype))
        return t.to(self.device)

    def from_native(self, y):
        y = y.detach()
        if y.dtype == self.torch.bfloat16:
            y = y.float()  # exact: every bfloat16 is a float32
        return y.cpu().numpy()

    def sync(self, y):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def native_forward(self, q, k, v, mask, is_causal, scale):
        with self.torch.no_grad():
            return self._attend(q, k, v, mask, is_causal, scale)  # (..., Lq, Ev)

    def native_backward(self, q, k, v, grad_out, mask, is_causal, scale):
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        y = self._attend(*leaves, mask, is_causal, scale)  # (..., Lq, Ev)
        # expand() in _attend sums broadcast gradients back to each input's shape
        return self.torch.autograd.grad(y, leaves, grad_out)


class TorchMath(TorchBackend):
    """The textbook computation in torch ops; a guarded row max keeps empty rows at zero."""

    name = "torch-math"

    def _attend(self, q, k, v, mask, is_causal, scale):
        torch = self.torch
        sc = q.shape[-1] ** -0.5 if scale is None else scale
        s = (q @ k.transpose(-1, -2)) * sc  # (..., Lq, Lk)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))  # (..., Lq, Lk)
        if is_causal:
            Lq, Lk = s.shape[-2:]
            future = torch.ones(Lq, Lk, dtype=torch.bool, device=s.device).triu(1)  # (Lq, Lk)
            s = s.masked_fill(future, float("-inf"))  # (..., Lq, Lk)
        row_max = s.amax(dim=-1, keepdim=True).detach()  # (..., Lq, 1)
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        e = torch.exp(s - row_max)  # (..., Lq, Lk) exp(-inf) = 0 on masked pairs
        total = e.sum(dim=-1, keepdim=True)  # (..., Lq, 1)
        w = e / torch.where(total == 0, torch.ones_like(total), total)  # (..., Lq, Lk)
        return w @ v  # (..., Lq, Ev)


def _four_dim(torch, q, k, v, mask, is_causal):
    """Layout every fused kernel accepts: (B, N, L, E) with a common (B, N).

    Leading dims broadcast and fold into (B, N); PyTorch refuses a mask together with
    is_causal, so the causal triangle is folded into the mask then (same semantics).
    """
    batch = tuple(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))
    lead = (math.prod(batch[:-1]), batch[-1]) if batch else (1, 1)  # (B, N)

    def fold(x):
        return x.expand(*batch, *x.shape[-2:]).reshape(*lead, *x.shape[-2:])  # (B, N, L, E)

    Lq, Lk = q.shape[-2], k.shape[-2]
    if mask is not None and is_causal:
        mask = mask & torch.ones(Lq, Lk, dtype=torch.bool, device=mask.device).tril()  # (..., Lq, Lk)
        is_causal = False
    if mask is not None and len(batch) > 2 and mask.dim() > 2:  # its batch dims must fold too
        mask = mask.expand(*batch, Lq, Lk).reshape(*lead, Lq, Lk)  # (B, N, Lq, Lk)
    return fold(q), fold(k), fold(v), mask, is_causal, batch


class TorchSdpa(TorchBackend):
    """F.scaled_dot_product_attention; `kernel` None = PyTorch's own dispatch."""

    kernel: str | None = None  # an SDPBackend member name, e.g. "FLASH_ATTENTION"

    def _attend(self, q, k, v, mask, is_causal, scale):
        torch = self.torch
        Ev = v.shape[-1]
        q, k, v, mask, is_causal, batch = _four_dim(torch, q, k, v, mask, is_causal)
        call = torch.nn.functional.scaled_dot_product_attention
        if self.kernel is None:
            y = call(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)  # (B, N, Lq, Ev)
        else:
            y = self._pinned(call, q, k, v, mask, is_causal, scale)  # (B, N, Lq, Ev)
        return y.reshape(*batch, q.shape[-2], Ev)  # (..., Lq, Ev)

    def _pinned(self, call, q, k, v, mask, is_causal, scale):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with warnings.catch_warnings(record=True) as caught, sdpa_kernel([getattr(SDPBackend, self.kernel)]):
            warnings.simplefilter("always")
            try:
                return call(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)
            except RuntimeError as e:
                if "No available kernel" not in str(e) and "No viable backend" not in str(e):
                    raise
                why = [_plain(w.message) for w in caught if "not used because" not in str(w.message)]
                raise Unsupported(f"{self.name}: PyTorch's {self.kernel} kernel refuses this call: "
                                  f"{'; '.join(why) or str(e).splitlines()[0]}") from None


def _plain(message) -> str:
    return str(message).split(" (Triggered internally")[0].strip()


class TorchSdpaCpu(TorchSdpa):
    name = "torch-sdpa-cpu"
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left",
                          notes=("PyTorch's dispatch picks the kernel (CPU, torch 2.13: flash; math when Ev != E)",))


class TorchSdpaCpuMath(TorchSdpa):
    name, kernel = "torch-sdpa-cpu-math", "MATH"
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left",
                          notes=("float16/bfloat16 are computed in float32 on CPU",))


class TorchSdpaCpuFlash(TorchSdpa):
    name, kernel = "torch-sdpa-cpu-flash", "FLASH_ATTENTION"
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=True, equal_head_dims=True)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left",
                          notes=("CPU flash kernel accepts boolean masks and float64 (checked on torch 2.13)",))


_CUDA_NOTE = "declared from PyTorch's documentation; not verified on this machine"


class TorchSdpaCudaFlash(TorchSdpa):
    name, kernel, device = "torch-sdpa-cuda-flash", "FLASH_ATTENTION", "cuda"
    capabilities = Capabilities(dtypes=_HALF, device="cuda", gradients=True, masks=False, equal_head_dims=True)
    semantics = Semantics(fully_masked=None, causal_alignment="top_left",
                          notes=("takes no attn_mask; is_causal only", _CUDA_NOTE))


class TorchSdpaCudaEfficient(TorchSdpa):
    name, kernel, device = "torch-sdpa-cuda-efficient", "EFFICIENT_ATTENTION", "cuda"
    capabilities = Capabilities(dtypes=("float16", "bfloat16", "float32"), device="cuda", gradients=True)
    semantics = Semantics(fully_masked=None, causal_alignment="top_left", notes=(_CUDA_NOTE,))


class TorchSdpaCudaCudnn(TorchSdpa):
    name, kernel, device = "torch-sdpa-cuda-cudnn", "CUDNN_ATTENTION", "cuda"
    capabilities = Capabilities(dtypes=_HALF, device="cuda", gradients=True)
    semantics = Semantics(fully_masked=None, causal_alignment="top_left",
                          notes=("needs an sm80+ GPU and cuDNN >= 9", _CUDA_NOTE))


class TorchSdpaCudaMath(TorchSdpa):
    name, kernel, device = "torch-sdpa-cuda-math", "MATH", "cuda"
    capabilities = Capabilities(dtypes=_ALL, device="cuda", gradients=True)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", notes=(_CUDA_NOTE,))
