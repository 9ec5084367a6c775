"""Slips a tenth review wrote where a kernel's declarations meet a regime the first probes never reached:
batch invariance broken by a split heuristic only on a grid too small to fill the machine, a backward's
atomic dQ adds past one 128-key block, a bitwise-declared num_splits that acts only past 1024 keys,
bad query-side varlen arguments taken silently (a non-monotone cu_seqlens_q, a max_seqlen_q too short),
a per-head key bias's dBias taken from one query row, an empty launch's output in float64; and two in the
backward it reached only at the deep profile: ALiBi's bottom-right offset dropped without causal, dSink's
p_sink from a row pass without the window.  Each is
numpy-naive (correct in every format it declares) with one slip; the suite reaches each by construction
(properties/test_conventions.py's probes at 300 keys and a batch of 64, test_knobs.py's 2000-key
setting, test_bad_indices.py's query-side questions, the backward grid's (B, H, 1, Lk) bias,
test_semantics.py's empty sizes against a call with rows, the backward grid's non-causal bottom-right ALiBi
row and sinks under a window).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends.numpy_backends import NumpyNaive, _batch, _dsink, _expand, _reduce, _sink, _unpadded, tile_scores


def _caps(*dtypes: str):
    return replace(NumpyNaive.capabilities, dtypes=dtypes, gradients=True)


def _split_softmax(s, ve, sink, n: int):
    """Final scores s (..., Lq, Lk; hidden -inf) cut into n key splits, each split's (o, lse) alone, merged by
    their LSEs (flash-decoding); the sink merged as one more state.  (out, lse)."""
    Lk = s.shape[-1]
    cuts = [round(i * Lk / n) for i in range(n + 1)]
    outs, lses = [], []
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        m = s[..., a:b].max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Lq, 1)
        e = np.exp(s[..., a:b] - np.where(np.isfinite(m), m, 0))  # (..., Lq, b - a)
        total = e.sum(axis=-1, keepdims=True)  # (..., Lq, 1)
        outs.append((e @ ve[..., a:b, :]) / np.where(total == 0, 1, total))  # (..., Lq, Ev)
        with np.errstate(divide="ignore"):
            lses.append(np.where(total[..., 0] > 0, np.where(np.isfinite(m), m, 0)[..., 0] + np.log(total[..., 0]),
                                 -np.inf))  # (..., Lq)
    if sink is not None:
        outs.append(np.zeros_like(outs[0]))
        lses.append(np.broadcast_to(sink[..., 0], lses[0].shape))
    lse_parts = np.stack(lses)  # (n, ..., Lq)
    top = lse_parts.max(axis=0)
    w = np.exp(lse_parts - np.where(np.isfinite(top), top, 0))  # (n, ..., Lq)
    total = w.sum(axis=0)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, np.where(np.isfinite(top), top, 0) + np.log(np.where(total > 0, total, 1)), -np.inf)
    w = w / np.where(total > 0, total, 1)
    out = sum(w[i][..., None] * outs[i] for i in range(len(outs)))  # (..., Lq, Ev)
    return out.astype(s.dtype, copy=False), lse


class _SplitKernel(NumpyNaive):
    """numpy-naive whose forward may take a split-KV path (n splits), as `_splits` says."""

    def _splits(self, q, k, call) -> int:
        return 1

    def native_attention(self, q, k, v, call):
        n = self._splits(q, k, call)
        if n == 1 or k.shape[-2] < n:
            return super().native_attention(q, k, v, call)
        k, v = _unpadded(k, call), _unpadded(v, call)
        s = tile_scores(q, k, call, 0, k.shape[-2])  # (..., Hq, Lq, Lk) final scores
        ve = _expand(v, s.shape[-3]) if call.enable_gqa else v
        out, lse = _split_softmax(s, ve, _sink(call, s.dtype), n)
        return (out, lse) if call.return_lse else out


class BatchInvariantSplitSmallGrid(_SplitKernel):
    """Declares batch_invariant, but a launch heuristic splits the keys in two whenever batch x heads < 8 (a
    grid too small to fill the SMs): a sequence alone and in a batch of 3 (6 work items) take the split path
    both, in a batch of 64 the one-pass path - other bits."""

    name = "broken-batch-invariant-split-small-grid"
    capabilities = _caps("float32")
    semantics = replace(NumpyNaive.semantics, batch_invariant=True)

    def _splits(self, q, k, call) -> int:
        return 2 if int(np.prod(q.shape[:-2])) < 8 else 1


class KnobSplitsExactPast1024(_SplitKernel):
    """A num_splits knob (1, 2, 3) declared bitwise (knob_exact), which acts only where the split heuristic
    lets it (few queries, at least 4 key blocks of 256 a split: from 1024 keys); there the merged splits give
    other bits than one pass."""

    name = "broken-knob-splits-exact-past-1024"
    capabilities = _caps("float32")
    semantics = replace(NumpyNaive.semantics, knob_exact=True)
    knobs = {"num_splits": (1, 2, 3)}

    def _splits(self, q, k, call) -> int:
        n = (call.knobs or {}).get("num_splits", 1)
        return n if q.shape[-2] <= 16 and k.shape[-2] >= 1024 else 1


class BackwardAtomicDqPastOneBlock(NumpyNaive):
    """Declares deterministic, but dQ is the sum of per-128-key-block partials added in the order the blocks
    finish (atomics): each call here adds them in another order than the one before, so repeats agree
    bitwise only while Lk <= 128 (one block)."""

    name = "broken-backward-atomic-dq-past-one-block"
    capabilities = _caps("float32")
    semantics = replace(NumpyNaive.semantics, deterministic=True)
    calls = 0

    def native_attention_backward(self, q, k, v, grad_out, call):
        grads = list(super().native_attention_backward(q, k, v, grad_out, call))
        Lk = k.shape[-2]
        if Lk <= 128 or call.enable_gqa or call.sinks is not None or call.softcap is not None:
            return tuple(grads)
        type(self).calls += 1
        a = self._weights(q, _unpadded(k, call), call)[0]  # (..., Lq, Lk)
        da = grad_out @ np.swapaxes(v, -1, -2)  # (..., Lq, Lk)
        ds = a * (da - (da * a).sum(axis=-1, keepdims=True))  # dS
        blocks = [(j, min(j + 128, Lk)) for j in range(0, Lk, 128)]
        order = blocks if type(self).calls % 2 else blocks[::-1]  # the slip: the blocks' finishing order
        scale = 1 / np.sqrt(q.shape[-1]) if call.scale is None else call.scale
        dq = np.zeros(ds.shape[:-1] + k.shape[-1:], dtype=q.dtype)  # (..., Lq, E)
        for j0, j1 in order:
            dq = dq + (ds[..., j0:j1] @ k[..., j0:j1, :] * scale).astype(q.dtype)
        grads[0] = _reduce(dq, q.shape).astype(q.dtype)
        return tuple(grads)


class DbiasPerHeadKeyBiasLastRow(NumpyNaive):
    """dBias of a bias broadcast over queries alone, (B, H, 1, Lk): each query-row program stores its dS row
    into the one broadcast row (no reduction): the last row wins.  (B, 1, 1, Lk) and (1, H, 1, Lk) go
    through the reducing epilogue and are right."""

    name = "broken-dbias-per-head-key-bias-last-row"
    capabilities = _caps("float64")

    def native_attention_backward(self, q, k, v, grad_out, call):
        grads = super().native_attention_backward(q, k, v, grad_out, call)
        shape = np.shape(call.bias) if call.bias is not None else ()
        if len(shape) != 4 or shape[-2] != 1 or shape[0] == 1 or shape[1] == 1 or q.shape[-2] == 1:
            return grads
        a = self._weights(q, _unpadded(k, call), call)[0]  # (B, H, Lq, Lk)
        ve = _expand(v, a.shape[-3]) if call.enable_gqa else v
        da = grad_out @ np.swapaxes(ve, -1, -2)  # (B, H, Lq, Lk)
        ds = a * (da - (da * a).sum(axis=-1, keepdims=True))  # dS
        return grads[:3] + (ds[..., -1:, :].astype(q.dtype),) + grads[4:]  # the slip: the last row's dS


class EmptySizesOutputFloat64(NumpyNaive):
    """An early return for an empty launch (Lq = 0, Lk = 0 or batch 0) hands back np.zeros(shape): float64
    whatever the input's dtype (zeros, as fully_masked = zeros declares, but in the wrong dtype)."""

    name = "broken-empty-sizes-output-float64"
    capabilities = _caps("float32")

    def native_attention(self, q, k, v, call):
        batch = _batch(q, k, v, call)
        if q.shape[-2] == 0 or k.shape[-2] == 0 or 0 in batch:
            out = np.zeros(batch + (q.shape[-2], v.shape[-1]))  # the slip: np.zeros' float64
            return (out, np.full(batch + (q.shape[-2],), -np.inf)) if call.return_lse else out
        return super().native_attention(q, k, v, call)


class BadIndicesQueryUnchecked(NumpyNaive):
    """Declares rejects_bad_indices and validates cu_seqlens_k and seqused_k, never the query side: a
    non-monotone cu_seqlens_q slices a sequence's rows out of order (none where it decreases), and a
    max_seqlen_q below a sequence's queries (a grid sized by it) leaves its last rows unwritten (0)."""

    name = "broken-bad-indices-query-unchecked"
    capabilities = _caps("float32")
    semantics = replace(NumpyNaive.semantics, rejects_bad_indices=True)

    def native_packed(self, q, k, v, args, call):
        cu_k = np.asarray(args.cu_seqlens_k, np.int64)
        if cu_k[0] < 0 or np.any(np.diff(cu_k) < 0) or cu_k[-1] > k.shape[0]:
            raise ValueError(f"cu_seqlens_k must be non-decreasing within the key tensor; got {cu_k.tolist()}")
        used = np.diff(cu_k) if args.seqused_k is None else np.asarray(args.seqused_k, np.int64)
        if np.any(used > np.diff(cu_k)):
            raise ValueError("seqused_k exceeds a sequence's keys")
        cu_q = np.asarray(args.cu_seqlens_q, np.int64)
        out = np.zeros((q.shape[0], q.shape[1], v.shape[2]), q.dtype)  # (total_q, Hq, Ev)
        lse = np.full((q.shape[1], q.shape[0]), -np.inf)  # (Hq, total_q)
        for b in range(cu_q.size - 1):
            r0 = int(cu_q[b])
            r1 = min(max(r0, int(cu_q[b + 1])), r0 + int(args.max_seqlen_q))  # the slip: the query side trusted
            if r1 == r0:
                continue
            qb = np.swapaxes(q[r0:r1], 0, 1)[None]  # (1, Hq, n, E)
            kb, vb = (np.swapaxes(x[cu_k[b]:cu_k[b] + used[b]], 0, 1)[None] for x in (k, v))  # (1, Hkv, m, D)
            seq = replace(call, positions="per_sequence", q_lengths=None, kv_lengths=None, kv_starts=None)
            y = self.native_attention(qb, kb, vb, seq)
            o, lb = y if call.return_lse else (y, None)
            out[r0:r1] = np.swapaxes(o[0], 0, 1)
            if lb is not None:
                lse[:, r0:r1] = lb[0]
        return (out, lse) if call.return_lse else out


class AlibiBackwardTopLeftWithoutCausal(NumpyNaive):
    """The backward's recompute applies ALiBi's bottom-right offset Lk - Lq only in its causal branch: a
    non-causal call that asks for bottom-right recomputes P with top-left distances (the forward right)."""

    name = "broken-alibi-backward-top-left-without-causal"
    capabilities = _caps("float64")

    def native_attention_backward(self, q, k, v, grad_out, call):
        if call.alibi_slopes is not None and not call.is_causal and call.positions != "per_sequence" \
                and call.causal_alignment == "bottom_right":
            call = replace(call, causal_alignment="top_left")  # the slip: no causal flag, no offset
        return super().native_attention_backward(q, k, v, grad_out, call)


class DsinkWithoutWindow(NumpyNaive):
    """dSink's pass recomputes p_sink = exp(sink - LSE) from a row pass that has no window argument: under a
    sliding window p_sink is too small (the LSE of every key); dQ, dK and dV right."""

    name = "broken-dsink-without-window"
    capabilities = _caps("float64")

    def native_attention_backward(self, q, k, v, grad_out, call):
        grads = super().native_attention_backward(q, k, v, grad_out, call)
        if call.sinks is None or call.window is None:
            return grads
        ku, vu = _unpadded(k, call), _unpadded(v, call)
        a = self._weights(q, ku, call)[0]  # (..., Hq, Lq, Lk) the windowed weights: the output is right
        a_sink = self._weights(q, ku, replace(call, window=None))[2]  # the slip: p_sink of the unwindowed row
        out = a @ (_expand(vu, a.shape[-3]) if call.enable_gqa else vu)  # (..., Hq, Lq, Ev)
        return grads[:-1] + (_dsink(call, a_sink, grad_out, out),)
