"""Deliberately broken and deliberately different-but-correct attention implementations.

The proof of teeth (tests/test_teeth.py) runs the conformance suite on each: every BROKEN entry
must be rejected in every dtype it declares, with a failure in its expected property family;
every CORRECT entry accepted in every dtype it declares.

``catches``: substrings of the property names expected among the failures, most specific first
(any one suffices; the report names the first of them that failed).  ``witness``: a problem from
``tests.broken.witnesses`` on which the bug visibly shows against the reference.  ``family``:
the kind of bug; each family is proven in every dtype (float16, bfloat16, float32, float64) by
one member or another, while each member runs in one or two dtypes (its class declares them):
every declared dtype is a full pass of the suite, and the teeth test must stay affordable in CI.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import witnesses as w

PKG = "tests.broken"


@dataclass(frozen=True)
class Entry:
    target: str            # "module:attr" relative to this package
    catches: tuple = ()    # property-name substrings, one of which must fail (broken only)
    witness: object = None  # a witnesses.* function (broken only)
    origin: str = ""       # seed mistake or upstream issue it models
    family: str = ""       # the kind of bug (broken only): FAMILIES

    @property
    def spec(self) -> str:
        return f"{PKG}.{self.target}"

    @property
    def label(self) -> str:
        return self.target.split(":")[1]


# property names of the suite (properties/test_*.py, without "test_"); any listed one suffices
SCALE = ("default_scale", "explicit_scale_honoured")
# all three compare the output with the reference (at a drawn, the default, an explicit scale):
# a wrong output may be caught by whichever draws the revealing problem first
REF = ("matches_reference",) + SCALE
WEIGHTS = ("rows_sum_to_one", "weights_nonnegative", "order_preserved", "convex_combination")
CAUSAL = ("zero_future_mass", "future_changes_nothing", "causal_alignment")
MASKED = ("masked_keys_get_zero_weight",)
GRADS = ("gradients_match_reference", "gradient_scaling_law")

# the variants' families (properties/test_<family>.py)
GQA = ("grouped_heads_match_repeated_kv",) + REF
BIAS = ("additive_bias_matches_reference", "additive_bias_row_constant_changes_nothing",
           "neg_inf_bias_equals_boolean_mask") + REF
ALIGNMENT = ("causal_alignment_as_asked",) + CAUSAL
LSE = ("lse_matches_reference", "split_merge_identity")
WINDOW = ("zero_weight_outside_window", "window_equals_its_mask") + REF
SEGMENTS = ("other_segment_changes_nothing",) + REF
# a declared choice for padded query rows is contradicted (a semantics question, when the suite has one)
PADDED = ("padded_rows", "nan_in_padding_changes_nothing")
SOFTCAP = ("capped_scores_bounded", "softcap_gradient_matches_reference") + MASKED + CAUSAL + REF
ALIBI = ("alibi_matches_reference", "alibi_equals_explicit_bias") + REF
# issue 30: properties/test_packed.py, test_paged.py
SERVING = ("packed_", "paged_", "page_placement", "per_sequence")
# issue 31: properties/test_sinks.py (every property there names the sink)
SINKS = ("sink",)
# issue 31: properties/test_conventions.py (semantics questions), test_merge.py, test_knobs.py
CONVENTIONS = ("lse_base", "empty_lse", "merge_", "knob_", "deterministic", "batch_invariant")
# issue 31: properties/test_fp8.py (the descales, P's rounding), and every family's agreement at fp8 targets
FP8 = ("descale", "p_rounding") + REF
# fp8 inputs in packed and paged calls: the format families' agreement (issues 30 and 31)
FP8_SERVING = ("packed_", "paged_")

FAMILIES = ("scale", "softmax", "masking", "alignment", "online kernel", "gradients", "grouped heads", "bias",
            "lse", "window", "sequences", "softcap", "alibi", "serving", "sinks", "conventions", "fp8")
FP8_FAMILIES = ("fp8",)  # proven in the fp8 dtypes (FP8_DTYPE_NAMES), the others in the float ones


BROKEN = (
    # the seeds' mistakes and the classic masking and kernel bugs
    Entry("seed_mistakes:ScaleByD", SCALE + REF, w.default_path, "seed 004: scale by d, not sqrt(d)", "scale"),
    Entry("seed_mistakes:NoScale", SCALE + REF, w.default_path, "seed 004: no 1/sqrt(d)", "scale"),
    Entry("tile_bugs:ExplicitScaleHalfParam", ("edge_shapes",) + REF, w.explicit_scale_not_dyadic,
          "an explicit scale kept in a float16 launch parameter", "scale"),
    Entry("kernel_bugs:ExplicitScaleIgnored", ("explicit_scale_honoured",) + REF, w.explicit_scale,
          "scale swallowed, hao-ai-lab/FastVideo#1457, huggingface/transformers#44380", "scale"),
    Entry("seed_mistakes:MaskAfterSoftmax", WEIGHTS + REF + MASKED, w.with_mask,
          "seed 000: weights zeroed after the softmax", "softmax"),
    Entry("seed_mistakes:SumNormalised", WEIGHTS + REF, w.default_path, "normalised by the sum of scores", "softmax"),
    Entry("seed_mistakes:NoMaxSubtraction", REF + WEIGHTS, w.huge_logits, "seed 004: no max subtraction", "softmax"),
    Entry("mask_bugs:CausalDiagonalExcluded", CAUSAL + REF + WEIGHTS, w.causal_square, "causal j < i", "masking"),
    Entry("mask_bugs:CausalOneAhead", CAUSAL, w.causal_square, "causal j <= i + 1", "masking"),
    Entry("mask_bugs:InvertedMask", MASKED + REF, w.with_mask, "mask polarity: True = masked", "masking"),
    Entry("mask_bugs:CausalIgnoredWithoutMask", CAUSAL, w.causal_square, "early return, jax-ml/jax#32300", "masking"),
    Entry("mask_bugs:FiniteMaskFill", ("fully_masked_rows",) + MASKED + CAUSAL, w.fully_masked_row,
          "-1e4 mask fill, hyunwoongko/transformer#10", "masking"),
    Entry("mask_bugs:CausalBottomRightDeclaredTopLeft", ("causal_alignment",) + CAUSAL, w.causal_rectangular,
          "flash-attn 2.1 alignment, Dao-AILab/flash-attention#951", "alignment"),
    Entry("kernel_bugs:OnlineNoRescale", REF + WEIGHTS, w.growing_max, "online softmax: sum not rescaled",
          "online kernel"),
    Entry("kernel_bugs:OnlineMaskedBlockNaN", REF + MASKED + ("fully_masked_rows", "edge_shapes") + WEIGHTS,
          w.first_block_masked, "no -inf guard, pytorch/pytorch#109517", "online kernel"),
    Entry("kernel_bugs:TailBlockZeroPad", ("edge_shapes",) + REF + WEIGHTS, w.short_tail,
          "unmasked Lk % 64 tail, flashinfer-ai/flashinfer#5090, jax-ml/jax#27224", "online kernel"),
    Entry("kernel_bugs:LongSequenceFastPathDropsMask", MASKED + REF + ("edge_shapes",), w.long_masked,
          "Lk > 64 path drops the mask, pytorch/pytorch#107884", "online kernel"),
    Entry("kernel_bugs:LowPrecisionAccumulation", REF + ("edge_shapes",), w.long_float32,
          "fp16 accumulation for fp32, pytorch/executorch#20089", "online kernel"),
    Entry("kernel_bugs:FirstTileBiasNaN", BIAS + MASKED + ("fully_masked_rows", "edge_shapes") + WEIGHTS,
          w.first_tile_bias_hidden, "no -inf guard for a tile a -inf bias hides, issue 29 (a Triton FlashAttention)",
          "online kernel"),
    Entry("tile_bugs:PersistentGridOneWave", ("edge_shapes",) + REF, w.many_work_items,
          "a persistent grid that never strides: items past the first wave unwritten", "online kernel"),
    Entry("tile_bugs:SplitKvMergeFirstRowLse", ("edge_shapes",) + REF, w.few_queries_long_cache,
          "split-KV merge by query row 0's LSE (Lq > 1 against a long cache)", "online kernel"),
    Entry("tile_bugs:HeadDimLoopCapped256", ("edge_shapes",) + REF, w.head_dim_512,
          "head dim 512 taken and truncated to 256, not refused", "online kernel"),
    Entry("kernel_bugs:NaNForFullyMaskedDeclaredZeros", ("fully_masked_rows",), w.fully_masked_row,
          "NaN rows declared zeros, pytorch/pytorch#103963", "online kernel"),
    Entry("gradient_bugs:DqMissingScale", GRADS, w.gradient, "dQ without the scale", "gradients"),
    Entry("gradient_bugs:BackwardRecomputeDropsMask", GRADS, w.gradient_causal,
          "backward recompute ignores the mask", "gradients"),
    # a kernel's own paths the draws seldom reach (tests/broken/path_bugs.py)
    Entry("path_bugs:SplitKvGqaModulo", ("edge_shapes",) + GQA, w.split_kv_grouped,
          "the split-KV decode path's head map h % Hkv (its prefill path right)", "grouped heads"),
    Entry("path_bugs:SplitKvCausalBottomRight", ("edge_shapes",) + ALIGNMENT, w.split_kv_causal_top_left,
          "the split-KV decode path causal bottom-right whatever is asked", "alignment"),
    Entry("path_bugs:SplitKvDropsSoftcap", ("edge_shapes",) + SOFTCAP, w.split_kv_softcap,
          "the split-KV decode path takes no softcap and drops it", "softcap"),
    Entry("path_bugs:SplitKvDropsWindow", ("edge_shapes",) + WINDOW, w.split_kv_window,
          "the split-KV decode path applies causal but not the window", "window"),
    Entry("path_bugs:WindowFirstBlockByLastRow", ("edge_shapes",) + WINDOW, w.window_past_a_block,
          "a window's first key block found from the query tile's last row", "window"),
    Entry("path_bugs:BackwardDeltaGridGap", ("backward_edges",) + GRADS, w.backward_past_128_rows,
          "the backward pre-pass rowsum(dO * O) launched over 256-row steps of a 128-row kernel", "gradients"),
    # what travels beside the output, a ninth review (tests/broken/companion_bugs.py)
    Entry("companion_bugs:LsePermutedLayout", ("layout_independence",) + LSE, w.lse_permuted_layout,
          "handed q stored (B, L, H, E), the LSE written in q's (L, H) order, read as (H, L)", "lse"),
    Entry("companion_bugs:KnobSplitLseOfLargest", ("knob_",) + LSE, w.knob_splits_lse,
          "a num_splits combine returns the largest split's LSE, + log(sum) forgotten", "conventions"),
    Entry("companion_bugs:MergeLseReadDense", ("merge_",), w.merge_transposed,
          "a list merge reads its LSEs as a dense array, vllm-project/vllm#22003", "conventions"),
    # declarations past the first probes' regimes, a tenth review (tests/broken/declaration_bugs.py)
    Entry("declaration_bugs:BatchInvariantSplitSmallGrid", ("batch_invariance",), w.batch_of_four,
          "batch invariance declared, the keys split only while batch x heads < 8", "conventions"),
    Entry("declaration_bugs:BackwardAtomicDqPastOneBlock", ("repeated_backward",), w.repeated_backward_300_keys,
          "deterministic declared, dQ's 128-key block partials added in the order they finish", "conventions"),
    Entry("declaration_bugs:KnobSplitsExactPast1024", ("knob_",), w.knob_splits_1100_keys,
          "knob_exact declared, num_splits acting (other bits) only from 1024 keys", "conventions"),
    Entry("declaration_bugs:BadIndicesQueryUnchecked", ("bad_index",), w.bad_indices,
          "bad indices refused on the key side only: cu_seqlens_q and max_seqlen_q trusted", "serving"),
    Entry("declaration_bugs:DbiasPerHeadKeyBiasLastRow", ("backward_edges", "bias_gradient") + GRADS,
          w.backward_key_bias_per_head, "dBias of a (B, H, 1, Lk) bias: the last query row's dS", "bias"),
    Entry("declaration_bugs:AlibiBackwardTopLeftWithoutCausal", ("backward_edges",) + GRADS,
          w.backward_alibi_bottom_right, "the backward's ALiBi offset applied only under causal", "alibi"),
    Entry("declaration_bugs:DsinkWithoutWindow", ("backward_edges", "dsink"), w.dsink_window,
          "dSink's p_sink from a row pass without the window", "sinks"),
    Entry("declaration_bugs:EmptySizesOutputFloat64", ("empty_sizes",), w.empty_launches,
          "an empty launch's output allocated as float64 (np.zeros)", "conventions"),
    # templates, launchers and a merge past the draws' inputs, an eleventh review (tests/broken/review11_bugs.py)
    Entry("review11_bugs:WindowLeftZeroUnbounded", ("edge_shapes", "backward_edges") + WINDOW, w.window_left_zero,
          "a window's left bound 0 read by truthiness (`if left:`) as unbounded", "window"),
    Entry("review11_bugs:MlaCausalTopLeft", ("edge_shapes", "backward_edges") + ALIGNMENT, w.mla_chunk_bottom_right,
          "MLA's (192, 128) template masks causal top-left whatever is asked", "alignment"),
    Entry("review11_bugs:Hdim256WindowLeftDropped", ("edge_shapes", "backward_edges") + WINDOW, w.hdim256_window,
          "the head-dim 256 template launched without its window's left bound, pegainfer#818", "window"),
    Entry("review11_bugs:AlibiSlopesRecomputed", ALIBI, w.alibi_rank_slopes,
          "ALiBi slopes recomputed from the head count, a tensor-parallel rank's ignored, flashinfer#1606", "alibi"),
    Entry("review11_bugs:WideNonCausalGridHalf", ("edge_shapes",) + REF, w.wide_non_causal_rows,
          "head dim 160/192 non-causal: 64-row tiles on a grid sized for 128-row ones", "online kernel"),
    Entry("review11_bugs:BwdLeftPaddingIgnored", ("backward_edges",) + GRADS, w.backward_left_padding,
          "a backward launcher dropping the left padding (kv_starts), flash-attention#1788's class", "serving"),
    Entry("review11_bugs:BwdHdim128CausalDropped", ("backward_edges",) + GRADS, w.backward_causal_e80,
          "the backward's head-dim 128 template reached with Is_causal=false", "gradients"),
    Entry("review11_bugs:MergeColumnsPast256", ("merge_",), w.merge_wide,
          "a list merge writing 256 value columns (MLA's 512 half unmerged), flashinfer#761", "conventions"),
    Entry("review11_bugs:DecodeGqaLsePow2Stride", ("lse_edges",) + LSE, w.decode_lse_group_of_3,
          "a decode's LSEs stored at a power-of-two group stride (groups of 3 on other heads)", "lse"),
    Entry("review11_bugs:SoftcapBackwardGqaTiled", ("backward_edges", "grouped_heads_gradients", "softcap_gradient")
          + GRADS, w.softcap_backward_grouped,
          "the softcap backward's tanh' with K tiled over heads (h % Hkv) under grouped heads", "softcap"),
    # tables, packs and shortcuts past the draws' sizes and forms, a twelfth review (tests/broken/review12_bugs.py)
    Entry("review12_bugs:SinksHeadTable32", ("edge_shapes",) + SINKS, w.sinks_over_40_heads,
          "sinks in a 32-entry table: head h reads sinks[h % 32] (gpt-oss-120b has 64 heads)", "sinks"),
    Entry("review12_bugs:AlibiHeadTable32", ("edge_shapes",) + ALIBI, w.alibi_over_40_heads,
          "ALiBi slopes in a 32-entry table: head h reads slopes[h % 32] (BLOOM has 112 heads)", "alibi"),
    Entry("review12_bugs:GqaPackOf8", ("edge_shapes",) + GQA, w.groups_of_20,
          "a pack of at most 8 query heads a KV head: groups of 16 (Llama-3.1-405B) misread", "grouped heads"),
    Entry("review12_bugs:DecodeSplitsCapped2048", ("edge_shapes", "lse_edges") + REF, w.decode_past_2048_keys,
          "a split-KV decode's partition buffer sized for 2048 keys: the keys past it never read", "online kernel"),
    Entry("review12_bugs:LargeLaunchDropsSoftcap", ("edge_shapes",) + SOFTCAP, w.softcap_large_launch,
          "the kernel a launch of >= 106 work items picks (FA2's split heuristic) built without the softcap",
          "softcap"),
    Entry("review12_bugs:PackedBoundaryCountedOnce", SERVING, w.packed_repeated_boundary,
          "a token-to-sequence map by a non-accumulating store: a repeated cu_seqlens boundary counted once",
          "serving"),
    Entry("review12_bugs:SinkOnlyRowLseMinusInf", ("lse_edges", "sinks_lse_as_declared") + SINKS + LSE,
          w.sink_only_rows_lse, "a row that sees only its sink exits early with an LSE of -inf, not s_h", "sinks"),
    Entry("review12_bugs:SinkOnlyRowNaN", ("edge_shapes",) + SINKS, w.sink_only_rows,
          "NaN declared for fully masked rows, and written where a row sees only its sink (its output is 0)", "sinks"),
    Entry("review12_bugs:KeyLengthsFromQueryLengths", ("edge_shapes",) + REF, w.query_lengths_alone,
          "with Lq = Lk and q_lengths alone the keys cut to q_lengths too (a self-attention unpadding shortcut)",
          "sequences"),
    Entry("review12_bugs:SegmentsAsKeySpans", ("edge_shapes",) + SEGMENTS, w.segments_interleaved,
          "segment ids read as their keys' first..last span: interleaved ids let the keys between through",
          "sequences"),
    Entry("review12_bugs:BiasBatchOneReadAtHead0", ("edge_shapes",) + BIAS, w.bias_batch_one_per_head,
          "a (1, H, Lq, Lk) bias expanded with the batch's stride 0 on the heads too: every head reads head 0",
          "bias"),
    # fp8 descales in packed and paged calls (tests/broken/fp8_serving_bugs.py): the first axis the sequence
    # format paths a thirteenth review found reached only at deep (tests/broken/review13_bugs.py)
    Entry("review13_bugs:PagedPRoundedE5m2", ("p_rounding_in_format_calls",), w.fp8_p_rounding_paged,
          "a paged decode kernel rounding P to e5m2 for an e4m3 cache, its padded call right", "fp8"),
    Entry("review13_bugs:PackedSinkSoftcapped", ("packed_edges",) + SINKS, w.packed_sinks_softcap,
          "a varlen kernel folding the sinks in as a score column, so the softcap caps them too", "sinks"),
    Entry("review13_bugs:PackedLseGqaHeadsInterleaved", ("packed_edges", "packed_lse"), w.packed_lse_groups,
          "a varlen call's LSE rows KV-major under grouped heads (its output right)", "serving"),
    # real reports a fourteenth review mirrored where the draws never went (tests/broken/review14_bugs.py)
    Entry("review14_bugs:DecodeTileCrossesGroup", ("edge_shapes", "lse_edges") + GQA, w.decode_group_of_20,
          "a decode kernel's 16-head tile takes its first head's KV head: groups of 20 (FlashML-org/FreeToken#177)",
          "grouped heads"),
    Entry("review14_bugs:WideSoftcapDropped", ("edge_shapes",) + SOFTCAP, w.wide_softcap,
          "the wide head-dim templates (E > 128) launched without the softcap for prefill (kekzl/imp#688)",
          "softcap"),
    Entry("review14_bugs:BwdDeltaFirstSequenceHdim256", ("backward_edges",) + GRADS, w.backward_hdim256_batch,
          "the head-dim 256 backward's rowsum(dO * O) from sequence 0's O for every sequence "
          "(NVIDIA/TransformerEngine#3216)", "gradients"),
    Entry("fp8_serving_bugs:VarlenDescaleFirstSequence", FP8_SERVING, w.fp8_packed_descales,
          "a varlen call's sequences all read sequence 0's descales (sgl-project/sglang#37785's batch axis)", "fp8"),
    Entry("fp8_serving_bugs:VarlenDescalesDropped", FP8_SERVING, w.fp8_packed_descales,
          "a varlen call drops its descales (FlashInfer's ragged wrapper \"does not apply k_scale/v_scale\")", "fp8"),
    Entry("fp8_serving_bugs:KvCacheDescaleByPage", FP8_SERVING, w.fp8_paged_descales,
          "a kvcache call's sequence reads the descales' row its first page id names", "fp8"),
    Entry("fp8_serving_bugs:KvCacheBf16QueryScalesDropped", FP8_SERVING, w.fp8_paged_scales,
          "a bfloat16-query fp8 KV cache's paged call drops k_scale and v_scale (vllm-project/vllm#51363)", "fp8"),
    Entry("fp8_serving_bugs:PackedPathDropsDescales", FP8_SERVING, w.fp8_packed_descales,
          "the packed path drops the descales, the padded call right", "fp8"),
    Entry("fp8_serving_bugs:PagedPathFirstSequenceDescales", FP8_SERVING, w.fp8_paged_descales,
          "the paged path gives every sequence the first one's descales, the padded call right", "fp8"),
    Entry("path_bugs:MergeTieTakesOne", ("merge_",), w.merge_tied,
          "a pair merge by strict comparisons: tied LSEs give one state, not the mean", "conventions"),
    Entry("path_bugs:MergeStatesMaxSplits8", ("merge_states",), w.merge_nine,
          "a combine built for 8 splits dispatched with more (FA3's flash_attn_combine)", "conventions"),
    Entry("path_bugs:PagedSplitFloor", SERVING, w.long_decode,
          "split-KV partitions counted as n // 512, vLLM's paged_attention_v2 shape", "serving"),
    Entry("serving_edge_bugs:PackedEmptyKeysUnwritten", SERVING, w.packed_queries_without_keys,
          "a sequence with no keys exits early, its rows never written, flash-attention#1619", "serving"),
    Entry("serving_edge_bugs:PagedAllLeftPaddingNaN", SERVING, w.paged_all_left_padding,
          "the empty-sequence guard on cache_seqlens alone: all-padding caches give 0 / 0", "serving"),
    Entry("serving_edge_bugs:PagedDecodeLseBase2", ("paged_",) + LSE, w.paged_decode_lse,
          "the paged decode path's LSE in base 2 (a base-2 combine), natural declared", "serving"),
    Entry("serving_edge_bugs:PagedDecodeWindowFromPageStart", SERVING, w.paged_decode_window,
          "the paged decode's window edge rounded down to its page's start", "serving"),
    Entry("serving_edge_bugs:PagedSlotsPast128Wrap", SERVING, w.paged_large_pages,
          "a page's slot index cut to 7 bits: pages over 128 keys misread, flashinfer#4347", "serving"),
    Entry("serving_edge_bugs:PackedDenseTokenStride", ("packed_head_slices",) + SERVING, w.packed_head_slices,
          "q's token stride assumed Hq * E: a fused QKV projection's slice misread, TransformerEngine#1195", "serving"),
    Entry("path_bugs:PagedLeftpadPastFirstBlock", SERVING, w.deep_leftpad,
          "cache_leftpad past a 128-key block: the first block's mask not block-relative", "serving"),
    Entry("path_bugs:PagedLongDecodeGqaModulo", SERVING, w.paged_long_decode_grouped,
          "the multi-partition paged decode's KV head h % Hkv (vLLM's paged_attention_v2 shape)", "serving"),
    Entry("path_bugs:PagedLongDecodeDropsAlibi", SERVING, w.paged_long_decode_alibi,
          "the multi-partition paged decode launched without the ALiBi slopes", "serving"),
    # split-KV and serving paths a fifth review reached (tests/broken/split_path_bugs.py)
    Entry("split_path_bugs:PackedSplitKvRowOffset", SERVING, w.packed_split_kv_ragged,
          "a packed split-KV combine reads a sequence's partials at b * max_seqlen_q + i", "serving"),
    Entry("split_path_bugs:PagedSpecDecodeNoCausal", SERVING, w.paged_chunk_long_cache,
          "2..16 paged queries against a long cache sent to the decode kernel, causal dropped (flashinfer#4739)",
          "serving"),
    Entry("split_path_bugs:PagedLongDecodeWindowPartition", SERVING, w.paged_long_decode_window,
          "a long paged decode's window masked at a partition's start, not at its edge", "serving"),
    Entry("split_path_bugs:PagedLongDecodeAlibiLeftpad", SERVING, w.paged_long_decode_alibi_left_padded,
          "a long paged decode's ALiBi query position less the left padding", "serving"),
    Entry("split_path_bugs:SinksWindowFirstBlockFold", ("edge_shapes",) + SINKS, w.sinks_window_257,
          "the sink folded in at key block 0: window tiles that start later lose it", "sinks"),
    Entry("split_path_bugs:SplitKvSoftcapAlibiOrder", ("edge_shapes",) + SOFTCAP + ALIBI, w.split_kv_softcap_alibi,
          "a split path adds ALiBi before the softcap", "softcap"),
    Entry("split_path_bugs:SplitKvGqaWindowPackedRow", ("edge_shapes",) + WINDOW + GQA, w.split_kv_grouped_window,
          "a split path's window measured from the pack-GQA row", "window"),
    Entry("split_path_bugs:SplitKvSinksGqaKvHead", ("edge_shapes",) + SINKS, w.split_kv_grouped_sinks,
          "a split path under grouped heads reads the KV head's sink", "sinks"),
    # paths a fourth review reached (tests/broken/reach_bugs.py)
    Entry("reach_bugs:WideCausalDropped", ("edge_shapes",) + CAUSAL + REF, w.wide_causal,
          "the head-dim 192 template dispatched with causal off", "masking"),
    Entry("reach_bugs:WideGqaModulo", ("edge_shapes",) + GQA, w.wide_grouped,
          "the head-dim 160/192 templates' KV head h % Hkv", "grouped heads"),
    Entry("reach_bugs:WideTileOffset128", ("edge_shapes",) + REF, w.wide_past_64_rows,
          "the head-dim 256 template's 64-row tiles offset by 128 rows", "online kernel"),
    Entry("reach_bugs:SplitKvLseFirstSplit", ("lse_edges",) + LSE, w.split_kv_lse,
          "the split-KV combine returns split 0's LSE", "lse"),
    Entry("reach_bugs:EmptyQueryTileUnwritten", ("edge_shapes",), w.empty_query_tile,
          "a query tile that sees no key exits unwritten, flash-attention#1778", "online kernel"),
    Entry("reach_bugs:EmptyRowsLseZero", ("lse_edges",) + LSE, w.empty_rows_lse,
          "rows that see no key keep LSE 0, flashinfer#4452", "lse"),
    Entry("reach_bugs:DecodeDropsMask", ("edge_shapes",) + MASKED + REF, w.decode_masked,
          "the long-cache decode kernel takes no mask", "masking"),
    Entry("reach_bugs:SplitKvIgnoresKeyLengths", ("edge_shapes",) + REF, w.split_kv_key_lengths,
          "the split-KV path never reads kv_lengths", "sequences"),
    Entry("reach_bugs:LongPrefillTopLeft", ("edge_shapes",) + ALIGNMENT, w.long_prefill_bottom_right,
          "the long-prefill tiling (Lq >= 768) bounds causal top-left", "alignment"),
    Entry("reach_bugs:GqaBiasByKvHead", ("edge_shapes",) + GQA + BIAS, w.grouped_head_bias,
          "a per-head bias read at the KV head under grouped heads", "bias"),
    Entry("reach_bugs:SplitKvDropsSinks", ("edge_shapes",) + SINKS, w.split_kv_sinks,
          "the split-KV decode path drops the sinks, vllm#52148's class", "sinks"),
    Entry("reach_bugs:SplitKvAlibiBottomRight", ("edge_shapes",) + ALIBI, w.split_kv_alibi_top_left,
          "the split-KV path's ALiBi distances bottom-right whatever is asked", "alibi"),
    Entry("reach_bugs:SplitKvBiasQueryStride", ("edge_shapes",) + BIAS, w.split_kv_key_padding_bias,
          "the split-KV path reads a query-broadcast bias with query stride Lk", "bias"),
    Entry("reach_bugs:MaskHeadBroadcastBatch0", ("edge_shapes",) + MASKED + REF, w.head_broadcast_mask,
          "a (B, 1, ., Lk) mask read with batch stride 0", "masking"),
    Entry("reach_bugs:BwdEmptyRowNaN", ("backward_empty_rows",), w.backward_empty_rows,
          "exp(S - LSE) recomputed with LSE = -inf: NaN in an empty row's dQ and its head's dK, dV "
          "(flash-attention#443)", "gradients"),
    Entry("reach_bugs:BwdEmptyTileDqUnwritten", ("backward_empty_rows",), w.backward_empty_query_tile,
          "the backward skips a 64-row query tile that sees no key, its dQ left as allocated", "gradients"),
    # the backward past its first 128-key block or tile, a fifth review (tests/broken/backward_block_bugs.py)
    Entry("backward_block_bugs:BwdWindowDkvTileRange", ("backward_edges",) + GRADS, w.backward_window_257,
          "a window's dK/dV pass finds a key block's last query tile from its first key", "gradients"),
    Entry("backward_block_bugs:BwdWindowGqaDqPackedRow", ("backward_edges",) + GRADS, w.backward_window_grouped,
          "a pack-GQA dQ pass takes a packed row for a query index under a window (FA3 pack_gqa + local)",
          "gradients"),
    Entry("backward_block_bugs:DbiasQueryBroadcastLastTile", ("backward_edges",) + GRADS, w.backward_query_broadcast_bias,
          "dBias of a query-broadcast bias stored per 128-row tile, the last tile's wins", "gradients"),
    Entry("backward_block_bugs:DbiasBatchBroadcastLastBatch", ("backward_edges", "bias_gradient") + GRADS,
          w.backward_batch_broadcast_bias, "dBias of a batch-broadcast bias the last sequence's (jax#30593)",
          "gradients"),
    Entry("backward_block_bugs:BwdKeyLengthsTailBlock", ("backward_edges",) + GRADS, w.backward_key_lengths_tail,
          "key lengths masked in key block 0 only: padded keys of a tail block get dK, dV", "gradients"),
    Entry("backward_block_bugs:BwdAlibiKeyBlockRelative", ("backward_edges",) + GRADS + ALIBI, w.backward_alibi_long,
          "the backward's ALiBi distance from the key's index within its 128-key block", "gradients"),
    Entry("backward_block_bugs:BwdSegmentsTileSkip", ("backward_edges",) + GRADS, w.backward_segments_long,
          "the backward skips a (tile, block) pair by the tile's first row's segment", "gradients"),
    Entry("backward_block_bugs:BwdSoftcapDkLaterBlocks", ("backward_edges", "softcap_gradient") + GRADS,
          w.backward_softcap_long, "the softcap's tanh' left out of dK past key block 0 (flash-attention#1033)",
          "gradients"),
    Entry("backward_block_bugs:BwdSinksDsinkFirstTile", ("backward_edges", "dsink"), w.dsink_long,
          "dSink from the first 128-row query tile only", "gradients"),
    # strides and ratios a sixth review reached (tests/broken/stride_bugs.py)
    Entry("stride_bugs:DecodeGqaShiftGroup", ("edge_shapes",) + GQA, w.decode_group_of_3,
          "a decode's KV head h >> ceil(log2 g): wrong for groups of 3, 5, 6, 7 (onnxruntime#29046)", "grouped heads"),
    Entry("stride_bugs:DecodeGqaGroupOver8", ("edge_shapes",) + GQA, w.mqa_decode_group_of_16,
          "a decode packing a group on a 16-row tile leaves query heads 8.. of a group unwritten", "grouped heads"),
    Entry("stride_bugs:MqaDecodeBatchZero", ("edge_shapes",) + GQA, w.mqa_decode_group_of_16,
          "an MQA decode reads the KV cache with batch stride 0", "grouped heads"),
    Entry("stride_bugs:MaskHeadBroadcastAsKeyPadding", ("edge_shapes",) + MASKED + REF, w.mask_over_heads,
          "a (B, 1, Lq, Lk) mask read as key padding: query row 0's for every row", "masking"),
    Entry("stride_bugs:MaskBatchBroadcastHeadZero", ("edge_shapes",) + MASKED + REF, w.mask_over_batch,
          "a (1, H, Lq, Lk) mask read with head stride 0 too", "masking"),
    Entry("stride_bugs:MaskQueryBroadcastDenseStride", ("edge_shapes",) + MASKED + REF, w.mask_over_queries,
          "a (B, H, 1, Lk) mask addressed with a dense query stride", "masking"),
    Entry("stride_bugs:BiasQueryBroadcastBatchZero", ("edge_shapes",) + BIAS, w.bias_over_queries,
          "a (B, H, 1, Lk) bias read with batch stride 0", "bias"),
    Entry("stride_bugs:BwdHeadDimTailColumns", ("backward_edges",) + GRADS, w.backward_head_dim_59,
          "dK's last E mod 8 columns never stored past head dim 32", "gradients"),
    Entry("stride_bugs:BwdCausalTopLeftRowsPastLk", ("backward_edges",) + GRADS, w.backward_causal_more_queries,
          "causal top-left with Lq > Lk: the dK/dV pass's query loop bounded by the keys' tiles", "gradients"),
    Entry("stride_bugs:BwdPackGqaTileStore", ("backward_edges",) + GRADS, w.backward_group_of_16,
          "a pack-GQA backward stores each 8-head tile's dK, dV instead of adding them", "gradients"),
    Entry("stride_bugs:KnobNumSplitsLongTail", ("knob_",), w.knob_splits_long,
          "num_splits on a split path drops the last Lk mod n keys", "conventions"),
    Entry("reach_bugs:DbiasGqaFirstOfGroup", ("backward_edges",) + GRADS, w.grouped_head_bias_gradient,
          "dBias of a per-head bias under grouped heads: the group's first head's", "gradients"),
    # a split path's launcher and the backward's tile ranges, a seventh review (tests/broken/launch_bugs.py)
    Entry("launch_bugs:SplitKvAccumSizedByQkDim", ("edge_shapes",) + REF, w.split_kv_wide_values,
          "a split path's partial outputs sized by the query's head dim: Ev > E columns lost", "online kernel"),
    Entry("launch_bugs:SplitKvSoftcapDefaultScale", ("edge_shapes", "lse_edges") + SOFTCAP, w.split_kv_softcap_scale,
          "a split path's launcher folds 1/sqrt(E) into the softcap over an explicit scale", "softcap"),
    Entry("launch_bugs:SplitKvDropsWindowRight", ("edge_shapes", "lse_edges") + WINDOW, w.split_kv_window_right,
          "a decode kernel that takes a left window only (FlashInfer's window_left): the right bound dropped",
          "window"),
    Entry("launch_bugs:SplitKvEmptySplitLsePlusInf", ("edge_shapes", "lse_edges") + MASKED + REF,
          w.split_kv_empty_split_row, "a split where a row sees nothing writes LSE +inf (FA2's softmax epilogue)",
          "online kernel"),
    Entry("launch_bugs:BwdWindowAsymSwappedTiles", ("backward_edges",) + GRADS, w.backward_window_asymmetric,
          "the dK/dV pass's query-tile range with a window's left and right swapped", "gradients"),
    Entry("launch_bugs:BwdWindowLeftUnboundedDqTiles", ("backward_edges",) + GRADS, w.backward_window_left_unbounded,
          "a window unbounded on the left (-1) taken as a width in the dQ pass's key-block range", "gradients"),
    Entry("launch_bugs:BwdZeroSizesUnwritten", ("backward_empty_sizes",) + GRADS, w.backward_no_queries,
          "the backward returns on an empty grid with its gradients unwritten (torch.empty)", "gradients"),
    Entry("launch_bugs:BwdGqaShiftGroup", ("backward_edges",) + GRADS, w.backward_group_of_3,
          "the backward's KV head h >> ceil(log2 g): wrong for groups of 3 (onnxruntime#29046's, in a backward)",
          "gradients"),
    Entry("launch_bugs:BwdSinksDsinkByKvHead", ("backward_edges", "dsink"), w.dsink_grouped,
          "dSink added at the KV head's index under grouped heads", "gradients"),
    # positions, lengths and segment ids beside the other fields, an eighth review (tests/broken/position_bugs.py)
    Entry("position_bugs:PerSequenceDropsMaskBiasSegments", ("per_sequence_positions_keep",) + SERVING,
          w.per_sequence_with_mask, "per-sequence positions routed to a varlen kernel: mask, bias, segment ids dropped",
          "serving"),
    Entry("position_bugs:SegmentsFoundBySearch", ("other_segment_changes_nothing", "edge_shapes") + SEGMENTS,
          w.segments_out_of_order, "a segment's keys found by binary search: sorted segment ids assumed", "sequences"),
    Entry("position_bugs:KeyLengthsAsCacheLengths", ("edge_shapes", "lse_edges") + ALIGNMENT + REF,
          w.key_lengths_causal_bottom_right, "key lengths alone sent as a KV cache's cache_seqlens: each sequence "
          "aligned at its own length", "sequences"),
    Entry("position_bugs:WindowOffsetClampedAtZero", ("edge_shapes", "lse_edges") + WINDOW,
          w.window_more_queries_than_keys, "a window's diagonal offset clamped at 0 where Lq > Lk bottom-right",
          "window"),
    Entry("position_bugs:WindowFromSegmentStart", ("edge_shapes", "lse_edges") + WINDOW + SEGMENTS,
          w.window_with_segments_apart, "a window measured from each segment's start (per-document position ids)",
          "window"),
    # one instantiation of a kernel template (tests/broken/template_bugs.py)
    Entry("template_bugs:MlaVRowPitch", ("edge_shapes",) + REF, w.mla_prefill,
          "the (192, 128) template reads V with K's row pitch (FA3's MLA prefill instantiation)", "online kernel"),
    Entry("template_bugs:BackwardHdimDispatch", ("backward_edges",) + GRADS, w.backward_hdim_80,
          "the backward's dispatch sends head dims 65..128 to the 64 kernel", "gradients"),
    Entry("template_bugs:BackwardCausalTopLeftBound", ("backward_edges",) + GRADS,
          w.backward_bottom_right_past_a_block,
          "the backward's key-block loop starts at n * BN / BM under bottom-right causal", "gradients"),
    Entry("template_bugs:Float16Accumulator", ("edge_shapes",) + REF, w.long_row_one_sign,
          "both matmuls accumulate in float16 (allow_fp16_accumulation)", "online kernel"),
    # issue 9: grouped heads, bias, alignment, LSE
    Entry("variant_bugs:KvHeadModulo", GQA, w.grouped, "head h reads KV head h % Hkv, flash-attention#2528",
          "grouped heads"),
    Entry("variant_bugs:KvHeadZero", GQA, w.grouped, "every head reads KV head 0", "grouped heads"),
    Entry("tile_bugs:PackedGqaGroupOver4", GQA + ("batch_head_independence",), w.grouped_by_5,
          "pack-GQA head map right for groups <= 4 only", "grouped heads"),
    Entry("variant_bugs:DkFirstOfGroup", ("grouped_heads_gradients_are_group_sums",) + GRADS, w.grouped_gradient,
          "dK not summed over the group, levanter#449", "grouped heads"),
    Entry("tile_bugs:KeyPaddingBiasBatch0", ("edge_shapes",) + BIAS + ALIGNMENT, w.key_padding_bias,
          "a (B, 1, 1, Lk) padding bias read with batch stride 0", "bias"),
    Entry("variant_bugs:BiasScaled", BIAS, w.biased, "bias scaled with the scores, tt-metal#42891", "bias"),
    Entry("variant_bugs:FloatMaskAsBool", BIAS, w.biased, "float mask read as boolean (mask.bool())", "bias"),
    Entry("variant_bugs:CausalBottomRightAsTopLeft", ALIGNMENT, w.causal_bottom_right,
          "bottom-right computed top-left, pytorch#108108", "alignment"),
    Entry("variant_bugs:LseUnscaled", LSE, w.lse, "LSE without the scale, flash-sparse-attention#106", "lse"),
    # issue 11: windows, padded and packed sequences, softcap, ALiBi
    Entry("variant_bugs:WindowLeftExclusive", WINDOW, w.windowed, "window left edge off by one, vllm#3385", "window"),
    Entry("variant_bugs:WindowRightOneMore", WINDOW, w.windowed, "window right edge off by one, transformers#29623",
          "window"),
    Entry("tile_bugs:WindowTwoMaskingSteps", ("edge_shapes",) + WINDOW, w.wide_window,
          "left bound applied in the two blocks nearest the diagonal only (n_masking_steps)", "window"),
    Entry("variant_bugs:WindowTopLeft", WINDOW, w.window_bottom_right, "window top-left where bottom-right was asked",
          "window"),
    Entry("variant_bugs:SoftcapAfterMask", SOFTCAP, w.softcapped_causal, "softcap after masking, flash-attention#1025",
          "softcap"),
    Entry("variant_bugs:PaddedRowsNaN", PADDED, w.padded, "padded rows NaN, declared zeros, flash-attention#1228",
          "sequences"),
    Entry("variant_bugs:SegmentEndInclusive", SEGMENTS, w.packed, "segment [start, end]: sees the next one's first key",
          "sequences"),
    Entry("variant_bugs:LengthsOfFirstSequence", REF + PADDED, w.padded_unequal,
          "kv_lengths[0] for the whole batch (issue 23: a draw cache gave every sequence one length)", "sequences"),
    Entry("variant_bugs:SegmentsOfFirstSequence", SEGMENTS, w.packed_unequal,
          "one sequence's segment ids for the whole batch", "sequences"),
    Entry("variant_bugs:AlibiPow2Slopes", ALIBI, w.alibi_6_heads, "ALiBi 2^(-8h/H) for 6 heads, ml-explore/mlx#343",
          "alibi"),
    # issue 30: per-sequence positions, packed and paged calls
    Entry("serving_bugs:AlignsByPaddedLengths", SERVING, w.chunked_prefill,
          "aligned at the padded Lk - Lq, not per sequence", "serving"),
    Entry("serving_bugs:ReadsPastCuSeqlens", SERVING, w.chunked_prefill,
          "one key past cu_seqlens_k, flash-attention#1661", "serving"),
    Entry("serving_bugs:PaddedSeqlenK", SERVING, w.chunked_prefill,
          "the padded seqlen_k for every sequence, vllm-project/flash-attention#18", "serving"),
    Entry("serving_bugs:PagePlacement", SERVING, w.paged_leftpad,
          "pages read in sorted order, pytorch/pytorch#182593", "serving"),
    Entry("serving_bugs:PrescalesCacheInPlace", SERVING, w.shared_prefix,
          "keys scaled in place in the cache: a shared page scaled twice", "serving"),
    Entry("serving_bugs:IgnoresCacheLeftpad", SERVING, w.paged_leftpad,
          "cache_leftpad never used, flash-attention#1788", "serving"),
    Entry("serving_bugs:DecodeSkipsNewestKey", SERVING, w.decode_step,
          "a decode step without its newest key (context length off by one)", "serving"),
    Entry("serving_bugs:LeftpadCountedTwice", SERVING, w.paged_leftpad,
          "cache_leftpad also moves the causal diagonal", "serving"),
    Entry("serving_bugs:ChunkWithinItself", SERVING, w.chunk_after_cache,
          "a chunk attends only within itself, kekzl/imp#117", "serving"),
    Entry("serving_bugs:DecodeDispatchByFirst", SERVING, w.mixed_batch,
          "a mixed batch run by the decode kernel its first sequence chose", "serving"),
    Entry("serving_bugs:StackedVPageStride", SERVING, w.paged_leftpad,
          "a stacked K/V cache's V half read at a separate V cache's page stride", "serving"),
    Entry("serving_bugs:ClampsBadIndices", ("bad_index",), w.bad_indices,
          "declares bad index arguments refused, clamps them (issue 30 item 5)", "serving"),
    # issue 31: attention sinks (tests/broken/sink_bugs.py)
    Entry("sink_bugs:SinkIgnored", SINKS, w.sinks, "sinks accepted and dropped, vllm-project/vllm#52148", "sinks"),
    Entry("sink_bugs:SinkPerSplit", SINKS, w.sinks, "the sink counted in every split, ROCm/rocm-libraries#12227",
          "sinks"),
    Entry("sink_bugs:SinkScaled", SINKS, w.sinks, "the sink multiplied by the softmax scale", "sinks"),
    Entry("sink_bugs:SinkCapped", SINKS, w.sinks, "the sink softcapped", "sinks"),
    Entry("sink_bugs:SinkByKvHead", SINKS, w.sinks, "the sink of the KV head's index", "sinks"),
    Entry("sink_bugs:SinkWithValue", SINKS, w.sinks, "the sink given a value (v_0)", "sinks"),
    Entry("serving_bugs:SinksDroppedOffPadded", ("sinks_in_",), w.paged_sinks,
          "sinks applied in the padded call, dropped by the packed and paged paths, vllm-project/vllm#52148", "sinks"),
    Entry("serving_bugs:SinkPerPage", ("sinks_in_paged",), w.paged_sinks,
          "the sink counted once per page (pages as split-KV splits), ROCm/rocm-libraries#12227", "sinks"),
    Entry("sink_bugs:SinkLseExcluded", SINKS, w.sinks_lse, "LSE without the sink, declared with it", "sinks"),
    # issue 31: conventions kernels differ on, declared and judged
    Entry("variant_bugs:LseBase2DeclaredE", ("lse_base",) + LSE, w.lse, "log2 LSE declared natural, flashinfer#2113",
          "conventions"),
    Entry("variant_bugs:EmptyLsePlusInfDeclaredMinusInf", ("empty_lse",), w.empty_row_lse,
          "empty-row LSE +inf (FA2) declared -inf (FA3)", "conventions"),
    Entry("convention_bugs:MergeEmptyNaN", ("merge_",), w.merge_states, "two empty states merge to NaN, flashinfer#4051",
          "conventions"),
    Entry("convention_bugs:MergeAverages", ("merge_",), w.merge_states, "merge ignores the LSE gap (averages)",
          "conventions"),
    Entry("convention_bugs:MergeStatesDropsLast", ("merge_states",), w.merge_list,
          "a list merge over num_splits - 1 splits (FA3's flash_attn_combine)", "conventions"),
    Entry("convention_bugs:MergeStatesShiftByFirst", ("merge_states",), w.merge_list,
          "a list merge shifting by the first split's LSE, not the largest", "conventions"),
    Entry("convention_bugs:KnobDropsTail", ("knob_",), w.knob_tail, "a block size that drops the last partial block",
          "conventions"),
    Entry("convention_bugs:BackwardRandomOrder", ("deterministic",), w.repeated_backward,
          "deterministic backward declared, atomics' order, flash-attention#2244", "conventions"),
    Entry("convention_bugs:RowDependsOnBatch", ("batch_invariant",), w.batch_rows,
          "batch invariance declared, split-KV by batch size", "conventions"),
    # issue 31: fp8 inputs with descales (tests/broken/fp8_bugs.py)
    Entry("fp8_bugs:DescalesDropped", FP8, w.fp8_descales, "descales dropped, vllm-project/vllm#51363", "fp8"),
    Entry("split_path_bugs:Fp8SplitKvVDescaleTwice", ("descales_on_split_kv",) + FP8, w.fp8_split_kv_descales,
          "v_descale applied to each split and again after the combine", "fp8"),
    Entry("fp8_bugs:KDescaleTwice", FP8, w.fp8_descales, "k_descale applied twice", "fp8"),
    Entry("fp8_bugs:DescalePerTensor", FP8, w.fp8_descales, "one descale where per-head ones are declared", "fp8"),
    Entry("fp8_bugs:DescaleWrongHead", FP8, w.fp8_descales, "a KV head reads its neighbour's descale", "fp8"),
    Entry("fp8_bugs:DescaleFirstBatch", FP8, w.fp8_descales,
          "the first batch element's descales for all, sgl-project/sglang#37785", "fp8"),
    Entry("fp8_bugs:DescaleReadDense", ("descale_shapes",) + FP8, w.fp8_compact_descales,
          "a (B, 1), (1, Hkv) or (Hkv,) descale read with dense (B, Hkv) strides", "fp8"),
    Entry("fp8_bugs:PNotRounded", ("p_rounding",), w.fp8_p_rounding, "P kept in float32, e4m3 declared (FA3)", "fp8"),
)

CORRECT = (
    Entry("correct:EinsumAttention", origin="einsum forward and backward"),
    Entry("correct:einsum_attention", origin="plain function, declares nothing"),
    Entry("correct:TiledOnline", origin="online softmax, 7-key blocks, lse backward"),
    Entry("correct:NaNForFullyMasked", origin="NaN for empty rows, declared"),
    Entry("correct:LogSpace", origin="exp(s - lse)"),
    Entry("correct:Float32Internal", origin="16-bit in, float32 inside"),
    Entry("correct:GqaRepeatKv", origin="every field; GQA by repeating K/V; mask, window selected"),
    Entry("correct:GqaGroupedQueries", origin="every field; GQA by grouping queries; mask, window as -inf bias"),
    Entry("correct:DsScaleRounded", origin="dS * scale rounded to the dtype before dQ and dK (issue 29)"),
    Entry("flash_twins:flash_attn_varlen_func", origin="flash-attention's varlen signature and layout (issue 30)"),
    Entry("flash_twins:flash_attn_with_kvcache", origin="flash-attention's kvcache signature, paged (issue 30)"),
    Entry("flash_twins:flash_attn_with_paged_kv_cache",
          origin="the kvcache signature over FlashInfer's stacked paged_kv_cache (issue 30)"),
    Entry("sink_bugs:SinkKernel", origin="split-KV, the sink folded once after the merge (FlashInfer; issue 31)"),
    Entry("sink_bugs:SinkInitMax", origin="the running max initialised with the sink, LSE without it, declared "
                                         "(gpt-oss's Triton kernel; issue 31)"),
    Entry("correct:LseBase2Declared", origin="log2 LSE, declared base 2 (FlashInfer, issue 31)"),
    Entry("correct:EmptyLsePlusInf", origin="+inf empty-row LSE declared (FA2), its merge takes +inf (issue 31)"),
    Entry("correct:MergeStatesOnline", origin="a list merge done online over the splits (issue 31: "
                                             "FA3's flash_attn_combine)"),
    Entry("correct:KnobBlockSize", origin="block-size knob, every tail kept; deterministic, batch invariant (issue 31)"),
    Entry("fp8_bugs:Fp8Kernel", origin="FA3's fp8 forward: descales folded, P rounded to e4m3 per block (issue 31)"),
    Entry("fp8_bugs:Fp8Dequantised", origin="fp8 dequantised to float32 first, P not rounded, declared (issue 31)"),
    Entry("fp8_serving_bugs:Fp8Varlen", origin="FA3's fp8 varlen call: descales (B, Hkv), row b sequence b's "
                                              "(issues 30 and 31)"),
    Entry("fp8_serving_bugs:Fp8KvCache", origin="FA3's fp8 kvcache call over a paged cache (issues 30 and 31)"),
    Entry("fp8_serving_bugs:Fp8KvCacheBf16Query", origin="an fp8 KV cache with a bfloat16 query and one k_scale, "
                                                         "v_scale a tensor, paged (vLLM, FlashInfer; issues 30, 31)"),
)
