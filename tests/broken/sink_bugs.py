"""Attention sinks (issue 31): split-KV kernels with a sink, correct two ways and planted six.

`SinkKernel` is a FlashAttention-style kernel: the keys cut in two splits (flash-decoding), each an
online softmax over blocks of 4 keys computed in float32 for 16-bit inputs, P rounded to the input
dtype before P V, the splits merged through their (max, sum); the sink folded once, after the merge
(FlashInfer's order).  `SinkInitMax` runs one pass whose running maximum starts at the sink and
adds exp(sink - m) to the sum at the end (gpt-oss's Triton kernel) and returns the LSE over the
real keys, as that kernel does - declared (lse_with_sinks=False).  The planted ones each change one
line of the first: the sink ignored (vllm-project/vllm#52148), added in every split
(ROCm/rocm-libraries#12227: counted twice), multiplied by the softmax scale, softcapped, read by
KV head instead of query head, given a value (the row's first value vector), and an LSE without
the sink where the sink is declared included.
"""
from __future__ import annotations

import numpy as np

from attnspec.backends.base import Capabilities, Semantics

from ._kernels import NumpyBackend, in_dtype, round_bfloat16, store, visible

_FEATURES = frozenset({"gqa", "softcap", "sinks", "lse"})
_BLOCK = 4  # keys per online-softmax step


def _caps(*dtypes: str) -> Capabilities:
    return Capabilities(dtypes=dtypes, device="cpu", gradients=True, features=_FEATURES)


def _wide(x):
    """16-bit storage computed in float32 (bfloat16 arrives in float32 already)."""
    return x.astype(np.float32) if x.dtype == np.float16 else x


class SinkKernel(NumpyBackend):
    """Split-KV online softmax with the sink folded once after the merge (correct)."""

    name = "ok-sink-fold-after"
    capabilities = _caps("float32", "float16")
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", lse_with_sinks=True)
    bug = None

    # ---- the pieces a bug changes ------------------------------------------------------------
    def _sinks(self, call, dtype, Hq: int, group: int, scale, softcap):
        """(Hq, 1, 1) the sink logit of each query head (or None)."""
        if call.sinks is None:
            return None
        s = np.asarray(call.sinks).astype(dtype)  # (Hq,)
        if self.bug == "ignored":
            return None
        if self.bug == "kv_head":  # query head h reads sinks[h // group], its KV head's index
            s = s[np.arange(Hq) // group]
        if self.bug == "scaled":
            s = s * scale
        if self.bug == "capped" and softcap is not None:
            s = dtype.type(softcap) * np.tanh(s / dtype.type(softcap))
        return s[:, None, None]

    def _split(self, s, v, dt, p_dtype, m0=None):
        """(m, l, acc) of one split: an online softmax over its key blocks (the running max from m0)."""
        m = np.full(s.shape[:-1] + (1,), -np.inf, dtype=dt) if m0 is None else \
            np.broadcast_to(m0, s.shape[:-1] + (1,)).astype(dt)  # (..., Lq, 1)
        l_sum = np.zeros_like(m)  # (..., Lq, 1)
        acc = np.zeros(s.shape[:-1] + v.shape[-1:], dtype=dt)  # (..., Lq, Ev)
        with np.errstate(invalid="ignore"):
            for j in range(0, s.shape[-1], _BLOCK):
                b = s[..., j:j + _BLOCK]  # (..., Lq, b)
                m_new = np.maximum(m, b.max(axis=-1, keepdims=True, initial=-np.inf))  # (..., Lq, 1)
                shift = np.where(np.isfinite(m_new), m_new, dt.type(0))
                p = np.exp(b - shift)  # (..., Lq, b)
                alpha = np.exp(m - shift)  # (..., Lq, 1)
                l_sum = l_sum * alpha + p.sum(axis=-1, keepdims=True)
                acc = acc * alpha + in_dtype(p, p_dtype) @ v[..., j:j + _BLOCK, :]  # P rounded before P V
                m = m_new
        return m, l_sum, acc

    @staticmethod
    def _fold(m, l_sum, acc, sink, value=None):
        """The sink as one more key of value 0 (or `value`, a planted bug) folded into (m, l, acc)."""
        m_new = np.maximum(m, sink)  # (..., Lq, 1)
        shift = np.where(np.isfinite(m_new), m_new, 0)
        with np.errstate(invalid="ignore"):
            alpha = np.where(np.isfinite(m), np.exp(m - shift), 0)  # (..., Lq, 1)
            e = np.where(np.isfinite(sink), np.exp(sink - shift), 0)  # (..., Lq, 1)
        acc = acc * alpha + (0 if value is None else e * value)
        return m_new, l_sum * alpha + e, acc

    def _state(self, q, k, v, call):
        """(scores (..., Lq, Lk), m, l, acc, sink (Hq, 1, 1) or None, values as read)."""
        q, k, v = (_wide(x) for x in (q, k, v))
        dt = q.dtype
        Hq, group = q.shape[-3], q.shape[-3] // k.shape[-3] if call.enable_gqa else 1
        if group > 1:
            k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)  # (..., Hq, Lk, D)
        scale = dt.type(1.0 / np.sqrt(q.shape[-1]) if call.scale is None else call.scale)
        s = (q @ np.swapaxes(k, -1, -2)) * scale  # (..., Lq, Lk)
        if call.softcap is not None:
            s = dt.type(call.softcap) * np.tanh(s / dt.type(call.softcap))
        s = np.where(visible(q.shape[-2], k.shape[-2], call.mask, call.is_causal), s, dt.type(-np.inf))
        sink = self._sinks(call, dt, Hq, group, scale, call.softcap)
        m, l_sum, acc, l_lse = self._run(s, v, dt, sink, call.dtype)
        l_lse = l_sum if l_lse is None else l_lse
        return s, m, l_sum, acc, l_lse, sink, v

    def _run(self, s, v, dt, sink, p_dtype):
        half = max(1, s.shape[-1] // 2)  # two splits (flash-decoding), merged through (m, l)
        parts = [self._split(s[..., a:b], v[..., a:b, :], dt, p_dtype) for a, b in ((0, half), (half, s.shape[-1]))]
        if sink is not None and self.bug == "per_split":  # each split's state counts the sink
            parts = [self._fold(*part, sink) for part in parts]
        (m1, l1, a1), (m2, l2, a2) = parts
        m = np.maximum(m1, m2)
        shift = np.where(np.isfinite(m), m, 0)
        with np.errstate(invalid="ignore"):
            c1, c2 = (np.where(np.isfinite(x), np.exp(x - shift), 0) for x in (m1, m2))
        m, l_sum, acc = m, l1 * c1 + l2 * c2, a1 * c1 + a2 * c2
        l_lse = l_sum
        if sink is not None and self.bug != "per_split":
            value = v[..., :1, :] if self.bug == "numerator" else None  # (..., 1, Ev): the sink given v_0
            m_keys = m
            m, l_sum, acc = self._fold(m, l_sum, acc, sink, value)
            # the LSE as declared (with the sink); the planted slip keeps the real keys' sum
            l_lse = self._fold(m_keys, l_lse, 0, sink)[1] - self._fold(m_keys, 0, 0, sink)[1] \
                if self.bug == "lse_excluded" else l_sum
        return m, l_sum, acc, l_lse

    @staticmethod
    def _lse(m, l_lse):
        """(..., Lq) m + log of the row sum the LSE is declared over."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(l_lse[..., 0] > 0, np.where(np.isfinite(m), m, 0)[..., 0] + np.log(l_lse[..., 0]), -np.inf)

    # ---- the hooks -------------------------------------------------------------------------------
    def native_attention(self, q, k, v, call):
        _, m, l_sum, acc, l_lse, _, _ = self._state(q, k, v, call)
        out = store(acc / np.where(l_sum == 0, 1, l_sum), call.dtype)  # (..., Lq, Ev)
        if not call.return_lse:
            return out
        return out, self._lse(m, l_lse).astype(np.float64)

    def native_attention_backward(self, q, k, v, grad_out, call):
        s, m, l_sum, acc, _, sink, ve = self._state(q, k, v, call)
        dt = s.dtype
        total = np.where(l_sum == 0, 1, l_sum)  # (..., Lq, 1)
        shift = np.where(np.isfinite(m), m, 0)
        w = np.exp(s - shift) / total  # (..., Lq, Lk) the sink's share left out: rows sum to 1 - p_sink
        out = acc / total  # (..., Lq, Ev)
        go = _wide(grad_out)
        d = (go * out).sum(axis=-1, keepdims=True)  # (..., Lq, 1) D = dO . O
        dv = np.swapaxes(w, -1, -2) @ go  # (..., Hq, Lk, Ev)
        ds = w * (go @ np.swapaxes(ve, -1, -2) - d)  # (..., Lq, Lk)
        if call.softcap is not None:  # through cap tanh(raw / cap): 1 - (s / cap)^2 on visible pairs
            t = np.where(np.isfinite(s), s, 0) / dt.type(call.softcap)
            ds = ds * (1 - t * t)
        qw, kw = _wide(q), _wide(k)
        Hq, Hkv = qw.shape[-3], kw.shape[-3]
        scale = dt.type(1.0 / np.sqrt(qw.shape[-1]) if call.scale is None else call.scale)
        ke = np.repeat(kw, Hq // Hkv, axis=-3) if Hq != Hkv else kw
        dq, dk = (ds @ ke) * scale, (np.swapaxes(ds, -1, -2) @ qw) * scale  # (..., Lq, E), (..., Hq, Lk, E)
        if Hq != Hkv:  # sum each group of query heads
            dk = dk.reshape(dk.shape[:-3] + (Hkv, Hq // Hkv) + dk.shape[-2:]).sum(axis=-3)
            dv = dv.reshape(dv.shape[:-3] + (Hkv, Hq // Hkv) + dv.shape[-2:]).sum(axis=-3)
        grads = tuple(store(g, call.dtype) for g in (dq, dk, dv))
        if call.sinks is None:
            return grads
        with np.errstate(invalid="ignore"):
            p_sink = np.zeros_like(d) if sink is None else np.where(np.isfinite(sink), np.exp(sink - shift), 0) / total
        dsink = -(p_sink * d)[..., 0]  # (..., Hq, Lq)
        return grads + (dsink.reshape(-1, *dsink.shape[-2:]).sum(axis=(0, 2)),)  # (Hq,) in the sinks' dtype


class SinkInitMax(SinkKernel):
    """One pass, the running maximum initialised with the sink, exp(sink - m) added to the sum at the
    end, the LSE over the real keys (gpt-oss's Triton kernel; declared)."""

    name = "ok-sink-init-max"
    capabilities = _caps("bfloat16", "float64")
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", lse_with_sinks=False)

    def _run(self, s, v, dt, sink, p_dtype):
        if sink is None:
            return self._split(s, v, dt, p_dtype) + (None,)
        m, l_keys, acc = self._split(s, v, dt, p_dtype, m0=sink)  # m_0 = sink: no row starts at -inf
        shift = np.where(np.isfinite(m), m, 0)
        with np.errstate(invalid="ignore"):
            z = l_keys + np.where(np.isfinite(sink), np.exp(sink - shift), 0)  # (..., Lq, 1) z = l + exp(sink - m)
        l_lse = l_keys  # M = m + log(l): over the real keys
        return m, z, acc, (z if self.semantics.lse_with_sinks else l_lse)


def _planted(bug: str, label: str, doc: str, dtypes=("float64",)):
    cls = type(label, (SinkKernel,), {"name": f"broken-sink-{bug.replace('_', '-')}", "bug": bug, "__doc__": doc,
                                      "capabilities": _caps(*dtypes)})
    cls.__module__ = __name__
    return cls


SinkIgnored = _planted("ignored", "SinkIgnored", "Accepts sinks and drops them (vllm-project/vllm#52148).")
SinkPerSplit = _planted("per_split", "SinkPerSplit", "Each split counts the sink: twice after the merge "
                        "(ROCm/rocm-libraries#12227).", ("float32",))
SinkScaled = _planted("scaled", "SinkScaled", "The sink multiplied by the softmax scale, like a score.")
SinkCapped = _planted("capped", "SinkCapped", "The sink softcapped, like a score.", ("bfloat16",))
SinkByKvHead = _planted("kv_head", "SinkByKvHead", "Query head h reads the sink of index h // group (its KV head).")
SinkWithValue = _planted("numerator", "SinkWithValue", "The sink attends to a value: the row's first value vector.",
                         ("float16",))
SinkLseExcluded = _planted("lse_excluded", "SinkLseExcluded", "Returns the LSE over the real keys while declaring "
                           "it includes the sink (FA4's convention declared, gpt-oss Triton's returned).")

__all__ = ["SinkByKvHead", "SinkCapped", "SinkIgnored", "SinkInitMax", "SinkKernel", "SinkLseExcluded", "SinkPerSplit",
           "SinkScaled", "SinkWithValue", "round_bfloat16"]
