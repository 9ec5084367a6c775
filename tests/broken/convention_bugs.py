"""Slips in the conventions kernels differ on (issue 31): merge entry points, tuning knobs, repeated
calls and batch invariance.  Each is the correct `VariantKernel` with one slip (the LSE-convention
slips live in variant_bugs.py, as slips of the kernel's own LSE).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends.base import Capabilities, Semantics
from attnspec.backends.numpy_backends import NumpyTiled

from ._kernels import store, tiled_attention, widened
from ._variants import VariantKernel


def _lse_caps(*dtypes: str, gradients: bool = False) -> Capabilities:
    return Capabilities(dtypes=dtypes, device="cpu", gradients=gradients, features=frozenset(("lse",)))


_DECLARED = dict(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros")


class MergeEmptyNaN(VariantKernel):
    """merge_state shifting by the larger LSE without a guard: two empty states give
    exp(-inf - -inf) = NaN (flashinfer-ai/flashinfer#4051)."""

    name = "broken-merge-empty-nan"
    capabilities = _lse_caps("bfloat16")

    def native_merge(self, o_a, lse_a, o_b, lse_b):
        top = np.maximum(lse_a, lse_b)  # (..., Lq) the slip: -inf for two empty states, unguarded
        with np.errstate(invalid="ignore"):
            wa, wb = np.exp(lse_a - top), np.exp(lse_b - top)  # (..., Lq) NaN when both are -inf
            total = wa + wb
            out = (widened(o_a)[0] * wa[..., None] + widened(o_b)[0] * wb[..., None]) / total[..., None]
        return store(out, "bfloat16"), top + np.log(total)


class MergeAverages(VariantKernel):
    """A merge that averages the two outputs, ignoring the LSE gap (the LSE itself right): right only
    for states of equal mass."""

    name = "broken-merge-averages"
    capabilities = _lse_caps("float64")

    def native_merge(self, o_a, lse_a, o_b, lse_b):
        lse = np.logaddexp(lse_a, lse_b)  # (..., Lq)
        both = np.isfinite(lse_a) & np.isfinite(lse_b)  # (..., Lq) one empty: the other as it is
        out = np.where(both[..., None], (o_a + o_b) / 2, o_a + o_b)  # the slip: weights 1/2, not exp(l - L)
        return out, lse


class KnobDropsTail(VariantKernel):
    """A block-size knob whose tiled loop runs Lk // block blocks: the last partial block dropped (a
    grid of floor(Lk / BLOCK_N) programs), right whenever the block divides Lk - the default's 1 does."""

    name = "broken-knob-drops-tail"
    capabilities = _lse_caps("float32")
    knobs = {"block_size": (1, 4, 16)}

    def native_attention(self, q, k, v, call):
        block = (call.knobs or {}).get("block_size", 1)
        full = k.shape[-2] // block * block  # the slip: the keys of whole blocks only
        if full in (0, k.shape[-2]):
            return super().native_attention(q, k, v, call)
        mask = None if call.mask is None else call.mask[..., :full]
        return super().native_attention(q, k[..., :full, :], v[..., :full, :], replace(call, mask=mask))


class BackwardKnobBlockDropsTail(NumpyTiled):
    """numpy-tiled with a backward whose key loop at a block size off the default runs Lk // block tiles (a
    tail mask compiled into the default block's instantiation only): dK, dV of the last keys zero, dQ without
    them.  Its forward is right at every block size, its backward at the default: knobs reached the forward
    only, so every check passed it until the knobs family took each setting through the backward."""

    name = "broken-backward-knob-block-drops-tail"
    capabilities = replace(NumpyTiled.capabilities, dtypes=("float32", "float64"))
    _in_backward = False

    def native_attention_backward(self, *args):
        self._in_backward = True
        try:
            return super().native_attention_backward(*args)
        finally:
            self._in_backward = False

    def _blocks(self, Lq, Lk, call):
        blocks = super()._blocks(Lq, Lk, call)
        if self._in_backward and (call.knobs or {}).get("block_size", self.block) != self.block:
            blocks = [(j0, j1) for j0, j1 in blocks if j1 - j0 == blocks[0][1] - blocks[0][0]]  # the slip
        return blocks


class BackwardRandomOrder(VariantKernel):
    """Declares a deterministic backward, but sums dQ over its key blocks in a random order each call
    (atomic adds from blocks finishing in any order: Dao-AILab/flash-attention#2244, #414)."""

    name = "broken-backward-random-order"
    capabilities = _lse_caps("float16", gradients=True)
    semantics = Semantics(**_DECLARED, deterministic=True)

    def native_attention_backward(self, q, k, v, grad_out, call):
        dq, *rest = super().native_attention_backward(q, k, v, grad_out, call)
        ulp = np.spacing(np.abs(dq)).astype(np.float32)  # (like dq) one float16 step
        step = np.random.default_rng().integers(-1, 2, dq.shape) * ulp  # the atomics' order: a last bit either way
        return (store(np.asarray(dq, dtype=np.float32) + step, call.dtype), *rest)


class RowDependsOnBatch(VariantKernel):
    """Declares batch invariance, but splits the keys in two (split-KV) when the batch is small - the
    split heuristic of decode kernels, counting programs per batch (vLLM's VLLM_BATCH_INVARIANT exists
    to turn it off): a sequence's rows round differently alone and in a batch."""

    name = "broken-row-depends-on-batch"
    capabilities = _lse_caps("float64")
    semantics = Semantics(**_DECLARED, batch_invariant=True)

    def native_attention(self, q, k, v, call):
        Lk = k.shape[-2]
        if q.ndim < 4 or q.shape[0] > 1 or Lk < 2 or call.mask is not None or call.is_causal or call.return_lse \
                or any(getattr(call, f) is not None for f in ("bias", "window", "kv_lengths", "q_lengths")):
            return super().native_attention(q, k, v, call)
        scale = 1 / np.sqrt(q.shape[-1]) if call.scale is None else call.scale
        vis = np.ones(q.shape[-2:-1] + (Lk,), dtype=bool)  # (Lq, Lk)
        kk, vv = self._kv_heads(k, q.shape[-3], call), self._kv_heads(v, q.shape[-3], call)
        return store(tiled_attention(*widened(q, kk, vv), vis, scale, (Lk + 1) // 2), call.dtype)  # two splits


def _stored_as(backend, o) -> str:
    """The dtype a merge's states arrived in: float32 storage is bfloat16 where float32 is not declared."""
    named = {np.dtype(np.float16): "float16", np.dtype(np.float64): "float64"}.get(o.dtype)
    return named or ("float32" if "float32" in backend.capabilities.dtypes else "bfloat16")


class MergeStatesDropsLast(VariantKernel):
    """A list merge (FA3's flash_attn_combine) whose loop runs over num_splits - 1 splits: the last split's
    keys never reach the output or the LSE - right whenever the last split saw nothing."""

    name = "broken-merge-states-drops-last"
    capabilities = _lse_caps("float32")

    def native_merge_states(self, o_parts, lse_parts):
        kept_o, kept_lse = o_parts[:-1], lse_parts[:-1]  # the slip: range(num_splits - 1)
        if not len(kept_lse):  # one split: nothing merged at all
            return np.zeros_like(o_parts[0]), np.full_like(lse_parts[0], -np.inf)
        top = kept_lse.max(axis=0)  # (..., Lq)
        shift = np.where(np.isfinite(top), top, 0)
        w = np.exp(kept_lse - shift)  # (C - 1, ..., Lq)
        total = w.sum(axis=0)  # (..., Lq)
        with np.errstate(divide="ignore"):
            lse = np.where(total > 0, shift + np.log(np.where(total > 0, total, 1)), -np.inf)
        out = (kept_o * (w / np.where(total > 0, total, 1))[..., None]).sum(axis=0)  # (..., Lq, Ev)
        return store(out, _stored_as(self, o_parts)), lse


class MergeStatesShiftByFirst(VariantKernel):
    """A list merge that shifts every split by the first split's LSE, not the largest (the max's
    initial value never updated): a split 1e4 above the first overflows exp to inf (then NaN), and an
    empty first split (-inf) makes every weight inf."""

    name = "broken-merge-states-shift-by-first"
    capabilities = _lse_caps("float16")

    def native_merge_states(self, o_parts, lse_parts):
        shift = np.where(np.isfinite(lse_parts[0]), lse_parts[0], 0)  # (..., Lq) the slip: split 0, not the max
        with np.errstate(over="ignore", invalid="ignore"):
            w = np.exp(lse_parts - shift)  # (C, ..., Lq) inf past float32's range
            total = w.sum(axis=0)  # (..., Lq)
            with np.errstate(divide="ignore"):
                lse = np.where(total > 0, shift + np.log(np.where(total > 0, total, 1)), -np.inf)  # (..., Lq)
            out = (widened(o_parts)[0] * (w / np.where(total > 0, total, 1))[..., None]).sum(axis=0)  # (..., Lq, Ev)
        return store(out, _stored_as(self, o_parts)), lse
