"""NumPy backends: the naive one materialises the scores; the tiled one never does.

Both take every field of the problem natively (they are ours): grouped KV heads, bias, both
causal alignments, windows, lengths, segments, softcap, ALiBi, the log-sum-exp.  They build
their own masks from indices - never from `specs` - so a slip in the definition's helpers
cannot hide the same slip here.  numpy-naive keeps every step in the input dtype.
numpy-tiled computes float16 inputs in float32, as FlashAttention keeps its running maximum,
sum and accumulator: rescaling a float16 accumulator block after block would lose the row total.
"""
from __future__ import annotations

import numpy as np

from attnspec.backends import numpy_formats, numpy_fp8
from attnspec.backends.base import LAYOUTS, Backend, Capabilities, Semantics
from attnspec.specs.fields import EVERY_FEATURE
from attnspec.specs.masks import sequence_offsets

_NUMPY_DTYPES = ("float16", "float32", "float64")
_FP8 = tuple(numpy_fp8.P_FORMATS)  # forward-only: FA3's fp8 arithmetic, emulated (numpy-tiled)
_ALL_FEATURES = EVERY_FEATURE | {"seq_positions", "sinks"}  # the whole definition, per-sequence positions and sinks too
_FORMATS = ("padded", "packed", "paged-NHD", "paged-HND", "paged-stacked-NHD", "paged-stacked-HND",
            "append")  # specs.formats.FORMATS: backends/numpy_formats.py
_ROW_BLOCK = 128  # rows per index-masking step: bounds the bool temporary to 128*Lk


def _scale(q, scale):
    return q.dtype.type(1.0 / np.sqrt(q.shape[-1]) if scale is None else scale)


def _sink(call, dtype):
    """(Hq, 1, 1) the sinks in the compute dtype (broadcast over each head's rows), or None."""
    return None if call.sinks is None else np.asarray(call.sinks).astype(dtype)[:, None, None]


def _dsink(call, a_sink, go, out):
    """dSink (Hq,): -sum over batch and rows of p_sink (dO . O), in the sinks' dtype."""
    ds = -(a_sink[..., 0] * (go * out).sum(axis=-1))  # (..., Hq, Lq)
    return ds.reshape(-1, *ds.shape[-2:]).sum(axis=(0, 2)).astype(np.asarray(call.sinks).dtype)  # (Hq,)


def _offset(call, Lq, Lk):
    """Query 0's diagonal: Lk - Lq bottom-right, else 0; per sequence (B..., 1, 1, 1) with per-sequence positions."""
    if call.positions == "per_sequence":
        o = sequence_offsets(Lq, Lk, call.causal_alignment, call.q_lengths, call.kv_lengths, call.kv_starts)
        return np.asarray(o)[..., None, None, None]
    return Lk - Lq if call.causal_alignment == "bottom_right" else 0


def _cols(x, j0, j1):
    """Columns j0:j1 of a (..., Lq, Lk) mask or bias, unless it broadcasts over keys."""
    return None if x is None else (x if x.shape[-1] == 1 else x[..., j0:j1])


def _hide_by_index(s, call, Lq, Lk, col0):
    """-inf where the causal triangle or the window hides key col0+j from query i (row blocks)."""
    if not call.is_causal and call.window is None:
        return
    left, right = call.window if call.window is not None else (None, None)
    right = 0 if call.is_causal and (right is None or right > 0) else right
    o = _offset(call, Lq, Lk)
    cols = np.arange(col0, col0 + s.shape[-1])  # (b,)
    for r in range(0, Lq, _ROW_BLOCK):
        rows = np.arange(r, min(r + _ROW_BLOCK, Lq))[:, None]  # (rb, 1)
        diag = rows + o  # (rb, 1) or (B..., 1, rb, 1) per sequence: the key on query i's diagonal
        if right is not None:  # small bool blocks only: (rb, b)
            np.copyto(s[..., r:r + len(rows), :], -np.inf, where=cols[None, :] > diag + right)
        if left is not None:
            np.copyto(s[..., r:r + len(rows), :], -np.inf, where=cols[None, :] < diag - left)


def _grow(s, shape):
    full = np.broadcast_shapes(s.shape, shape)
    return s if full == s.shape else np.broadcast_to(s, full).copy()


def tile_scores(q, k, call, col0, Lk):
    """Final scores of keys col0 .. col0 + k.shape[-2] for every query, hidden pairs at -inf.

    q (..., Hq, Lq, E); k (..., Hkv, b, E) is a key block.  Grouped heads are handled by
    grouping queries (no copy of K): (..., Hkv, group, Lq, E) against (..., Hkv, 1, b, E).
    """
    Lq, b = q.shape[-2], k.shape[-2]
    j1 = col0 + b
    group = q.shape[-3] // k.shape[-3] if call.enable_gqa else 1
    if group > 1:
        qg = q.reshape(q.shape[:-3] + (k.shape[-3], group) + q.shape[-2:])  # (..., Hkv, g, Lq, E)
        s = qg @ np.swapaxes(k, -1, -2)[..., None, :, :]  # (..., Hkv, g, Lq, b)
        s = s.reshape(s.shape[:-4] + (q.shape[-3], Lq, b))  # (..., Hq, Lq, b)
    else:
        s = q @ np.swapaxes(k, -1, -2)  # (..., Lq, b) the one O(Lq*b) buffer
    s *= _scale(q, call.scale)
    if call.softcap is not None:
        cap = s.dtype.type(call.softcap)
        s /= cap
        np.tanh(s, out=s)
        s *= cap
    bias = _cols(call.bias, col0, j1)
    if bias is not None:
        s = _grow(s, bias.shape)
        s += np.where(np.isneginf(bias), s.dtype.type(0), bias).astype(s.dtype, copy=False)
        np.copyto(s, -np.inf, where=np.isneginf(bias))
    if call.alibi_slopes is not None:
        dist = np.abs(np.arange(Lq)[:, None] + _offset(call, Lq, Lk) - np.arange(col0, j1)[None, :])  # (Lq, b)
        term = np.asarray(call.alibi_slopes, np.float64)[:, None, None] * dist  # (Hq, Lq, b) or (B..., Hq, Lq, b)
        s = _grow(s, term.shape)
        s -= term.astype(s.dtype)
    mask = _cols(call.mask, col0, j1)
    if mask is not None:
        s = _grow(s, mask.shape)
        np.copyto(s, -np.inf, where=~mask)  # ~mask: the one bool temporary of the mask path
    _hide_by_index(s, call, Lq, Lk, col0)
    if call.kv_lengths is not None:
        np.copyto(s, -np.inf, where=np.arange(col0, j1) >= np.asarray(call.kv_lengths)[..., None, None, None])
    if call.kv_starts is not None:  # left padding: hidden (and zeroed by _unpadded: never read)
        np.copyto(s, -np.inf, where=np.arange(col0, j1) < np.asarray(call.kv_starts)[..., None, None, None])
    if call.q_lengths is not None:
        np.copyto(s, -np.inf, where=np.arange(Lq)[:, None] >= np.asarray(call.q_lengths)[..., None, None, None])
    if call.q_segment_ids is not None:
        qs = np.asarray(call.q_segment_ids)[..., None, :, None]  # (..., 1, Lq, 1)
        ks = np.asarray(call.kv_segment_ids)[..., None, None, col0:j1]  # (..., 1, 1, b)
        np.copyto(s, -np.inf, where=qs != ks)
    return s  # (..., Hq, Lq, b)


def _batch(q, k, v, call) -> tuple:
    """Leading dims of the output: q's, K/V's (their head axis counted as Hq when grouped), mask's, bias's."""
    def kv(x):
        return x.shape[:-3] + q.shape[-3:-2] if call.enable_gqa else x.shape[:-2]
    extra = [x.shape[:-2] for x in (call.mask, call.bias) if x is not None]
    return tuple(np.broadcast_shapes(q.shape[:-2], kv(k), kv(v), *extra))


def _unpadded(x, call):
    """Keys past kv_lengths and before kv_starts zeroed: padding is never read (it may hold NaN or garbage)."""
    if call.kv_lengths is None and call.kv_starts is None:
        return x
    j = np.arange(x.shape[-2])
    padded = np.zeros(x.shape[-2], dtype=bool)
    if call.kv_lengths is not None:
        padded = padded | (j >= np.asarray(call.kv_lengths)[..., None, None])  # (..., 1, Lk)
    if call.kv_starts is not None:
        padded = padded | (j < np.asarray(call.kv_starts)[..., None, None])
    return np.where(padded[..., None], x.dtype.type(0), x)  # (..., Hkv, Lk, D)


def _reduce(g, shape):
    """Sum a gradient over broadcast leading axes back to its input's shape."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _group_sum(g, kv_heads: int):
    """(..., Hq, L, D) -> (..., Hkv, L, D): sum each group of query heads (the KV gradient)."""
    if g.shape[-3] == kv_heads:
        return g
    return g.reshape(g.shape[:-3] + (kv_heads, g.shape[-3] // kv_heads) + g.shape[-2:]).sum(axis=-3)


def _expand(x, heads: int):
    return x if x.shape[-3] == heads else np.repeat(x, heads // x.shape[-3], axis=-3)


def _softcap_factor(q, k, call):
    """1 - tanh^2(raw / cap) for the backward, or None without a softcap."""
    if call.softcap is None:
        return None
    raw = (q @ np.swapaxes(_expand(k, q.shape[-3]) if call.enable_gqa else k, -1, -2)) * _scale(q, call.scale)
    t = np.tanh(raw / q.dtype.type(call.softcap))  # (..., Lq, Lk)
    return 1 - t * t


class NumpyNaive(Backend):
    """Materialises the (..., Lq, Lk) score matrix once and does the softmax in place."""

    name = "numpy-naive"
    capabilities = Capabilities(dtypes=_NUMPY_DTYPES, device="cpu", gradients=True, features=_ALL_FEATURES,
                                bias_gradient=True, layouts=LAYOUTS, formats=_FORMATS)
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros",
                          lse_base="e", empty_lse="-inf", deterministic=True, batch_invariant=True)
    native_packed = numpy_formats.gathered_packed  # its own gather into a padded batch
    native_paged = numpy_formats.gathered_paged
    native_paged_append = numpy_formats.appended_paged
    native_packed_backward = numpy_formats.gathered_packed_backward

    def _weights(self, q, k, call):
        s = tile_scores(q, k, call, 0, k.shape[-2])  # (..., Lq, Lk)
        sink = _sink(call, s.dtype)  # (Hq, 1, 1): one more logit in the denominator
        row_max = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Lq, 1)
        if sink is not None:
            row_max = np.maximum(row_max, sink)  # (..., Lq, 1)
        row_max[~np.isfinite(row_max)] = 0  # fully masked rows: all -inf, keep exp = 0
        s -= row_max
        np.exp(s, out=s)
        total = s.sum(axis=-1, keepdims=True)  # (..., Lq, 1)
        e_sink = None if sink is None else np.exp(sink - row_max)  # (..., Lq, 1) the sink's value is 0
        if e_sink is not None:
            total = total + e_sink
        with np.errstate(divide="ignore"):
            lse = np.where(total[..., 0] > 0, row_max[..., 0] + np.log(total[..., 0]), -np.inf)  # (..., Lq)
        total[total == 0] = 1  # fully masked rows stay zero
        s /= total
        return s, lse, None if e_sink is None else e_sink / total  # (..., Lq, Lk), (..., Lq), the sink's (..., Lq, 1)

    def native_attention(self, q, k, v, call):
        k, v = _unpadded(k, call), _unpadded(v, call)
        w, lse, _ = self._weights(q, k, call)
        out = w @ (_expand(v, w.shape[-3]) if call.enable_gqa else v)  # (..., Lq, Ev)
        return (out, lse) if call.return_lse else out

    def native_merge_states(self, o_parts, lse_parts):
        """FA3's flash_attn_combine: shift by the largest LSE, weigh each split by exp(its LSE - the merged LSE);
        rows where every split is empty give (0, -inf), never exp(-inf - -inf)."""
        top = lse_parts.max(axis=0)  # (..., Lq)
        shift = np.where(np.isfinite(top), top, 0)  # all empty: exp(-inf - 0) = 0
        w = np.exp(lse_parts - shift)  # (C, ..., Lq)
        total = w.sum(axis=0)  # (..., Lq)
        with np.errstate(divide="ignore"):
            lse = np.where(total > 0, shift + np.log(np.where(total > 0, total, 1)), -np.inf)  # (..., Lq)
        w = w / np.where(total > 0, total, 1)  # (C, ..., Lq)
        wide = np.promote_types(o_parts.dtype, np.float32)  # 16-bit states weighed in float32
        terms = o_parts.astype(wide) * w[..., None].astype(wide)  # (C, ..., Lq, Ev)
        # an empty split's output is never read (specs.reference.merge): 0 x NaN of one never written stays 0
        terms = np.where(np.isfinite(lse_parts)[..., None], terms, 0)  # (C, ..., Lq, Ev)
        return terms.sum(axis=0).astype(o_parts.dtype), lse

    def native_attention_backward(self, q, k, v, grad_out, call):
        sc = _scale(q, call.scale)
        k, v = _unpadded(k, call), _unpadded(v, call)
        a, _, a_sink = self._weights(q, k, call)  # (..., Lq, Lk), the sink's (..., Lq, 1)
        ke, ve = (_expand(x, a.shape[-3]) for x in (k, v)) if call.enable_gqa else (k, v)
        dv = np.swapaxes(a, -1, -2) @ grad_out  # (..., Hq, Lk, Ev)
        da = grad_out @ np.swapaxes(ve, -1, -2)  # (..., Lq, Lk)
        da -= (da * a).sum(axis=-1, keepdims=True)
        da *= a  # dS, in place: the gradient of the final scores
        dbias = None if call.bias is None else _reduce(da, call.bias.shape).copy()  # da changes next
        factor = _softcap_factor(q, k, call)
        if factor is not None:
            da *= factor
        dq = (da @ ke) * sc  # (..., Lq, E)
        dk = (np.swapaxes(da, -1, -2) @ q) * sc  # (..., Hq, Lk, E)
        grads = (_reduce(dq, q.shape), _reduce(_group_sum(dk, k.shape[-3]) if call.enable_gqa else dk, k.shape),
                 _reduce(_group_sum(dv, v.shape[-3]) if call.enable_gqa else dv, v.shape))
        grads = grads + ((dbias.astype(q.dtype, copy=False),) if dbias is not None else ())
        if call.sinks is None:
            return grads
        return grads + (_dsink(call, a_sink, grad_out, a @ ve),)


class NumpyTiled(Backend):
    """Online softmax over key blocks (the FlashAttention recurrence).

    Extra memory is O(Lq * block): one (..., Lq, block) score tile at a time, plus the
    running row maximum m, row sum l and output accumulator.  The backward pass keeps
    only the log-sum-exp from the forward and recomputes each tile (FlashAttention-2).
    Blocks that no query can see (past the causal diagonal) are skipped.
    """

    name = "numpy-tiled"
    capabilities = Capabilities(dtypes=_NUMPY_DTYPES + _FP8, device="cpu", gradients=True,
                                features=_ALL_FEATURES | {"descale"}, bias_gradient=True, layouts=LAYOUTS,
                                formats=_FORMATS)
    native_packed = numpy_formats.tiled_packed  # natively: a sequence's slice, the pages as key blocks
    native_paged = numpy_formats.tiled_paged
    native_paged_append = numpy_formats.appended_paged
    native_packed_backward = numpy_formats.gathered_packed_backward
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros",
                          notes=("float16 inputs are computed in float32 (FlashAttention's accumulators)",
                                 "fp8 inputs as FA3 computes them: float32, P rounded to the input's format"),
                          lse_base="e", empty_lse="-inf", deterministic=True, batch_invariant=True,
                          output_dtypes=tuple((d, "float32") for d in _FP8), p_dtypes=tuple((d, d) for d in _FP8))

    def __init__(self, block: int = 128):
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block must be a positive int; got {block!r}")
        self.block = block
        # the key block as a per-call knob (Call.knobs): its default first, then sizes that cut most draws' tails
        self.knobs = {"block_size": (block,) + tuple(b for b in (16, 32, 64, 7) if b != block)}

    def _blocks(self, Lq, Lk, call):
        """Key blocks [j0, j1); with causal, blocks past the last query's diagonal are skipped."""
        end = Lk
        if call.is_causal or (call.window is not None and call.window[1] is not None):
            right = 0 if call.is_causal else call.window[1]
            end = max(0, min(Lk, Lq - 1 + int(np.max(_offset(call, Lq, Lk), initial=-Lq)) + right + 1))
        block = (call.knobs or {}).get("block_size", self.block)
        return [(j0, min(j0 + block, end)) for j0 in range(0, end, block)]

    def _forward(self, q, k, v, call, tiles=None, p_dtype=None):
        """tiles: (j0, key block, value block) in order; default k and v cut into self.block keys
        (a paged call's tiles are its pages: backends/numpy_formats.py); p_dtype: each tile's P rounded
        to this fp8 format before P V (backends/numpy_fp8.py)."""
        Lq, Lk = q.shape[-2], k.shape[-2]
        batch = _batch(q, k, v, call)
        if tiles is None:
            tiles = ((j0, k[..., j0:j1, :], v[..., j0:j1, :]) for j0, j1 in self._blocks(Lq, Lk, call))
        m = np.full(batch + (Lq, 1), -np.inf, dtype=q.dtype)  # (..., Lq, 1) running max
        row_sum = np.zeros(batch + (Lq, 1), dtype=q.dtype)  # (..., Lq, 1) running sum
        acc = np.zeros(batch + (Lq, v.shape[-1]), dtype=q.dtype)  # (..., Lq, Ev)
        for j0, kb, vb in tiles:
            s = tile_scores(q, kb, call, j0, Lk)  # (..., Lq, b)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))  # (..., Lq, 1)
            shift = np.where(np.isfinite(m_new), m_new, 0)  # rows with nothing visible yet
            alpha = np.exp(m - shift)  # (..., Lq, 1) rescales what was summed so far
            s -= shift
            np.exp(s, out=s)  # p, in place
            row_sum = row_sum * alpha + s.sum(axis=-1, keepdims=True)
            acc *= alpha
            p = s if p_dtype is None else numpy_fp8.round_p(s, p_dtype)  # P as the fp8 GEMM takes it
            acc += p @ (_expand(vb, s.shape[-3]) if call.enable_gqa else vb)
            m = m_new
            del s, p  # free this tile before the next one is computed: one tile alive at a time
        sink = _sink(call, q.dtype)  # (Hq, 1, 1)
        if sink is not None:  # folded once, after the loop (FlashInfer): a key of value 0
            m_new = np.maximum(m, sink)  # (..., Lq, 1)
            shift = np.where(np.isfinite(m_new), m_new, 0)
            alpha = np.exp(m - shift)  # (..., Lq, 1)
            row_sum = row_sum * alpha + np.exp(sink - shift)
            acc = acc * alpha
            m = m_new
        shift = np.where(np.isfinite(m), m, 0)  # (..., Lq, 1) fully masked rows: m = -inf
        total = np.where(row_sum == 0, 1, row_sum)  # (..., Lq, 1) and row_sum = 0: their output stays zero
        with np.errstate(divide="ignore"):
            lse = np.where(row_sum[..., 0] > 0, shift[..., 0] + np.log(total[..., 0]), -np.inf)  # (..., Lq)
        return acc / total, shift, total, lse  # (..., Lq, Ev), the row statistics, (..., Lq)

    @staticmethod
    def _widen(*xs):
        """float16 runs in float32 (FlashAttention's accumulators); others as given."""
        return [x if x is None or x.dtype != np.float16 else x.astype(np.float32) for x in xs]

    def _wide_call(self, call):
        from dataclasses import replace
        return call if call.bias is None else replace(call, bias=self._widen(call.bias)[0])

    def to_native(self, x, dtype):
        """fp8 values held exactly in float32 (NumPy has no fp8 type: backends/numpy_fp8.py)."""
        return x.astype(np.float32) if dtype in numpy_fp8.P_FORMATS else super().to_native(x, dtype)

    def native_attention(self, q, k, v, call):
        k, v = _unpadded(k, call), _unpadded(v, call)
        if call.dtype in numpy_fp8.P_FORMATS:  # FA3's fp8 forward: P rounded to the input's format
            qd, kd = numpy_fp8.dequantised_qk(q, k, call)
            out, _, _, lse = self._forward(qd, kd, v, call, p_dtype=call.dtype)  # (..., Lq, Ev)
            out = numpy_fp8.descaled_output(out, call).astype(np.float32)
            return (out, lse) if call.return_lse else out
        qw, kw, vw = self._widen(q, k, v)
        qw, kw = numpy_fp8.dequantised_qk(qw, kw, call)  # descales in any dtype (their first use: fp8)
        out, _, _, lse = self._forward(qw, kw, vw, self._wide_call(call))  # (..., Lq, Ev)
        out = numpy_fp8.descaled_output(out, call).astype(q.dtype, copy=False)
        return (out, lse) if call.return_lse else out

    def native_attention_backward(self, q, k, v, grad_out, call):
        dtype = q.dtype
        q, k, v, go = self._widen(q, _unpadded(k, call), _unpadded(v, call), grad_out)
        call = self._wide_call(call)
        sc = _scale(q, call.scale)
        out, shift, total, _ = self._forward(q, k, v, call)  # (..., Lq, Ev), 2 x (..., Lq, 1)
        d = (go * out).sum(axis=-1, keepdims=True)  # (..., Lq, 1) rowsum(dO * O)
        Hq = out.shape[-3] if out.ndim >= 3 else 1
        dq = np.zeros(out.shape[:-1] + q.shape[-1:], dtype=q.dtype)  # (..., Lq, E)
        dk_full = np.zeros(out.shape[:-2] + k.shape[-2:], dtype=q.dtype)  # (..., Hq, Lk, E)
        dv_full = np.zeros(out.shape[:-2] + v.shape[-2:], dtype=q.dtype)  # (..., Hq, Lk, Ev)
        dbias = None if call.bias is None else np.zeros(np.broadcast_shapes(out.shape[:-1] + k.shape[-2:-1],
                                                                            call.bias.shape), dtype=q.dtype)
        Lk = k.shape[-2]
        for j0, j1 in self._blocks(q.shape[-2], Lk, call):
            kb, vb = k[..., j0:j1, :], v[..., j0:j1, :]
            p = tile_scores(q, kb, call, j0, Lk)  # (..., Lq, b)
            p -= shift
            np.exp(p, out=p)
            p /= total  # the forward's weights for this tile, rounded as the naive softmax does
            dv_full[..., j0:j1, :] = np.swapaxes(p, -1, -2) @ go  # (..., Hq, b, Ev)
            ds = go @ np.swapaxes(_expand(vb, Hq) if call.enable_gqa else vb, -1, -2)  # (..., Lq, b)
            ds -= d
            ds *= p  # dS of this tile
            if dbias is not None:
                dbias[..., j0:j1] = ds
            if call.softcap is not None:
                raw = tile_scores(q, kb, _raw_call(call), j0, Lk)  # (..., Lq, b) scaled, uncapped, unmasked
                t = np.tanh(raw / q.dtype.type(call.softcap))
                ds *= 1 - t * t
            ke = _expand(kb, Hq) if call.enable_gqa else kb
            dq += (ds @ ke) * sc  # (..., Lq, E)
            dk_full[..., j0:j1, :] = (np.swapaxes(ds, -1, -2) @ q) * sc  # (..., Hq, b, E)
            del p, ds  # one tile of each alive at a time
        dk = _group_sum(dk_full, k.shape[-3]) if call.enable_gqa else dk_full
        dv = _group_sum(dv_full, v.shape[-3]) if call.enable_gqa else dv_full
        grads = [_reduce(dq, q.shape), _reduce(dk, k.shape), _reduce(dv, v.shape)]
        if dbias is not None:
            grads.append(_reduce(dbias, call.bias.shape))
        grads = [g.astype(dtype, copy=False) for g in grads]
        if call.sinks is not None:
            grads.append(_dsink(call, np.exp(_sink(call, q.dtype) - shift) / total, go, out))
        return tuple(grads)


def _raw_call(call):
    """The same call with only the scale: tile_scores then gives scale * q k^T."""
    from attnspec.backends.base import Call
    return Call(scale=call.scale, enable_gqa=call.enable_gqa, dtype=call.dtype)
