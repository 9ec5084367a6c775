"""Slips in the variants kernels ship (issues 9 and 11): grouped heads, bias, alignment, LSE,
windows, padded and packed sequences, softcap, ALiBi.

Each class is `VariantKernel` (tests/broken/_variants.py, correct) with one `slip`, declaring the
features its authors would claim; the dtypes each runs in are chosen in tests/broken/__init__.py.
"""
from __future__ import annotations

from attnspec.backends.base import Capabilities, Semantics

from ._kernels import ALL_DTYPES
from ._variants import VariantKernel


def claims(*features: str, dtypes: tuple, gradients: bool = False) -> Capabilities:
    """What the kernel declares.  The dtypes: each costs a full pass of the suite, so each bug runs in
    one or two and each family (tests/broken/__init__.py) in all four together."""
    return Capabilities(dtypes=dtypes, device="cpu", gradients=gradients, features=frozenset(features))


# ---- issue 9: what PyTorch's SDPA signature expresses, plus the LSE ----------------------------

class KvHeadModulo(VariantKernel):
    """Query head h reads KV head h % Hkv (the interleaved layout) instead of h // (Hq / Hkv)
    (PyTorch's repeat_interleave): right for MQA and for Hq = Hkv only.  The class of
    Dao-AILab/flash-attention#2528 (pack_gqa indexing) and pytorch/pytorch#177842."""

    name = "broken-kv-head-modulo"
    slip = "kv_head_modulo"
    capabilities = claims("gqa", dtypes=("float16", "float64"))


class KvHeadZero(VariantKernel):
    """Every query head reads KV head 0: the head offset of K/V forgotten (MQA hard-wired)."""

    name = "broken-kv-head-zero"
    slip = "kv_head_zero"
    capabilities = claims("gqa", dtypes=("bfloat16",))


class DkFirstOfGroup(VariantKernel):
    """The backward writes dK of each KV head from the first query head of its group instead of
    summing the group (a store where an atomic add was needed); dV is summed.  "Wrong dK/dV with
    GQA" (issue 9; marin-community/levanter#449)."""

    name = "broken-dk-first-of-group"
    slip = "dk_first_of_group"
    capabilities = claims("gqa", gradients=True, dtypes=("float32",))


class BiasScaled(VariantKernel):
    """The float mask added before the scale: softmax(scale * (q k^T + bias)), so the bias is
    scaled too (tenstorrent/tt-metal#42891, "mask multiplied by the scale")."""

    name = "broken-bias-scaled"
    slip = "bias_scaled"
    capabilities = claims("bias", dtypes=("float16", "float32"))


class FloatMaskAsBool(VariantKernel):
    """A float (additive) mask read as a boolean one (``attn_mask.bool()``): nonzero entries take
    part, zeros are hidden, and nothing is added - a 0/-inf mask comes out inverted."""

    name = "broken-float-mask-as-bool"
    slip = "float_mask_as_bool"
    capabilities = claims("bias", dtypes=("bfloat16", "float64"))


class CausalBottomRightAsTopLeft(VariantKernel):
    """Declares bottom-right causal (``causal_lower_right``) but always builds the top-left
    triangle: pytorch/pytorch#108108, Dao-AILab/flash-attention#282, onnx/onnx#8068."""

    name = "broken-bottom-right-as-top-left"
    slip = "causal_ignores_alignment"
    capabilities = claims("causal_bottom_right", dtypes=("float16", "bfloat16"))


class LseUnscaled(VariantKernel):
    """The output is right, but the returned log-sum-exp adds back the running row maximum of the
    *unscaled* scores (m / scale instead of m): HKUSTDial/flash-sparse-attention#106 (LSE scaled
    twice) from the other side.  Split-KV merges through these LSEs then go wrong."""

    name = "broken-lse-unscaled"
    slip = "lse_unscaled"
    capabilities = claims("lse", dtypes=ALL_DTYPES)


class LseBase2DeclaredE(VariantKernel):
    """Returns log2-sum-exp2 (FlashInfer's convention, flashinfer#2113) while declaring the natural log:
    a caller merging it with natural LSEs (FA3's) weighs the states wrongly."""

    name = "broken-lse-base2-declared-e"
    slip = "lse_base2"
    capabilities = claims("lse", dtypes=("float32",))
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros", lse_base="e")


class EmptyLsePlusInfDeclaredMinusInf(VariantKernel):
    """An empty row's LSE +inf (FA2's softmax.h) while declaring -inf (FA3's): a merge reading the
    declared convention takes the empty state for an infinitely heavy one."""

    name = "broken-empty-lse-plus-inf"
    slip = "empty_lse_plus_inf"
    capabilities = claims("lse", dtypes=("float16",))
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros", empty_lse="-inf")


# ---- issue 11: windows, padded and packed sequences, softcap, ALiBi -----------------------------

class WindowLeftExclusive(VariantKernel):
    """The left window edge exclusive (j > i - left): one key too few, vllm-project/vllm#3385 and
    huggingface/transformers#29623 (window sizes counted with or without the current key)."""

    name = "broken-window-left-exclusive"
    slip = "window_left_exclusive"
    capabilities = claims("window", dtypes=("float16", "float64"))


class WindowRightOneMore(VariantKernel):
    """The right window edge one too far (j <= i + right + 1): each query sees a key it must not."""

    name = "broken-window-right-one-more"
    slip = "window_right_one_more"
    capabilities = claims("window", dtypes=("bfloat16",))


class WindowTopLeft(VariantKernel):
    """The causal triangle follows the asked alignment but the window is always top-left: a
    bottom-right window (flash-attention's ``window_size``) lands Lk - Lq keys too early."""

    name = "broken-window-top-left"
    slip = "window_top_left"
    capabilities = claims("window", "causal_bottom_right", dtypes=("float32",))


class SoftcapAfterMask(VariantKernel):
    """Masked scores set to -inf *before* the softcap, which maps them to -cap: hidden keys get
    weight exp(-cap - max) (Dao-AILab/flash-attention#1025: masking first leaks masked tokens)."""

    name = "broken-softcap-after-mask"
    slip = "softcap_after_mask"
    capabilities = claims("softcap", dtypes=ALL_DTYPES)


class PaddedRowsNaN(VariantKernel):
    """Query rows past q_lengths are never written and the output buffer held NaN, while the
    kernel declares padded rows as zeros (Dao-AILab/flash-attention#1228)."""

    name = "broken-padded-rows-nan"
    slip = "padded_rows_nan"
    capabilities = claims("seq_lengths", dtypes=("float16", "float32"))


class LengthsOfFirstSequence(VariantKernel):
    """The lengths of the batch's first sequence used for every sequence (``kv_lengths[0]`` read
    once outside the batch loop): right whenever the batch's sequences are equally long."""

    name = "broken-lengths-of-first-sequence"
    slip = "lengths_of_first_sequence"
    capabilities = claims("seq_lengths", dtypes=("bfloat16", "float64"))


class SegmentsOfFirstSequence(VariantKernel):
    """The segment ids of the batch's first sequence used for every sequence (one ``cu_seqlens``
    for the whole batch): right whenever the sequences are packed alike."""

    name = "broken-segments-of-first-sequence"
    slip = "segments_of_first_sequence"
    capabilities = claims("segment_ids", dtypes=("float16", "float32"))


class SegmentEndInclusive(VariantKernel):
    """Packed sequences: each query's keys taken as [start, end] instead of [start, end), so it
    also sees the first key of the next segment (a cu_seqlens bound off by one)."""

    name = "broken-segment-end-inclusive"
    slip = "segment_end_inclusive"
    capabilities = claims("segment_ids", dtypes=("bfloat16", "float64"))


class AlibiPow2Slopes(VariantKernel):
    """The ALiBi slopes recomputed as 2^(-8 h / H) for every head count: right for powers of two,
    wrong for 3 or 6 heads (ml-explore/mlx#343, #3071).  Declares grouped heads too, so drawn
    problems reach 6 query heads."""

    name = "broken-alibi-pow2-slopes"
    slip = "alibi_pow2_slopes"
    capabilities = claims("alibi", "gqa", dtypes=ALL_DTYPES)
