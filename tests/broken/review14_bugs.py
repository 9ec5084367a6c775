"""Slips a fourteenth review mirrored from real reports, where the draws never went: a decode kernel's 16-head
tile taking its KV head from the tile's first head (groups over 16 that are no multiple of it), the wide
head-dim templates dropping the softcap, and the head-dim 256 backward's pre-pass rowsum(dO * O) reading the
first sequence's output for every sequence.  The draws stop at groups of 7, give softcaps at small head dims,
and the backward grid's head-dim 256 rows had one sequence; the suite now reaches each by construction (the
edge grid's decode of 40 query heads on 2 KV heads and its wide softcap rows, the backward grid's head dim 256
over three sequences, the serving edges' grouped decodes and head dim 256).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends.numpy_backends import NumpyNaive, NumpyTiled

_DTYPES = ("float32", "float64")


class DecodeTileCrossesGroup(NumpyNaive):
    """A decode (Lq = 1) kernel packing query heads in 16-head tiles maps a tile to the KV head of its first head
    (FlashML-org/FreeToken#177): under groups over 16 that are no multiple of 16, heads past a tile boundary
    inside a group read the group before's KV head.  Prefill, and groups up to 16, right."""

    name = "broken-decode-tile-crosses-group"
    capabilities = replace(NumpyNaive.capabilities, dtypes=_DTYPES, gradients=False)

    def native_attention(self, q, k, v, call):
        Hq, Hkv, Lq = q.shape[-3], k.shape[-3], q.shape[-2]
        g = Hq // Hkv if call.enable_gqa else 1
        if Lq != 1 or g <= 16 or g % 16 == 0:
            return super().native_attention(q, k, v, call)
        kv_head = [(h // 16 * 16) // g for h in range(Hq)]  # the slip: the tile's first head's KV head
        return super().native_attention(q, k[..., kv_head, :, :], v[..., kv_head, :, :],
                                        replace(call, enable_gqa=False))


class WideSoftcapDropped(NumpyNaive):
    """The wide head-dim templates (E > 128) launched without the softcap for prefill (kekzl/imp#688): the
    decode path and head dims up to 128 cap the scores."""

    name = "broken-wide-softcap-dropped"
    capabilities = replace(NumpyNaive.capabilities, dtypes=_DTYPES, gradients=False)

    def native_attention(self, q, k, v, call):
        if q.shape[-1] > 128 and q.shape[-2] > 1 and call.softcap is not None:
            call = replace(call, softcap=None)  # the slip
        return super().native_attention(q, k, v, call)


class BwdDeltaFirstSequenceHdim256(NumpyTiled):
    """The head-dim 256 backward's pre-pass D = rowsum(dO * O) reads the first sequence's O for every sequence
    (NVIDIA/TransformerEngine#3216: batch >= 2 at head dim 256 only); the forward and narrower heads right."""

    name = "broken-bwd-delta-first-sequence-hdim256"
    capabilities = replace(NumpyTiled.capabilities, dtypes=("float32",))
    _slipping = False  # set during a backward that takes the slip: _forward's O is the pre-pass's input there

    def native_attention_backward(self, q, k, v, grad_out, call):
        self._slipping = q.shape[-1] > 192 and q.ndim == 4 and q.shape[0] >= 2
        try:
            return super().native_attention_backward(q, k, v, grad_out, call)
        finally:
            self._slipping = False

    def _forward(self, q, k, v, call):
        out, *rest = super()._forward(q, k, v, call)
        if self._slipping:
            out = np.broadcast_to(out[:1], out.shape)  # (B, H, Lq, Ev): the slip, sequence 0's O for all
        return (out, *rest)
