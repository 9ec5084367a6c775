"""Bugs that show only at sizes past one tile, one wave or one template: found by a review that
wrote new planted bugs against the suite (2026-12-03) and closed by the edge grid's rows for
them (properties/test_edges.py) and wider draws (grouped heads past a group of 4)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends.base import Capabilities

from ._kernels import NumpyBackend, masked_softmax, numpy_caps, resolve_scale, scores, visible
from ._variants import VariantKernel


def _attention(q, k, v, mask, is_causal, scale):
    vis = visible(q.shape[-2], k.shape[-2], mask, is_causal)  # (..., Lq, Lk)
    return masked_softmax(scores(q, k, resolve_scale(q, scale)), vis) @ v  # (..., Lq, Ev)


class PersistentGridOneWave(NumpyBackend):
    """A persistent kernel launched with one program per SM (132 on an H100) that runs only its first
    (batch, head, 64-query tile) work item - ``if pid < n`` where a grid-stride loop belongs: the
    tiles past the first wave keep the zero-initialised output."""

    name = "broken-persistent-grid-one-wave"
    capabilities = numpy_caps("float32")
    programs, tile = 132, 64

    def native_forward(self, q, k, v, mask, is_causal, scale):
        out = _attention(q, k, v, mask, is_causal, scale)  # (..., Lq, Ev)
        out = np.broadcast_to(out, np.broadcast_shapes(out.shape, q.shape[:-1] + out.shape[-1:])).copy()
        Lq = out.shape[-2]
        if out.size == 0:
            return out
        flat = out.reshape(-1, Lq, out.shape[-1])  # (B*H, Lq, Ev)
        tiles = -(-Lq // self.tile)
        for item in range(self.programs, flat.shape[0] * tiles):  # the second wave never runs
            bh, t = divmod(item, tiles)
            flat[bh, t * self.tile:(t + 1) * self.tile] = 0
        return flat.reshape(out.shape)


class SplitKvMergeFirstRowLse(NumpyBackend):
    """Flash-decoding's split-KV path (Lk > 512, chunks of 256 keys) whose combine step indexes the
    chunks' LSEs by (batch, head, split) only - the decode layout, one query: with Lq > 1 (chunked
    prefill, speculative decoding) every row is merged with row 0's weights."""

    name = "broken-split-kv-merge-first-row"
    capabilities = numpy_caps("float64")
    threshold, chunk = 512, 256

    def native_forward(self, q, k, v, mask, is_causal, scale):
        Lq, Lk = q.shape[-2], k.shape[-2]
        if Lk <= self.threshold:
            return _attention(q, k, v, mask, is_causal, scale)
        s = np.where(visible(Lq, Lk, mask, is_causal), scores(q, k, resolve_scale(q, scale)), -np.inf)  # (..., Lq, Lk)
        outs, lses = [], []
        for lo in range(0, Lk, self.chunk):
            part = s[..., lo:lo + self.chunk]  # (..., Lq, C)
            top = part.max(axis=-1, keepdims=True)  # (..., Lq, 1)
            e = np.exp(part - top)
            outs.append(e / e.sum(axis=-1, keepdims=True) @ v[..., lo:lo + self.chunk, :])  # (..., Lq, Ev)
            lses.append(top[..., 0] + np.log(e.sum(axis=-1)))  # (..., Lq)
        lse = np.stack(lses)[..., :1]  # (splits, ..., 1): the slip - row 0's statistics for every row
        w = np.exp(lse - lse.max(axis=0, keepdims=True))
        w = w / w.sum(axis=0, keepdims=True)  # (splits, ..., 1)
        return sum(wc[..., None] * oc for wc, oc in zip(w, outs, strict=True))  # (..., Lq, Ev)


class HeadDimLoopCapped256(NumpyBackend):
    """Q.K^T's head-dim loop bounded by the widest compiled template (256): a head dim of 512 is
    taken instead of refused, and only the first 256 components of each query and key are summed."""

    name = "broken-head-dim-loop-capped-256"
    capabilities = numpy_caps("float32")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        s = scores(q[..., :256], k[..., :256], resolve_scale(q, scale))  # (..., Lq, Lk), the scale of the true E
        return masked_softmax(s, visible(q.shape[-2], k.shape[-2], mask, is_causal)) @ v


class PackedGqaGroupOver4(VariantKernel):
    """Pack-GQA: a CTA holds min(g, 4) query heads of a group and a group takes ceil(g / 4) CTAs, but
    the CTA -> KV head map divides by floor(g / 4): right for g <= 4 and multiples of 4, wrong for
    groups of 5, 6, 7 (Qwen2.5-14B's 40/8, Qwen2-1.5B's 12/2, Qwen2.5-7B's 28/4)."""

    name = "broken-packed-gqa-group-over-4"
    capabilities = Capabilities(dtypes=("float32",), device="cpu", gradients=False, features=frozenset({"gqa"}))

    def _kv_heads(self, x, Hq, call):
        Hkv = x.shape[-3]
        if not call.enable_gqa or Hkv == Hq:
            return x
        g = Hq // Hkv
        per_cta = min(g, 4)
        h = np.arange(Hq)
        cta = (h // g) * -(-g // per_cta) + (h % g) // per_cta  # CTAs numbered group after group
        kv = np.minimum(cta // max(1, g // per_cta), Hkv - 1)  # the slip: floor, not ceil (an OOB read, clamped)
        return np.take(x, kv, axis=-3)


class WindowTwoMaskingSteps(VariantKernel):
    """A sliding-window kernel (64-query tiles, 64-key blocks) that visits key blocks from the window's
    first block but applies the left bound only in the two blocks nearest the tile's diagonal
    (n_masking_steps = 2): right while the window is at most a block wide, wrong for real windows
    (Mistral's 4096, Gemma's 512) - the blocks between are left unmasked."""

    name = "broken-window-two-masking-steps"
    capabilities = Capabilities(dtypes=("float64",), device="cpu", gradients=False, features=frozenset({"window"}))
    tile = 64

    def _visible(self, call, shape, Lq, Lk):
        vis = super()._visible(call, shape, Lq, Lk)
        if call.window is None or call.window[0] is None:
            return vis
        left, right = call.window
        loose = super()._visible(replace(call, window=None if right is None else (None, right)), shape, Lq, Lk)
        off = self._offset(call, Lq, Lk, "window")
        i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]  # (Lq, 1), (1, Lk)
        first_row = (i // self.tile) * self.tile
        last_row = np.minimum(first_row + self.tile - 1, Lq - 1)
        first_block = np.maximum(0, (first_row + off - left) // self.tile)
        diagonal_block = (last_row + off) // self.tile
        unbounded = (j // self.tile >= first_block) & (j // self.tile < diagonal_block - 1)  # (Lq, Lk)
        return vis | (loose & unbounded)


class ExplicitScaleHalfParam(NumpyBackend):
    """A float32 kernel whose launch parameters keep ``softmax_scale`` in a half (float16) field: an
    explicit scale is rounded to float16 (0.3 -> 0.29993); the default 1/sqrt(E), computed in the
    kernel, is right - and so is every power of two, exact in float16."""

    name = "broken-explicit-scale-half-param"
    capabilities = numpy_caps("float32")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        return _attention(q, k, v, mask, is_causal, None if scale is None else float(np.float16(scale)))


class KeyPaddingBiasBatch0(VariantKernel):
    """A (B, 1, 1, Lk) bias - the key-padding bias models build from an attention mask - takes a
    per-key-vector fast path that loads it with batch stride 0: every sequence gets the first's
    padding.  Every other bias shape takes the general path and is right."""

    name = "broken-key-padding-bias-batch0"
    capabilities = Capabilities(dtypes=("float32",), device="cpu", gradients=False, features=frozenset({"bias"}))

    def native_attention(self, q, k, v, call):
        b = call.bias
        if b is not None and np.ndim(b) == 4 and b.shape[0] > 1 and b.shape[1:3] == (1, 1):
            call = replace(call, bias=np.broadcast_to(b[:1], b.shape))  # the slip: batch stride 0
        return super().native_attention(q, k, v, call)
