"""The seeds' "errores comunes", each as a kernel that makes exactly that mistake."""
from __future__ import annotations

import numpy as np

from ._kernels import NumpyBackend, masked_softmax, numpy_caps, resolve_scale, scores, visible


class ScaleByD(NumpyBackend):
    """Seed 004, "Escalar por d en vez de por √d": default scale 1/E instead of 1/sqrt(E).

    An explicit scale is honoured, so only the default path is wrong (and only for E > 1).
    """

    name = "broken-scale-by-d"
    capabilities = numpy_caps("float16", "float64")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        sc = q.dtype.type(1.0 / q.shape[-1] if scale is None else scale)
        s = scores(q, k, sc)  # (..., Lq, Lk)
        return masked_softmax(s, visible(q.shape[-2], k.shape[-2], mask, is_causal)) @ v  # (..., Lq, Ev)


class NoScale(NumpyBackend):
    """Seed 004, "Omitir el factor 1/√d": raw q·k logits, the scale argument ignored too."""

    name = "broken-no-scale"
    capabilities = numpy_caps("bfloat16")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        s = q @ np.swapaxes(k, -1, -2)  # (..., Lq, Lk)
        return masked_softmax(s, visible(q.shape[-2], k.shape[-2], mask, is_causal)) @ v  # (..., Lq, Ev)


class MaskAfterSoftmax(NumpyBackend):
    """Seed 000, "poner los pesos a cero después del softmax": softmax over all keys, then the
    masked weights are zeroed without renormalising, so masked rows no longer sum to 1."""

    name = "broken-mask-after-softmax"
    capabilities = numpy_caps("float16", "float64")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        s = scores(q, k, resolve_scale(q, scale))  # (..., Lq, Lk)
        everything = np.ones(s.shape[-2:], dtype=bool)  # (Lq, Lk)
        w = masked_softmax(s, everything)  # (..., Lq, Lk) softmax over every key
        w = w * visible(q.shape[-2], k.shape[-2], mask, is_causal)  # (..., Lq, Lk) zeroed, not renormalised
        return w @ v  # (..., Lq, Ev)


class SumNormalised(NumpyBackend):
    """Normalising the scores by their sum instead of a softmax: w = s / sum(s).

    Weights go negative as soon as a score does, and the order of scores is lost."""

    name = "broken-sum-normalised"
    capabilities = numpy_caps("bfloat16")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        s = scores(q, k, resolve_scale(q, scale))  # (..., Lq, Lk)
        s = np.where(visible(q.shape[-2], k.shape[-2], mask, is_causal), s, 0)  # (..., Lq, Lk)
        total = s.sum(axis=-1, keepdims=True)  # (..., Lq, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (s / total) @ v  # (..., Lq, Ev)


class NoMaxSubtraction(NumpyBackend):
    """Seed 004, "resta el máximo de la fila (por estabilidad)" skipped: exp(s) overflows to inf
    for logits above ~709 (float64) or ~88 (float32), and inf/inf is NaN."""

    name = "broken-no-max-subtraction"
    capabilities = numpy_caps("float32")

    def native_forward(self, q, k, v, mask, is_causal, scale):
        s = scores(q, k, resolve_scale(q, scale))  # (..., Lq, Lk)
        vis = visible(q.shape[-2], k.shape[-2], mask, is_causal)  # (..., Lq, Lk)
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.where(vis, np.exp(s), 0)  # (..., Lq, Lk) overflows here
            total = e.sum(axis=-1, keepdims=True)  # (..., Lq, 1)
            return (e / np.where(total == 0, 1, total)) @ v  # (..., Lq, Ev)
