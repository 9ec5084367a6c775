"""Backward-pass slips: the forward is right, the gradients are not."""
from __future__ import annotations

import numpy as np

from ._kernels import NumpyBackend, attention_weights, numpy_caps, resolve_scale, softmax_backward, sum_to


class _RightForward(NumpyBackend):

    def native_forward(self, q, k, v, mask, is_causal, scale):
        return attention_weights(q, k, mask, is_causal, scale) @ v  # (..., Lq, Ev)


class DqMissingScale(_RightForward):
    """dQ = dS·K without the factor `scale` (dK keeps it): the chain rule through
    S = scale·Q·Kᵀ applied on one side only.  The seeds' scaling law (the factor survives the
    backward) and dQ against the reference both break."""

    name = "broken-dq-missing-scale"
    capabilities = numpy_caps("float16", "float64", gradients=True)

    def native_backward(self, q, k, v, grad_out, mask, is_causal, scale):
        sc = resolve_scale(q, scale)
        a = attention_weights(q, k, mask, is_causal, scale)  # (..., Lq, Lk)
        ds, dv = softmax_backward(a, v, grad_out)  # (..., Lq, Lk), (..., Lk, Ev)
        dq = ds @ k  # (..., Lq, E) the missing "* sc"
        dk = (np.swapaxes(ds, -1, -2) @ q) * sc  # (..., Lk, E)
        return sum_to(dq, q.shape), sum_to(dk, k.shape), sum_to(dv, v.shape)


class BackwardRecomputeDropsMask(_RightForward):
    """The backward recomputes P from Q and K (as flash kernels do, to save memory) but the
    recompute forgets the mask and the causal flag: masked keys receive gradient, and dQ/dV are
    wrong on every masked problem."""

    name = "broken-backward-recompute-drops-mask"
    capabilities = numpy_caps("bfloat16", "float32", gradients=True)

    def native_backward(self, q, k, v, grad_out, mask, is_causal, scale):
        sc = resolve_scale(q, scale)
        a = attention_weights(q, k, None, False, scale)  # (..., Lq, Lk) unmasked recompute
        ds, dv = softmax_backward(a, v, grad_out)  # (..., Lq, Lk), (..., Lk, Ev)
        dq = (ds @ k) * sc  # (..., Lq, E)
        dk = (np.swapaxes(ds, -1, -2) @ q) * sc  # (..., Lk, E)
        return sum_to(dq, q.shape), sum_to(dk, k.shape), sum_to(dv, v.shape)
