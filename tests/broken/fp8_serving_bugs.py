"""fp8 inputs in serving calls (issues 30 and 31): FA3's varlen and kvcache functions with descales.

FA3's ``flash_attn_varlen_func`` and ``flash_attn_with_kvcache`` take fp8 q, k, v with ``q_descale``,
``k_descale``, ``v_descale`` of shape (B, Hkv): row b is sequence b's, though a packed call has no
batch axis of its own to index them by.  These are flash_twins' varlen and kvcache over fp8 values
(held exactly in float32, computed in float64, P never rounded: declared), plugged in through
`FlashFunctionBackend` as a user's FA3 would be.  Correct three times (the third an fp8 KV cache as vLLM
and FlashInfer keep one: a bfloat16 query, one ``k_scale`` and ``v_scale`` a tensor); planted four:

- every sequence reads the first sequence's descales (sgl-project/sglang#37785's batch axis off, in a
  packed call, where no tensor carries the batch axis);
- the descales accepted and dropped by the packed call (FlashInfer's ragged prefill wrapper "does not
  apply k_scale/v_scale"; its paged one does);
- a paged call's sequence reading the descales of the row its first page id names (a page-indexed
  scale table where a sequence-indexed one is passed);
- the bfloat16-query fp8 KV cache's paged call dropping k_scale and v_scale (vllm-project/vllm#51363).

And two slips of numpy-tiled's format paths whose padded call stays right, so only the packed and
paged families can see them: the packed path dropping the descales, the paged path giving every
sequence the first one's.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import ml_dtypes
import numpy as np

from attnspec.backends.flash_functions import FlashFunctionBackend
from attnspec.backends.numpy_backends import NumpyTiled

from . import flash_twins
from ._kernels import round_bfloat16

_FP8 = ("float8_e4m3fn", "float8_e5m2")


class _Fp8Twin(FlashFunctionBackend):
    """flash_twins.varlen / kvcache (with `slip`) on fp8 inputs: float32 holding the fp8 values, float32 out."""

    form_fn = staticmethod(flash_twins.varlen)
    slip = ""
    dtypes = ("float8_e4m3fn",)

    def __init__(self):
        super().__init__(functools.update_wrapper(functools.partial(self.form_fn, slip=self.slip), self.form_fn),
                         self.name)
        self.capabilities = replace(self.capabilities, dtypes=self.dtypes)
        self.semantics = replace(self.semantics, output_dtypes=tuple((d, "float32") for d in _FP8),
                                 p_dtypes=tuple((d, "float32") for d in _FP8))

    def to_native(self, x, dtype):
        """fp8 values held in float32, cast through ml_dtypes' format as a real fp8 tensor would be; a bfloat16
        query in float32 storage."""
        if dtype == "bfloat16":
            return round_bfloat16(x)
        if dtype in _FP8:
            return x.astype(getattr(ml_dtypes, dtype)).astype(np.float32)
        return x if dtype is None else x.astype(dtype)

    def from_native(self, y):
        return np.asarray(y)


class Fp8Varlen(_Fp8Twin):
    """FA3's fp8 varlen call (correct): each sequence's q and k times its row of the descales, its output
    times v's."""

    name = "ok-fp8-varlen"


class Fp8KvCache(_Fp8Twin):
    """FA3's fp8 kvcache call over a paged cache (correct): each sequence its own row of the descales."""

    name = "ok-fp8-kvcache"
    form_fn = staticmethod(flash_twins.kvcache)
    dtypes = ("float8_e5m2",)  # one full suite pass each: the two correct twins cover both formats


class Fp8KvCacheBf16Query(_Fp8Twin):
    """An fp8 KV cache as vLLM and FlashInfer keep one (correct): a bfloat16 query, K and V fp8 in pages, one
    k_scale and v_scale a tensor."""

    name = "ok-fp8-kvcache-bf16-query"
    form_fn = staticmethod(flash_twins.kvcache_scaled)

    def __init__(self):
        super().__init__()
        self.capabilities = replace(self.capabilities, fp8_query="bfloat16", descale_granularity="tensor")


class VarlenDescaleFirstSequence(_Fp8Twin):
    """Every packed sequence reads the first sequence's descales (sgl-project/sglang#37785: the descales'
    batch axis off; a packed call's tokens carry no batch index to read them by)."""

    name = "broken-varlen-descale-first-sequence"
    slip = "descale_first_sequence"


class VarlenDescalesDropped(_Fp8Twin):
    """The packed call accepts q_descale, k_descale, v_descale and drops them (FlashInfer's ragged prefill
    wrapper "does not apply k_scale/v_scale"; its paged path does)."""

    name = "broken-varlen-descales-dropped"
    slip = "descales_dropped"
    dtypes = ("float8_e5m2",)


class KvCacheDescaleByPage(_Fp8Twin):
    """A paged call's sequence b reads the descales' row that its first page id names (modulo B): right
    wherever the page ids happen to start at the sequence's own index."""

    name = "broken-kvcache-descale-by-page"
    form_fn = staticmethod(flash_twins.kvcache)
    slip = "descale_by_page"


class PackedPathDropsDescales(NumpyTiled):
    """numpy-tiled whose packed path drops the descales; its padded and paged calls apply them (FlashInfer's
    ragged wrapper beside its paged one)."""

    name = "broken-packed-path-drops-descales"
    capabilities = replace(NumpyTiled.capabilities, dtypes=("float8_e4m3fn",))

    def native_packed(self, q, k, v, args, call):
        return super().native_packed(q, k, v, args, replace(call, q_descale=None, k_descale=None, v_descale=None))


class PagedPathFirstSequenceDescales(NumpyTiled):
    """numpy-tiled whose paged path gives every sequence the first sequence's descales (a decode kernel's
    scale pointer never advanced by its batch index); its padded and packed calls are right."""

    name = "broken-paged-path-first-sequence-descales"
    capabilities = replace(NumpyTiled.capabilities, dtypes=("float8_e5m2",))

    def native_paged(self, q, k_cache, v_cache, args, call):
        first = {n: d if np.ndim(d) != 2 else d[:1] for n in ("q_descale", "k_descale", "v_descale")
                 if (d := getattr(call, n)) is not None}  # (1, Hkv) row 0: broadcast to every sequence
        return super().native_paged(q, k_cache, v_cache, args, replace(call, **first))


class KvCacheBf16QueryScalesDropped(Fp8KvCacheBf16Query):
    """The bfloat16-query fp8 KV cache's paged call takes k_scale and v_scale and drops them (vllm-project/vllm#51363's
    garbage from unapplied scales)."""

    name = "broken-kvcache-bf16-query-scales-dropped"
    slip = "descales_dropped"
    dtypes = ("float8_e5m2",)
