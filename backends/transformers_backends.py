"""Hugging Face transformers: the attention functions its models call.

``transformers-sdpa``: ``transformers.integrations.sdpa_attention.sdpa_attention_forward(module,
query, key, value, attention_mask, scaling=, is_causal=, position_bias=)``, what a model with
``attn_implementation="sdpa"`` runs; ``transformers-eager``: Gemma 2's ``eager_attention_forward``
(Llama's plus ``softcap``), what ``attn_implementation="eager"`` runs.  Both take (B, H, L, E)
and return (B, L, H, E) (the adapter transposes back); grouped KV heads through the module's
``num_key_value_groups`` (the adapter passes a module carrying it, as a model's attention layer
does).  Masks are transformers' own convention: a boolean mask for SDPA, an additive float mask
(0 where a pair takes part, ``torch.finfo(dtype).min`` where not: ``transformers.masking_utils``)
for eager; a bias is added to the scores (eager: in its additive mask; SDPA: ``position_bias``,
which the function combines with a boolean mask itself).  The eager function has no causal flag:
causality is a mask, built as masking_utils builds it without a cache (query i sees keys j <= i).
The eager softmax runs in float32 ("upcast attention to fp32"), float64 input too.  What the
suite found: docs/findings.md.
"""
from __future__ import annotations

import types

import numpy as np

from attnspec.backends.base import Backend, BackendUnavailable, Capabilities, Deviation, Semantics
from attnspec.backends.declarations import NAN_IN_OUTPUT

_ALL = ("float16", "bfloat16", "float32", "float64")


class _Transformers(Backend):
    def load(self):
        try:
            import torch
            from transformers.integrations import sdpa_attention
            from transformers.models.gemma2 import modeling_gemma2
        except ImportError as e:
            raise BackendUnavailable(f"transformers (with torch) is not installed ({e}); "
                                     "pip install 'attnspec[zoo]'") from None
        self.torch, self.sdpa, self.gemma2 = torch, sdpa_attention, modeling_gemma2

    def to_native(self, x, dtype):
        t = self.torch.from_numpy(np.ascontiguousarray(x))
        return t if dtype is None else t.to(getattr(self.torch, dtype))

    def from_native(self, y):
        y = y.detach()
        return (y.float() if y.dtype == self.torch.bfloat16 else y).cpu().numpy()

    def _four_d(self, x, q, k):
        """A mask or bias as transformers' own are: 4-D, (B or 1, H or 1, Lq, Lk)."""
        return None if x is None else x.reshape((1,) * (4 - x.dim()) + tuple(x.shape))

    def _module(self, q, k):
        """What a model's attention layer carries that the functions read."""
        return types.SimpleNamespace(num_key_value_groups=q.shape[-3] // k.shape[-3], head_dim=q.shape[-1],
                                     is_causal=True, training=False)

    def native_attention(self, q, k, v, call):
        with self.torch.no_grad():
            return self._attention(q, k, v, call)

    def native_attention_backward(self, q, k, v, grad_out, call):
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        y = self._attention(*leaves, call)  # (B, H, Lq, Ev)
        return self.torch.autograd.grad(y, leaves, grad_out)


class TransformersSdpa(_Transformers):
    """sdpa_attention_forward, as attn_implementation="sdpa" calls it."""

    name = "transformers-sdpa"
    # with a mask, is_causal is ignored (transformers' masks carry causality: masking_utils): the suite folds
    # the triangle into the mask, as a model's mask does
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=True, features=frozenset(("gqa", "bias")),
                                mask_with_causal=False)
    semantics = Semantics(notes=(
        "is_causal is used only without a mask and for more than one query row: a decode step (Lq = 1) sees "
        "every key (the code's comment: 'Not in decoding phase'); a prefill with Lk > Lq crops the keys to Lq",
        "with a mask, is_causal is ignored (the mask carries causality, as masking_utils builds it): the "
        "triangle is folded into the mask",
        "a bias goes in as position_bias, which the function combines with a boolean mask (finfo.min where hidden)"),
        deviations=(Deviation("*", "is_causal is dropped for a one-row query (a decode step sees every cached key: "
                              "'Not in decoding phase'), so Lq = 1 is not top-left causal while 1 < Lq is "
                              "(docs/findings.md: transformers-sdpa-decode-causal)",
                              problems=r"\bLq=1 [^)]*is_causal=True"),))

    def _attention(self, q, k, v, call):
        out, _ = self.sdpa.sdpa_attention_forward(self._module(q, k), q, k, v, self._four_d(call.mask, q, k),
                                                  scaling=call.scale, is_causal=call.is_causal,
                                                  position_bias=self._four_d(call.bias, q, k))
        return out.transpose(1, 2)  # (B, L, H, E) -> (B, H, L, E)


_BMM_NAN = ("a row a -inf bias hides whole is NaN (softmax over -inf), and torch.bmm in bfloat16 on CPU carries "
            "the NaN into the row before it, which sees keys (docs/findings.md: torch-bmm-bf16-nan)")


class TransformersEager(_Transformers):
    """Gemma 2's eager_attention_forward, as attn_implementation="eager" calls it (softcap included)."""

    name = "transformers-eager"
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=True,
                                features=frozenset(("gqa", "bias", "softcap")), mask_with_causal=True)
    semantics = Semantics(effective_precision="float32", notes=(
        "masks are additive: 0 where a pair takes part, torch.finfo(dtype).min where not (masking_utils)",
        "causal is a mask, as masking_utils builds it without a cache: query i sees keys j <= i",
        "the softmax runs in float32 ('upcast attention to fp32'), float64 input too"),
        # torch 2.13 CPU, found by the suite: a row a -inf bias hides whole gets NaN weights (softmax over
        # -inf), cast to bfloat16, and torch.bmm's bfloat16 kernel lets that NaN reach the row before it:
        # rows 2, 3, 11, 13, 15 hidden gave NaN on rows 1-3 and 10-15 (Lq = 17, Lk = 7).  Each property prints
        # that NaN as "nan" (specs.invariants.shown), in the words NAN_IN_OUTPUT matches
        deviations=(Deviation("*", _BMM_NAN, dtypes=("bfloat16",), feature="bias", when=NAN_IN_OUTPUT),
                    # the property builds the -inf bias from the drawn mask itself: the problem has no bias
                    Deviation("neg_inf_bias_equals_boolean_mask", _BMM_NAN, dtypes=("bfloat16",),
                              when=NAN_IN_OUTPUT)))

    def _additive(self, q, k, call):
        """The mask, causal triangle and bias as transformers' eager path takes them: one additive
        (..., Lq, Lk) tensor, or None."""
        torch = self.torch
        hidden = call.mask
        if call.is_causal:
            Lq, Lk = q.shape[-2], k.shape[-2]
            causal = torch.arange(Lk)[None, :] <= torch.arange(Lq)[:, None]  # (Lq, Lk) masking_utils' causal_mask_function
            hidden = causal if hidden is None else hidden & causal
        additive = None
        if hidden is not None:  # masking_utils' eager mask: 0 or the dtype's most negative number
            zero, low = torch.tensor(0.0, dtype=q.dtype), torch.tensor(torch.finfo(q.dtype).min, dtype=q.dtype)
            additive = torch.where(hidden, zero, low)  # (..., Lq, Lk)
        if call.bias is not None:
            additive = call.bias if additive is None else additive + call.bias
        return additive

    def _attention(self, q, k, v, call):
        additive = self._additive(q, k, call)  # (..., Lq, Lk) or None
        out, _ = self.gemma2.eager_attention_forward(self._module(q, k), q, k, v, self._four_d(additive, q, k),
                                                     scaling=call.scale, softcap=call.softcap)
        return out.transpose(1, 2)  # (B, L, H, E) -> (B, H, L, E)


class TransformersGptOss(TransformersEager):
    """GPT-OSS's eager_attention_forward (issue 31): the sinks concatenated as one more logit column,
    the row maximum subtracted, a softmax in the input dtype, the column dropped.  The function reads
    ``module.sinks`` (Hq,) always: a problem without sinks gets -inf there (exp(-inf) = 0, the same)."""

    name = "transformers-gpt-oss"
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=True,
                                features=frozenset(("gqa", "bias", "sinks")), mask_with_causal=True)
    semantics = Semantics(notes=(
        "masks are additive: 0 where a pair takes part, torch.finfo(dtype).min where not (masking_utils)",
        "causal is a mask, as masking_utils builds it without a cache: query i sees keys j <= i",
        "the sink is one more logit column, softmax(..., dtype=the logits' dtype): no float32 upcast"),
        deviations=TransformersEager.semantics.deviations)

    def load(self):
        super().load()
        from transformers.models.gpt_oss import modeling_gpt_oss
        self.gpt_oss = modeling_gpt_oss

    def _attention(self, q, k, v, call):
        torch = self.torch
        additive = self._additive(q, k, call)  # (..., Lq, Lk) or None
        module = self._module(q, k)
        module.sinks = (torch.full((q.shape[-3],), float("-inf")) if call.sinks is None else call.sinks).to(q.dtype)
        scale = q.shape[-1] ** -0.5 if call.scale is None else call.scale  # the function takes no default
        out, _ = self.gpt_oss.eager_attention_forward(module, q, k, v, self._four_d(additive, q, k), scaling=scale)
        return out.transpose(1, 2)  # (B, L, H, E) -> (B, H, L, E)

    def native_attention_backward(self, q, k, v, grad_out, call):
        from dataclasses import replace
        sinks = () if call.sinks is None else (call.sinks,)  # dSink last, through the module's sinks
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v) + sinks]
        y = self._attention(*leaves[:3], replace(call, sinks=leaves[3] if sinks else None))  # (B, H, Lq, Ev)
        return self.torch.autograd.grad(y, leaves, grad_out)
