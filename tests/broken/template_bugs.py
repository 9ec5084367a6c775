"""Slips in one instantiation of a kernel template: a head-dim pair, a backward's dispatch by head dim,
a backward's causal loop bounds, a 16-bit accumulator.  Each is right at every shape the draws reach
(head dims to 64 with Ev = E, lengths near 129, values of both signs), wrong at the shapes real models
run; the suite reaches each by construction (properties/test_edges.py's unequal head dims and long row
of one sign, test_gradients.py's backward grid).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ._kernels import in_dtype, numpy_caps, store, widened
from ._variants import VariantKernel


def _f16_accumulated(a, b, step: int = 16) -> np.ndarray:
    """a @ b (float32) with a float16 accumulator rounded after each `step`-wide MMA over the reduced axis."""
    acc = np.zeros(a.shape[:-1] + b.shape[-1:], np.float32)  # (..., M, N)
    for lo in range(0, a.shape[-1], step):
        acc = in_dtype(acc + a[..., lo:lo + step] @ b[..., lo:lo + step, :], "float16")
    return acc


class MlaVRowPitch(VariantKernel):
    """The (E, Ev) = (192, 128) instantiation (FA3's MLA-prefill template) loads V rows with K's row pitch
    (stride_vn = E, copied from stride_kn): V's row j is read at element j * E of its (Lk, Ev) buffer, zeros
    past its end.  Every other (E, Ev) is right."""

    name = "broken-mla-v-row-pitch"
    capabilities = numpy_caps("float32")

    def native_attention(self, q, k, v, call):
        E, (Lk, Ev) = q.shape[-1], v.shape[-2:]
        if (E, Ev) == (192, 128):
            flat = v.reshape(v.shape[:-2] + (Lk * Ev,))  # (..., Lk * Ev)
            flat = np.concatenate([flat, np.zeros(v.shape[:-2] + (Lk * E,), v.dtype)], axis=-1)
            v = flat[..., np.arange(Lk)[:, None] * E + np.arange(Ev)]  # (..., Lk, Ev) the slip: pitch E
        return super().native_attention(q, k, v, call)


class BackwardHdimDispatch(VariantKernel):
    """A backward dispatch `d <= 64: bwd<64>; d <= 128: bwd<64>` (a copy-paste): head dims 65..128 run the
    64 kernel, which recomputes P from the first 64 components and writes 64 columns of dQ, dK, dV (the
    rest stay zero).  The forward and every other head dim are right."""

    name = "broken-backward-hdim-dispatch"
    capabilities = numpy_caps("bfloat16", gradients=True)

    def native_attention_backward(self, q, k, v, grad_out, call):
        E, Ev = q.shape[-1], v.shape[-1]
        if not 64 < max(E, Ev) <= 128:
            return super().native_attention_backward(q, k, v, grad_out, call)
        call = replace(call, scale=1.0 / np.sqrt(E) if call.scale is None else call.scale)  # the launch's: right
        first = lambda x: x[..., :64]  # noqa: E731  the slip: the 64 kernel's tile
        grads = super().native_attention_backward(first(q), first(k), first(v), first(grad_out), call)[:3]
        return tuple(store(np.concatenate([np.asarray(g, np.float64), np.zeros(g.shape[:-1] + (n - g.shape[-1],))],
                                          axis=-1), call.dtype) for g, n in zip(grads, (E, E, Ev), strict=True))


class BackwardCausalTopLeftBound(VariantKernel):
    """An FA2-style backward (128 x 128 blocks) whose loop for key block n starts at query block
    n * BN / BM, the top-left bound, where bottom-right needs max(0, n * BN + Lq - Lk) / BM: with more
    keys than queries past a key block, rows before that block never reach its dK, dV and dQ."""

    name = "broken-backward-causal-top-left-bound"
    capabilities = numpy_caps("float64", features=("causal_bottom_right",), gradients=True)
    BM = BN = 128

    def _backward_reach(self, call, ds, p):
        if not (call.is_causal and call.causal_alignment == "bottom_right"):
            return ds, p
        Lq, Lk = ds.shape[-2:]
        first_row = np.arange(Lk) // self.BN * self.BN // self.BM * self.BM  # (Lk,) the slip: no + Lq - Lk
        reached = np.arange(Lq)[:, None] >= first_row  # (Lq, Lk)
        return np.where(reached, ds, 0.0), np.where(reached, p, 0.0)


class Float16Accumulator(VariantKernel):
    """A float16 kernel whose two matmuls accumulate in float16 (an fp16-accumulating MMA, PyTorch's
    allow_fp16_accumulation, tl.dot(out_dtype=float16)), rounded after each 16-wide step; softmax
    statistics in float32, P rounded to float16.  Within the budget on values of both signs (the sum
    random-walks); a long row of one sign grows the accumulator past what its ulp can add."""

    name = "broken-float16-accumulator"
    capabilities = numpy_caps("float16")

    def native_attention(self, q, k, v, call):
        q, k, v = self._unpadded(call, *widened(q, k, v))
        scale = np.float32(1.0 / np.sqrt(q.shape[-1]) if call.scale is None else call.scale)
        s = _f16_accumulated(q, np.swapaxes(k, -1, -2)) * scale  # (..., Lq, Lk)
        s = np.where(self._visible(call, s.shape, *s.shape[-2:]), s, -np.inf)
        m = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Lq, 1)
        p = np.exp(s - np.where(np.isfinite(m), m, 0.0))  # (..., Lq, Lk)
        total = p.sum(axis=-1, keepdims=True)  # (..., Lq, 1)
        out = _f16_accumulated(in_dtype(p, "float16"), v) / np.where(total > 0, total, 1.0)  # (..., Lq, Ev) the slip
        return store(out, call.dtype)
