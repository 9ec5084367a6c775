"""FP8 inputs with descales (issue 31): FA3's fp8 forward, correct two ways and planted six.

`Fp8Kernel` is FA3's fp8 forward as NumPy (ml_dtypes for the fp8 roundings: these play third-party
kernels, which never see `specs`): q and k descales folded into the softmax scale per (batch, KV
head), an online softmax over blocks of 4 keys in float32, P of each block rounded to e4m3 before
P V (the row sum from P before rounding), V's descale on the output, bfloat16 out - declared.
`Fp8Dequantised` dequantises q, k, v to float32 first and keeps P in float32 (declared), as a
reference path would.  The planted ones each change one line of the first: the descales dropped
(vllm-project/vllm#51363), k's applied twice, one descale for every head where per-head ones are
declared, a KV head reading its neighbour's, every batch element reading the first's
(sgl-project/sglang#37785: the descales' batch axis off), a descale of a compact shape ((B, 1), (1, Hkv),
(Hkv,)) read with dense (B, Hkv) strides, and P kept in float32 where e4m3 is declared.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from attnspec.backends.base import Capabilities, Semantics

from ._kernels import NumpyBackend, visible

_E4M3 = "float8_e4m3fn"
_FP8 = (_E4M3, "float8_e5m2")
_BLOCK = 4  # keys per online-softmax step


def _bf16(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16)


class Fp8Kernel(NumpyBackend):
    """FA3's fp8 forward (correct): descales folded, P rounded to e4m3 per block, bfloat16 out."""

    name = "ok-fp8-fa3"
    capabilities = Capabilities(dtypes=(_E4M3,), device="cpu", features=frozenset({"gqa", "descale"}))
    # P rounded to the input's own format (FA3 takes e4m3 only; e5m2 the same way, where a kernel declares it)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left",
                          output_dtypes=tuple((d, "bfloat16") for d in _FP8), p_dtypes=tuple((d, d) for d in _FP8))
    bug = None
    p_rounded = True

    def to_native(self, x, dtype):
        if dtype in _FP8:
            return x.astype(getattr(ml_dtypes, dtype))
        return super().to_native(x, dtype)

    def native_dtype(self, y) -> str:
        return str(np.asarray(y).dtype)

    def from_native(self, y):
        return np.asarray(y).astype(np.float32)

    # ---- the pieces a bug changes ------------------------------------------------------------
    def _descale(self, d, B: int, Hkv: int):
        """(B, Hkv) float32 of a descale as the kernel reads it (ones without)."""
        if d is None or self.bug == "dropped":
            return np.ones((B, Hkv), dtype=np.float32)
        if self.bug == "dense" and np.size(d) > 1:  # entry (b, g) at b * Hkv + g of whatever it was handed
            flat = np.asarray(d, dtype=np.float32).ravel()
            return flat[(np.arange(B)[:, None] * Hkv + np.arange(Hkv)) % flat.size]
        d = np.broadcast_to(np.asarray(d, dtype=np.float32), (B, Hkv))
        if self.bug == "per_tensor":
            return np.full((B, Hkv), d[0, 0], dtype=np.float32)
        if self.bug == "wrong_head":
            return np.roll(d, 1, axis=1)
        if self.bug == "first_batch":
            return np.broadcast_to(d[:1], (B, Hkv))
        return d

    def native_attention(self, q, k, v, call):
        q, k, v = (np.asarray(x, dtype=np.float32) for x in (q, k, v))  # fp8 values, exact in float32
        B, Hq, Lq, E = q.shape
        Hkv = k.shape[1]
        g = Hq // Hkv
        dq, dk, dv = (self._descale(d, B, Hkv) for d in (call.q_descale, call.k_descale, call.v_descale))
        if self.bug == "twice":
            dk = dk * dk
        scale = np.float32(1.0 / np.sqrt(E) if call.scale is None else call.scale)
        folded = (scale * dq * dk).astype(np.float32)  # (B, Hkv) FA3: scale * q_descale * k_descale
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)  # (B, Hq, Lk, ·)
        s = (q @ np.swapaxes(k, -1, -2)) * np.repeat(folded, g, axis=1)[..., None, None]  # (B, Hq, Lq, Lk)
        s = np.where(visible(Lq, k.shape[-2], call.mask, call.is_causal), s, np.float32(-np.inf))
        m = np.full((B, Hq, Lq, 1), -np.inf, dtype=np.float32)  # running max
        l_sum = np.zeros_like(m)  # (B, Hq, Lq, 1)
        acc = np.zeros((B, Hq, Lq, v.shape[-1]), dtype=np.float32)
        for j in range(0, s.shape[-1], _BLOCK):
            b = s[..., j:j + _BLOCK]  # (B, Hq, Lq, b)
            m_new = np.maximum(m, b.max(axis=-1, keepdims=True, initial=-np.inf))
            shift = np.where(np.isfinite(m_new), m_new, np.float32(0))
            p = np.exp(b - shift).astype(np.float32)  # (B, Hq, Lq, b)
            alpha = np.where(np.isfinite(m), np.exp(m - shift), np.float32(0))
            l_sum = l_sum * alpha + p.sum(axis=-1, keepdims=True)  # from P before rounding
            if self.p_rounded and self.bug != "p_float32":
                p = p.astype(getattr(ml_dtypes, call.dtype)).astype(np.float32)  # the second GEMM's fp8 operand
            acc = acc * alpha + p @ v[..., j:j + _BLOCK, :]
            m = m_new
        out = acc / np.where(l_sum == 0, 1, l_sum) * np.repeat(dv, g, axis=1)[..., None, None]  # (B, Hq, Lq, Ev)
        return _bf16(out)


class Fp8Dequantised(Fp8Kernel):
    """q, k, v times their descales in float32 first, the softmax and P V in float32, bfloat16 out (correct)."""

    name = "ok-fp8-dequantised"
    capabilities = Capabilities(dtypes=_FP8, device="cpu", features=frozenset({"gqa", "descale"}))
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left",
                          output_dtypes=tuple((d, "bfloat16") for d in _FP8), p_dtypes=tuple((d, "float32") for d in _FP8))
    p_rounded = False


def _planted(bug: str, label: str, doc: str, dtypes=(_E4M3,)):
    caps = Capabilities(dtypes=dtypes, device="cpu", features=frozenset({"gqa", "descale"}))
    cls = type(label, (Fp8Kernel,), {"name": f"broken-fp8-{bug.replace('_', '-')}", "bug": bug, "__doc__": doc,
                                     "capabilities": caps})
    cls.__module__ = __name__
    return cls


DescalesDropped = _planted("dropped", "DescalesDropped", "Accepts the descales and drops them (vllm-project/vllm#51363).")
KDescaleTwice = _planted("twice", "KDescaleTwice", "k_descale applied twice (folded into the scale and the keys).")
DescalePerTensor = _planted("per_tensor", "DescalePerTensor",
                            "descale[0, 0] for every batch element and head, per-head descales declared.")
DescaleWrongHead = _planted("wrong_head", "DescaleWrongHead", "KV head g reads head g - 1's descales.")
DescaleFirstBatch = _planted("first_batch", "DescaleFirstBatch",
                             "every batch element reads the first's descales (sgl-project/sglang#37785).",
                             ("float8_e5m2",))
DescaleReadDense = _planted("dense", "DescaleReadDense",
                            "a descale of any shape read with dense (B, Hkv) strides: (B, 1), (1, Hkv), (Hkv,) misread.")
PNotRounded = _planted("p_float32", "PNotRounded", "P kept in float32 before P V, e4m3 declared (FA3's rounding).")

__all__ = ["DescaleFirstBatch", "DescalePerTensor", "DescaleReadDense", "DescaleWrongHead", "DescalesDropped",
           "Fp8Dequantised", "Fp8Kernel", "KDescaleTwice", "PNotRounded"]
