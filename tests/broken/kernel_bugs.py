"""Kernel-level slips: online softmax bookkeeping, block tails, fast paths, precision, NaNs,
and the real bugs reported against PyTorch, JAX, flash-attention and friends."""
from __future__ import annotations

import numpy as np

from attnspec.backends.base import Capabilities, Semantics

from ._kernels import NumpyBackend, masked_softmax, numpy_caps, resolve_scale, scores, store, tiled_attention, visible, widened
from ._variants import VariantKernel


class OnlineNoRescale(NumpyBackend):
    """Online softmax over blocks of 16 keys that rescales the accumulator but forgets to rescale
    the running sum when a later block raises the row maximum (``l = l + rowsum(p)`` instead of
    ``l = l * exp(m_old - m_new) + rowsum(p)``).  Exact whenever the first block holds the row's
    maximum, e.g. always when Lk <= 16."""

    name = "broken-online-no-rescale"
    capabilities = numpy_caps("bfloat16")
    block = 16

    def native_forward(self, q, k, v, mask, is_causal, scale):
        vis = visible(q.shape[-2], k.shape[-2], mask, is_causal)  # (..., Lq, Lk)
        return tiled_attention(q, k, v, vis, resolve_scale(q, scale), self.block, rescale_sum=False)


class OnlineMaskedBlockNaN(NumpyBackend):
    """Online softmax over blocks of 8 keys without the ``max == -inf ? 0 : max`` guard
    (flash-attn's Check_inf): a row whose first block is fully masked computes -inf - (-inf) = NaN
    and stays NaN even though later keys are visible.  The class of pytorch/pytorch#109517
    (mem-efficient SDPA producing NaNs for certain mask patterns)."""

    name = "broken-online-masked-block-nan"
    capabilities = numpy_caps("float16")
    block = 8

    def native_forward(self, q, k, v, mask, is_causal, scale):
        vis = visible(q.shape[-2], k.shape[-2], mask, is_causal)  # (..., Lq, Lk)
        return tiled_attention(q, k, v, vis, resolve_scale(q, scale), self.block, guard_masked_block=False)


class TailBlockZeroPad(NumpyBackend):
    """Keys padded with zeros to a multiple of the 64-key block and the padding left unmasked:
    each phantom key scores 0 and takes exp(0 - max) of the mass.  Exact only when Lk % 64 == 0.
    flashinfer-ai/flashinfer#5090 ("correct SM100 blk64 output when seqlen_k % 64 != 0");
    also jax-ml/jax#27224 (Pallas flash attention only right for lengths that are block multiples)."""

    name = "broken-tail-block-zero-pad"
    capabilities = numpy_caps("float64")
    block = 64

    def native_forward(self, q, k, v, mask, is_causal, scale):
        Lq, Lk = q.shape[-2], k.shape[-2]
        pad = -Lk % self.block
        k_pad = np.concatenate([k, np.zeros(k.shape[:-2] + (pad, k.shape[-1]), k.dtype)], axis=-2)  # (..., Lk+pad, E)
        v_pad = np.concatenate([v, np.zeros(v.shape[:-2] + (pad, v.shape[-1]), v.dtype)], axis=-2)  # (..., Lk+pad, Ev)
        vis = visible(Lq, Lk, mask, is_causal)  # (..., Lq, Lk)
        phantom = np.ones(np.shape(vis)[:-1] + (pad,), dtype=bool)  # (..., Lq, pad) the missing bounds check
        vis = np.concatenate([np.broadcast_to(vis, phantom.shape[:-1] + (Lk,)), phantom], axis=-1)  # (..., Lq, Lk+pad)
        return masked_softmax(scores(q, k_pad, resolve_scale(q, scale)), vis) @ v_pad  # (..., Lq, Ev)


class LongSequenceFastPathDropsMask(NumpyBackend):
    """A dispatcher that sends Lk > 64 to a "fast" kernel with no attn_mask support, which drops
    the boolean mask silently (causal is still honoured).  The hazard users feared in
    pytorch/pytorch#107884 ("SDPA silently ignore attn_mask with flash attention backend")."""

    name = "broken-long-fast-path-drops-mask"
    capabilities = numpy_caps("float64")
    threshold = 64

    def native_forward(self, q, k, v, mask, is_causal, scale):
        Lq, Lk = q.shape[-2], k.shape[-2]
        if Lk > self.threshold:
            mask = None  # the fast kernel's signature has no mask
        vis = visible(Lq, Lk, mask, is_causal)  # (..., Lq, Lk)
        return masked_softmax(scores(q, k, resolve_scale(q, scale)), vis) @ v  # (..., Lq, Ev)


class LowPrecisionAccumulation(NumpyBackend):
    """float32 inputs, but the softmax denominator and P·V are accumulated key by key in float16:
    the running sum stops growing once its ulp exceeds the addends.  pytorch/executorch#20089
    ("accumulate in fp32 for Half/BFloat16 in softmax ... BFloat16 sum saturates around 256");
    Xilinx/mlir-air#1606 (bf16 P·V accumulator replaced by f32)."""

    name = "broken-low-precision-accumulation"
    capabilities = numpy_caps("float32")  # in the 16-bit formats the same loop would be no slip
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", notes=("claims float32 accumulation",))

    def native_forward(self, q, k, v, mask, is_causal, scale):
        s = scores(q, k, resolve_scale(q, scale))  # (..., Lq, Lk)
        vis = visible(q.shape[-2], k.shape[-2], mask, is_causal)  # (..., Lq, Lk)
        s = np.where(vis, s, -np.inf)  # (..., Lq, Lk)
        row_max = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Lq, 1)
        p = np.exp(s - np.where(np.isfinite(row_max), row_max, 0))  # (..., Lq, Lk) float32
        v16 = v.astype(np.float16)  # (..., Lk, Ev)
        total = np.zeros(p.shape[:-1] + (1,), np.float16)  # (..., Lq, 1)
        acc = np.zeros(p.shape[:-1] + (v.shape[-1],), np.float16)  # (..., Lq, Ev)
        for j in range(p.shape[-1]):  # key by key, as a naive loop kernel does
            pj = p[..., j:j + 1].astype(np.float16)  # (..., Lq, 1)
            total = (total + pj).astype(np.float16)
            acc = (acc + pj * v16[..., j:j + 1, :]).astype(np.float16)  # (..., Lq, Ev)
        out = acc.astype(np.float32) / np.where(total == 0, 1, total).astype(np.float32)  # (..., Lq, Ev)
        return out.astype(q.dtype)


class NaNForFullyMaskedDeclaredZeros(NumpyBackend):
    """Math-path SDPA: masked_fill(-inf) then softmax; a row with no visible key is -inf - (-inf)
    = NaN, while zeros are declared.  pytorch/pytorch#103963 and #103749 (SDPA NaN with boolean
    masks that have fully masked rows)."""

    name = "broken-nan-fully-masked-declared-zeros"
    capabilities = numpy_caps("float64")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        s = scores(q, k, resolve_scale(q, scale))  # (..., Lq, Lk)
        s = np.where(visible(q.shape[-2], k.shape[-2], mask, is_causal), s, -np.inf)  # (..., Lq, Lk)
        with np.errstate(invalid="ignore"):
            e = np.exp(s - s.max(axis=-1, keepdims=True, initial=-np.inf))  # (..., Lq, Lk) NaN on empty rows
            return (e / e.sum(axis=-1, keepdims=True)) @ v  # (..., Lq, Ev)


class ExplicitScaleIgnored(NumpyBackend):
    """The kernel hard-codes 1/sqrt(E) and swallows the scale argument: hao-ai-lab/FastVideo#1457
    (``sm_scale`` passed but the kernel "hardcodes 1/sqrt(D)"), huggingface/transformers#44380
    (GPT-2 scaling silently ignored on SDPA/FlashAttention backends)."""

    name = "broken-explicit-scale-ignored"
    capabilities = numpy_caps("float32")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        s = scores(q, k, resolve_scale(q, None))  # (..., Lq, Lk) scale dropped here
        return masked_softmax(s, visible(q.shape[-2], k.shape[-2], mask, is_causal)) @ v  # (..., Lq, Ev)


class FirstTileBiasNaN(VariantKernel):
    """An online softmax over 64-key tiles (FlashAttention's block size) that skips the tiles a
    row's boolean mask, causal or window hides entirely (block sparsity: those never produce a
    -inf running max) but has no ``max == -inf ? 0 : max`` guard for the rest.  A -inf in an
    additive bias is no structure the kernel knows of: a row whose first tile is hidden by a -inf
    bias computes exp(-inf - (-inf)) = NaN there and keeps it, although later keys are visible.
    Correct wherever no tile it processes leaves a row's running max at -inf.  The bug a Triton
    FlashAttention showed (issue 29: its first block's running max is -inf)."""

    name = "broken-first-tile-bias-nan"
    capabilities = Capabilities(dtypes=("float16", "float32"), device="cpu", gradients=False,
                                features=frozenset(("bias",)))
    tile = 64

    def native_attention(self, q, k, v, call):
        q, k, v = widened(q, k, v)
        s, _, _ = self.scores(q, k, call)  # (..., H, Lq, Lk) final scores, the mask's and the bias's -inf in
        Lq, Lk = s.shape[-2:]
        structural = self._visible(call, s.shape, Lq, Lk)  # (..., H, Lq, Lk) what the kernel skips by
        dt = s.dtype
        run_max = np.full(s.shape[:-1] + (1,), -np.inf, dtype=dt)  # (..., H, Lq, 1)
        run_sum = np.zeros_like(run_max)  # (..., H, Lq, 1)
        acc = np.zeros(np.broadcast_shapes(s.shape[:-1], v.shape[:-2] + (Lq,)) + (v.shape[-1],), dtype=dt)
        with np.errstate(invalid="ignore"):
            for start in range(0, Lk, self.tile):
                st = s[..., start:start + self.tile]  # (..., H, Lq, t)
                live = structural[..., start:start + self.tile].any(axis=-1, keepdims=True)  # (..., H, Lq, 1)
                new_max = np.maximum(run_max, st.max(axis=-1, keepdims=True))  # (..., H, Lq, 1)
                p = np.exp(st - new_max)  # the slip: no guard, NaN where new_max is -inf
                alpha = np.exp(run_max - new_max)  # (..., H, Lq, 1)
                run_sum = np.where(live, run_sum * alpha + p.sum(axis=-1, keepdims=True), run_sum)
                acc = np.where(live, acc * alpha + p @ v[..., start:start + self.tile, :], acc)
                run_max = np.where(live, new_max, run_max)
        return store(acc / np.where(run_sum == 0, dt.type(1), run_sum), call.dtype)  # (..., H, Lq, Ev)
