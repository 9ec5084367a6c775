"""Deliberately broken and deliberately different-but-correct attention implementations.

The proof of teeth (tests/test_teeth.py) runs the conformance suite on each: every BROKEN entry
must be rejected, with a failure in its expected property family; every CORRECT entry accepted.

``catches``: substrings of the property names expected among the failures (any one suffices;
the property that actually caught it is reported).  ``witness``: a problem from
``tests.broken.witnesses`` on which the bug visibly shows against the reference.
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

BROKEN = (
    Entry("seed_mistakes:ScaleByD", REF + SCALE, w.default_path, "seed 004: scale by d, not sqrt(d)"),
    Entry("seed_mistakes:NoScale", REF + SCALE, w.default_path, "seed 004: no 1/sqrt(d)"),
    Entry("seed_mistakes:MaskAfterSoftmax", WEIGHTS + REF + MASKED, w.with_mask,
          "seed 000: weights zeroed after the softmax"),
    Entry("seed_mistakes:SumNormalised", WEIGHTS + REF, w.default_path, "normalised by the sum of scores"),
    Entry("seed_mistakes:NoMaxSubtraction", REF + WEIGHTS, w.huge_logits, "seed 004: no max subtraction"),
    Entry("mask_bugs:CausalDiagonalExcluded", CAUSAL + REF + WEIGHTS, w.causal_square, "causal j < i"),
    Entry("mask_bugs:CausalOneAhead", CAUSAL, w.causal_square, "causal j <= i + 1"),
    Entry("mask_bugs:InvertedMask", MASKED + REF, w.with_mask, "mask polarity: True = masked"),
    Entry("mask_bugs:CausalBottomRightDeclaredTopLeft", CAUSAL, w.causal_rectangular,
          "flash-attn 2.1 alignment, Dao-AILab/flash-attention#951"),
    Entry("mask_bugs:CausalIgnoredWithoutMask", CAUSAL, w.causal_square, "early return, jax-ml/jax#32300"),
    Entry("mask_bugs:FiniteMaskFill", ("fully_masked_rows",) + MASKED + CAUSAL, w.fully_masked_row,
          "-1e4 mask fill, hyunwoongko/transformer#10"),
    Entry("kernel_bugs:OnlineNoRescale", REF + WEIGHTS, w.growing_max, "online softmax: sum not rescaled"),
    Entry("kernel_bugs:OnlineMaskedBlockNaN", REF + MASKED + ("fully_masked_rows",) + WEIGHTS,
          w.first_block_masked, "no -inf guard, pytorch/pytorch#109517"),
    Entry("kernel_bugs:TailBlockZeroPad", REF + WEIGHTS, w.short_tail,
          "unmasked Lk % 64 tail, flashinfer-ai/flashinfer#5090, jax-ml/jax#27224"),
    Entry("kernel_bugs:LongSequenceFastPathDropsMask", MASKED + REF, w.long_masked,
          "Lk > 64 path drops the mask, pytorch/pytorch#107884"),
    Entry("kernel_bugs:LowPrecisionAccumulation", REF, w.long_float32,
          "fp16 accumulation for fp32, pytorch/executorch#20089"),
    Entry("kernel_bugs:NaNForFullyMaskedDeclaredZeros", ("fully_masked_rows",), w.fully_masked_row,
          "NaN rows declared zeros, pytorch/pytorch#103963"),
    Entry("kernel_bugs:ExplicitScaleIgnored", ("explicit_scale_honoured",) + REF, w.explicit_scale,
          "scale swallowed, hao-ai-lab/FastVideo#1457, huggingface/transformers#44380"),
    Entry("gradient_bugs:DqMissingScale", GRADS, w.gradient, "dQ without the scale"),
    Entry("gradient_bugs:BackwardRecomputeDropsMask", GRADS, w.gradient_causal,
          "backward recompute ignores the mask"),
)

CORRECT = (
    Entry("correct:EinsumAttention", origin="einsum forward and backward"),
    Entry("correct:einsum_attention", origin="plain function, declares nothing"),
    Entry("correct:TiledOnline", origin="online softmax, 7-key blocks, lse backward"),
    Entry("correct:NaNForFullyMasked", origin="NaN for empty rows, declared"),
    Entry("correct:LogSpace", origin="exp(s - lse)"),
    Entry("correct:Float32Internal", origin="float16 in, float32 inside"),
)
