"""Slips a fifteenth review mirrored from real reports, each past a ceiling of the draws and the grids: a
split-KV launch past 4096 keys dropping causal for a chunk of queries, a 4096-key window read as no window, a
decode grid of at most 64 query heads on one KV head, a padding path gated on a batch of more than one, a long
prefill's tiling dropping the mask, dBias of a bias shared by the heads stored by the last head, a dQ tail chunk
dropped past 1024 keys, a varlen scheduler's 32nd sequence, a list merge of at most 128 splits.  The draws stop
at 300 keys, 14 heads, 3 packed sequences and 64 merged states, give key lengths only to batches of 2 or more,
and the grids had no field past 4096 keys or 769 queries; the suite now reaches each by construction.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

import attnspec.backends.numpy_backends as nb
from attnspec.backends import numpy_formats as nf
from attnspec.backends.numpy_backends import NumpyNaive

_DTYPES = ("float32", "float64")
_FORWARD = replace(NumpyNaive.capabilities, dtypes=_DTYPES, gradients=False)


class _CallSlip(NumpyNaive):
    """numpy-naive, its padded call's `call` changed by `slip` (the packed and paged calls, kernels of their
    own, right: numpy-naive's route them through the padded call, so the slip is switched off there)."""

    capabilities = _FORWARD
    _in_format = False

    def slip(self, q, k, call):
        return call

    def _format(self, route, *args):
        self._in_format = True
        try:
            return route(self, *args)
        finally:
            self._in_format = False

    def native_packed(self, *args):
        return self._format(nf.gathered_packed, *args)

    def native_paged(self, *args):
        return self._format(nf.gathered_paged, *args)

    def native_attention(self, q, k, v, call):
        return super().native_attention(q, k, v, call if self._in_format else self.slip(q, k, call))


class LongKeysChunkDropsCausal(_CallSlip):
    """Past 4096 keys (a split-KV launch of 16+ splits, Dao-AILab/flash-attention#1647's regime) a chunk of 2..16
    queries is launched without its causal flag: the chunk's queries see each other's future keys."""

    name = "broken-long-keys-chunk-drops-causal"

    def slip(self, q, k, call):
        chunk = 1 < q.shape[-2] <= 16 and k.shape[-2] > 4096
        return replace(call, is_causal=False) if chunk and call.is_causal else call


class WideWindowTreatedGlobal(_CallSlip):
    """A left window of 4096 keys or more mapped to -1, no window ("as wide as the compiled context"): Mistral's
    and Gemma's 4096-key window runs global once the cache passes 4097 keys."""

    name = "broken-wide-window-treated-global"

    def slip(self, q, k, call):
        if call.window is None or call.window[0] is None or call.window[0] < 4096:
            return call
        window = (None, call.window[1])
        return replace(call, window=None if window == (None, None) else window)


class BatchOneDropsKeyLengths(_CallSlip):
    """The key-padding path gated on a batch of more than one (huggingface/transformers#46773's `shape[0] > 1`):
    one sequence with key lengths attends to its padding keys."""

    name = "broken-batch-one-drops-key-lengths"

    def slip(self, q, k, call):
        return replace(call, kv_lengths=None) if q.ndim == 4 and q.shape[0] == 1 else call


class LongPrefillDropsMask(_CallSlip):
    """The long prefill's tiling (256-row query tiles from Lq 768, PyTorch's CPU flash) reached through a dispatch
    that drops the boolean mask: a long padded batch attends to its padding.  Shorter prefills right."""

    name = "broken-long-prefill-drops-mask"

    def slip(self, q, k, call):
        return replace(call, mask=None) if q.shape[-2] >= 768 else call


class MqaDecodeHeadsPast64(NumpyNaive):
    """An MQA/MLA decode (one KV head, Lq = 1) whose grid packs at most 64 query heads a KV head and launches one
    tile: heads 64.. of DeepSeek's 128 are never written (zeros).  Up to 64 heads, and prefill, right."""

    name = "broken-mqa-decode-heads-past-64"
    capabilities = _FORWARD

    def native_attention(self, q, k, v, call):
        y = super().native_attention(q, k, v, call)
        if not (call.enable_gqa and q.shape[-2] == 1 and k.shape[-3] == 1 and q.shape[-3] > 64):
            return y
        out, lse = y if call.return_lse else (y, None)
        out = out.copy()
        out[..., 64:, :, :] = 0  # (B, Hq, 1, Ev): the slip
        return (out, lse) if call.return_lse else out


class PackedLane31SequenceEmpty(NumpyNaive):
    """A varlen tile scheduler reading each sequence's end from the next lane of a 32-lane warp
    (`__shfl_down_sync`, as FA3's; vllm-project/flash-attention#82) without the `lane < 31` bound: sequence 31
    of every 32 gets a length <= 0 and its rows are never written.  Up to 31 sequences right."""

    name = "broken-packed-lane31-sequence-empty"
    capabilities = _FORWARD

    def native_packed(self, q, k, v, args, call):
        y = nf.gathered_packed(self, q, k, v, args, call)
        out, lse = y if call.return_lse else (y, None)
        cu_q = np.asarray(args.cu_seqlens_q, np.int64)  # (B + 1,)
        for b in range(31, cu_q.size - 1, 32):
            out[cu_q[b]:cu_q[b + 1]] = 0  # (tokens, Hq, Ev): the slip
            if lse is not None:
                lse[:, cu_q[b]:cu_q[b + 1]] = -np.inf
        return (out, lse) if call.return_lse else out


class MergeSplitsCapped128(NumpyNaive):
    """A list merge (flash_attn_combine) instantiated for at most 128 splits and dispatched with more: the splits
    past 128 are never read (deepseek-ai/FlashMLA#199: num_splits in (160, 256])."""

    name = "broken-merge-splits-capped-128"
    capabilities = _FORWARD

    def native_merge_states(self, o_parts, lse_parts):
        return super().native_merge_states(o_parts[:128], lse_parts[:128])  # the slip


class DbiasHeadBroadcastLastHead(NumpyNaive):
    """dBias of a (B, 1, Lq, Lk) bias (a 4-D mask or relative bias shared by the heads): each head's program
    stores its dS to the one broadcast row with a plain store, not an atomic add - the last head's wins.
    Per-head biases, and biases broadcast over queries too, right."""

    name = "broken-dbias-head-broadcast-last-head"
    capabilities = replace(NumpyNaive.capabilities, dtypes=_DTYPES)

    def native_attention_backward(self, q, k, v, grad_out, call):
        b, H = call.bias, q.shape[-3]
        if b is None or b.ndim != 4 or b.shape[-3] != 1 or b.shape[-2] == 1 or H == 1:
            return super().native_attention_backward(q, k, v, grad_out, call)
        full = (max(b.shape[0], q.shape[0]), H) + b.shape[-2:]  # (B, H, Lq, Lk)
        grads = super().native_attention_backward(q, k, v, grad_out, replace(call, bias=np.broadcast_to(b, full).copy()))
        dbias = nb._reduce(grads[3][:, -1:], b.shape).astype(grads[3].dtype)  # (B, 1, Lq, Lk): head H-1's dS only
        return grads[:3] + (dbias,) + grads[4:]


class BwdLongKeysDqTailChunk(NumpyNaive):
    """The padded backward past 1024 keys (dQ accumulated per 128-key chunk, then converted) drops the last
    partial chunk's dQ (its bound Lk // 128 * 128); dK, dV, the forward and shorter rows right."""

    name = "broken-bwd-long-keys-dq-tail-chunk"
    capabilities = replace(NumpyNaive.capabilities, dtypes=_DTYPES)

    _in_format = False  # the varlen backward, a kernel of its own, right

    def native_packed_backward(self, *args):
        self._in_format = True
        try:
            return nf.gathered_packed_backward(self, *args)
        finally:
            self._in_format = False

    def native_attention_backward(self, q, k, v, grad_out, call):
        grads = super().native_attention_backward(q, k, v, grad_out, call)
        Lk = k.shape[-2]
        if self._in_format or Lk <= 1024 or Lk % 128 == 0 or call.softcap is not None:
            return grads
        tail = Lk // 128 * 128
        ku, vu = nb._unpadded(k, call), nb._unpadded(v, call)  # (B, Hkv, Lk, E), (B, Hkv, Lk, Ev)
        a, _, _ = self._weights(q, ku, call)  # (B, H, Lq, Lk)
        ke, ve = (nb._expand(x, a.shape[-3]) for x in (ku, vu)) if call.enable_gqa else (ku, vu)
        da = grad_out @ np.swapaxes(ve, -1, -2)  # (B, H, Lq, Lk)
        da = (da - (da * a).sum(axis=-1, keepdims=True)) * a  # (B, H, Lq, Lk): dS
        dq_tail = (da[..., tail:] @ ke[..., tail:, :]) * nb._scale(q, call.scale)  # (B, H, Lq, E)
        dq = grads[0] - nb._reduce(dq_tail, q.shape)  # the slip: the tail chunk's dQ never added
        return (dq.astype(grads[0].dtype),) + tuple(grads[1:])
