"""CUDA kernels on fp8 inputs with descales (issue 31): PyTorch's quantised SDPA and FA3's fp8 forward.

- ``torch-sdpa-fp8-cuda``: ``torch.nn.attention.experimental._scaled_dot_product_attention_quantized``
  (float8_e4m3fn q, k, v; ``q_descale``, ``k_descale``, ``v_descale`` (B, Hkv) float32, CUDA; bfloat16
  out; forward only; its FA3 backend rounds P to e4m3).  Its docstring: "Requires the Flash Attention 3
  backend to be activated"; on CPU its descale check raises ("must be a CUDA tensor").
- ``flash-attn3-fp8-cuda``: the ``flash_attn_interface`` package's (FA3, hopper/) ``flash_attn_func``
  with the same descales, (B, L, H, E) layout.

Both are declared from their documentation and FA3's tests (P rounded to e4m3: its reference's
``intermediate_dtype=fp8``), not yet run here: tools/gpu_check.sh runs them on a GPU.  Without the
package or a GPU, ``availability()`` says why and the suite skips them.  Their causal is flash's
(bottom-right when Lq != Lk): declared for equal lengths only, where the alignments agree.
"""
from __future__ import annotations

import importlib

from attnspec.backends.base import BackendUnavailable, Capabilities, Semantics
from attnspec.backends.torch_backends import TorchBackend, _import_torch

_E4M3 = "float8_e4m3fn"
_NOTE = "declared from the library's documentation and FA3's tests, not yet run here (tools/gpu_check.sh runs it)"
_CAPS = Capabilities(dtypes=(_E4M3,), device="cuda", masks=False, equal_head_dims=True, head_dims=(64, 128, 256),
                     causal_equal_lengths=True, features=frozenset({"gqa", "descale"}))
_SEMANTICS = Semantics(causal_alignment="bottom_right", output_dtypes=((_E4M3, "bfloat16"),),
                       p_dtypes=((_E4M3, _E4M3),), notes=(_NOTE,))


class _Fp8Cuda(TorchBackend):
    device = "cuda"
    package = ""  # imported in load; "": torch's own
    capabilities, semantics = _CAPS, _SEMANTICS

    def load(self):
        self.torch = _import_torch()
        if self.package:
            try:
                self.lib = importlib.import_module(self.package)
            except ImportError as e:
                raise BackendUnavailable(f"{self.package} is not installed ({e})") from None
        if not self.torch.cuda.is_available():
            raise BackendUnavailable("no CUDA device")

    def _descales(self, call, B: int, Hkv: int) -> dict:
        """The descales as the kernels take them: (B, Hkv) float32 on the device (None: not given)."""
        out = {}
        for name in ("q_descale", "k_descale", "v_descale"):
            d = getattr(call, name)
            if d is not None:
                out[name] = d.to(self.torch.float32).expand(B, Hkv).contiguous()
        return out


class TorchSdpaFp8Cuda(_Fp8Cuda):
    name = "torch-sdpa-fp8-cuda"

    def _attention(self, q, k, v, call):
        from torch.nn.attention.experimental._scaled_dot_product_attention_quantized import (
            _scaled_dot_product_attention_quantized as sdpa_quantized,
        )
        # (B, H, L, E) as SDPA takes it; q_descale per KV head, broadcast to the query group inside
        return sdpa_quantized(q, k, v, is_causal=call.is_causal, scale=call.scale,
                              **self._descales(call, q.shape[0], k.shape[1]))  # (B, Hq, Lq, Ev) bfloat16


class FlashAttn3Fp8Cuda(_Fp8Cuda):
    name = "flash-attn3-fp8-cuda"
    package = "flash_attn_interface"

    def _attention(self, q, k, v, call):
        qb, kb, vb = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # (B, L, H, E): FA3's layout
        y = self.lib.flash_attn_func(qb, kb, vb, softmax_scale=call.scale, causal=call.is_causal,
                                     **self._descales(call, q.shape[0], k.shape[1]))
        out = y[0] if isinstance(y, (tuple, list)) else y  # some versions return (out, lse)
        return out.transpose(1, 2)  # (B, Hq, Lq, Ev)
