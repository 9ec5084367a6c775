"""PyTorch FlexAttention backends: torch-flex (eager) and torch-flex-compiled.

``torch.nn.attention.flex_attention`` is a programmable kernel: the problem's fields are
written as its own two hooks, so every field is native here.  ``score_mod(score, b, h, q_idx,
kv_idx)`` receives the *scaled* score and applies, in the spec's order, the softcap, the bias
and ALiBi (``-slope_h * |q_idx + o - kv_idx|``); ``mask_mod(b, h, q_idx, kv_idx)`` says which
pairs take part (mask, causal and window on the diagonal ``q_idx + o`` with o = Lk - Lq when
bottom-right aligned, lengths, segment ids) and becomes a ``BlockMask``.  Grouped heads:
``enable_gqa=True``.  The LSE: ``return_aux=AuxRequest(lse=True)`` (natural log, float32 for
16-bit inputs; -inf on a fully masked row).

Packed calls (cu_seqlens): one flex call with document masks, backends/flex_formats.py (eager only;
paged KV is not declared, why there).  Measured on torch 2.13 CPU: flex_attention has no backward on CPU ("FlexAttention does not
support backward on CPU"), so neither backend declares gradients.  Eager flex materialises the
scores (it warns so; that one warning is silenced here) and takes float64.  Compiled flex
(``torch.compile(flex_attention, dynamic=False)``, one compiled callable per backend) takes
float16/bfloat16/float32 only, inference only and no LSE ("torch.compile on CPU only
supports inference and `return_lse` is not supported yet"); its first call at a new shape,
dtype or static field (softcap, window, scale...) compiles (tens of seconds on a CPU:
docs/measurements.md), later calls reuse it.

Eager flex_attention still traces its hooks with dynamo (backend "eager") and retraces
on a new structure, constant or size class; for small problems the eager backend therefore
writes the hooks with every field as tensor data (`_uniform_mods`) and traces size-obliviously
(`_tracing`); the mask, lengths and segment ids are read as one tensor (each index a hook reads
costs a call under flex's vmaps).  What each step saved: docs/measurements.md.
"""
from __future__ import annotations

import types
import warnings

from attnspec.backends import flex_formats
from attnspec.backends.base import BackendUnavailable, Capabilities, Deviation, Semantics
from attnspec.backends.torch_backends import TorchBackend, _fold
from attnspec.specs.fields import EVERY_FEATURE

_ALL = ("float16", "bfloat16", "float32", "float64")
_EVERY_FEATURE = EVERY_FEATURE  # the whole definition (specs.fields)
_EAGER_WARNING = "flex_attention called without torch.compile"
# torch 2.13, CPU; both found by the suite (reproducers in the report)
_DEVIATIONS = (
    Deviation("nan_in_padding_changes_nothing",
              "a mask_mod hides padded keys from the softmax, but their weights (exact zeros) still multiply "
              "the padded values: NaN there gives 0 * NaN = NaN rows"),
    Deviation("empty_sizes",
              "no key at all (Lk = 0) raises IndexError ('max(): Expected reduction dim 3 to have non-zero "
              "size') instead of returning the declared fully-masked rows", when=r"does '(Lk=0: )?error\b"),
)
_BLOCK = 128  # flex_attention's default block size
_RECOMPILE_LIMIT = 1024  # dynamo's default (8 per function) would run flex eagerly after 8 shapes


class TorchFlex(TorchBackend):
    """flex_attention, eager: the scores are materialised, every dtype runs."""

    name = "torch-flex"
    compiled = False
    # eager flex runs one dense path (materialised scores) for every shape, with dynamo and vmap work
    # on every call: the edges grid (shapes where kernels switch paths) once a run, dealt over
    # its dtypes like a compiling backend's (properties/test_edges.py), not 4 x 58 calls
    edge_grid_over_dtypes = True
    # sinks (issue 31) through the returned LSE, as transformers' GPT-OSS flex path renormalises
    # (huggingface/transformers#41083): flex's score_mod cannot add a column to the denominator
    capabilities = Capabilities(dtypes=_ALL, device="cpu", gradients=False,
                                features=_EVERY_FEATURE | {"sinks", "seq_positions"}, formats=("padded", "packed"))
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros",
                          deviations=_DEVIATIONS, lse_with_sinks=True,
                          notes=("eager flex_attention materialises the scores (its warning is silenced)",
                                 "no gradients: FlexAttention has no backward on CPU (torch 2.13)"))

    native_packed = flex_formats.flex_packed  # sequences as document masks, one flex call

    def load(self):
        super().load()
        try:
            from torch.nn.attention import flex_attention as fa
        except ImportError as e:
            raise BackendUnavailable(f"this torch has no FlexAttention ({e})") from None
        self._fa = fa
        self._memo = getattr(self, "_memo", None)

    def _attention(self, q, k, v, call):
        Lq, Ev = q.shape[-2], v.shape[-1]
        q, k, v, batch = _fold(q, k, v, call)  # (B, N, L, ·)
        score_mod, block_mask, uniform = self._mods(call, batch, q.shape[0], q.shape[1], Lq, k.shape[-2],
                                                    q.device, q.dtype)
        if uniform:  # fresh row-major tensors: dynamo guards on a view's base strides too (8 retraces of 24)
            q, k, v = (x.clone(memory_format=self.torch.contiguous_format) for x in (q, k, v))  # (B, N, L, ·)
        # the uniform hooks always ask for the LSE: one graph with it instead of one with and one without
        aux = self._fa.AuxRequest(lse=True) if call.return_lse or uniform or call.sinks is not None else None
        y, out_aux = self._run_flex(q, k, v, score_mod, block_mask, call, aux)  # (B, N, Lq, Ev)
        if call.sinks is not None:
            y, out_aux = self._with_sinks(y, out_aux.lse, call.sinks)
        if not call.return_lse:
            return y.reshape(*batch, Lq, Ev)  # (..., Lq, Ev)
        return y.reshape(*batch, Lq, Ev), out_aux.lse.reshape(*batch, Lq)  # (..., Lq, Ev), (..., Lq)

    def _run_flex(self, q, k, v, score_mod, block_mask, call, aux):
        """(output, aux or None) of one flex_attention call on (B, N, L, ·) tensors."""
        with warnings.catch_warnings(), self._tracing():
            # compiled: running eagerly (dynamo gave up) must fail loudly, never pass as compiled
            warnings.filterwarnings("error" if self.compiled else "ignore", message=_EAGER_WARNING)
            y = self._flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=call.scale,
                             enable_gqa=call.enable_gqa, return_aux=aux)  # (B, N, Lq, Ev)
        return (y, None) if aux is None else y

    def _with_sinks(self, out, lse, sinks):
        """(O sigma(LSE - s_h), an aux whose lse is logaddexp(LSE, s_h)): the sink's closed form on
        flex's (B, N, Lq, Ev) output and float32 (B, N, Lq) LSE; N is the query heads."""
        torch = self.torch
        s = sinks.to(lse.dtype)[None, :, None]  # (1, N, 1)
        with_sink = torch.logaddexp(lse, s)  # (B, N, Lq)
        keep = torch.where(torch.isfinite(with_sink), torch.exp(lse - with_sink), torch.ones_like(lse))  # sigma
        out = (out.to(keep.dtype) * keep[..., None]).to(out.dtype)  # (B, N, Lq, Ev)
        return out, types.SimpleNamespace(lse=with_sink)

    def _flex(self):
        return self._fa.flex_attention

    def _tracing(self):
        """Eager flex_attention still traces its hooks through dynamo (backend "eager"), and dynamo
        specialises every size of 0 or 1: with the suite's small shapes nearly every call retraced
        (docs/measurements.md).  Size-oblivious tracing keeps one graph per
        structure; the graph run is the same eager math, so results are unchanged (the suite checks)."""
        return self.torch.fx.experimental._config.patch(backed_size_oblivious=True)

    def _mods(self, call, batch, B, H, Lq, Lk, device, dtype):
        """(score_mod, block_mask, uniform) for this call; the last call's are reused (benchmarks repeat one)."""
        if self._memo is not None and self._memo[0] is call and self._memo[1] == (B, H, Lq, Lk):
            return self._memo[2]
        if B * H * Lq == 0:  # no query row: nothing to score or hide (hooks would index empty tensors)
            return None, None, False
        if self.uniform_hooks and B * H * Lq * Lk <= self.UNIFORM_MAX_SCORES:
            mods = (*self._uniform_mods(call, batch, B, H, Lq, Lk, device, dtype), True)
        else:
            mods = (*self._specialised_mods(call, batch, B, H, Lq, Lk, device), False)
        self._memo = (call, (B, H, Lq, Lk), mods)
        return mods

    # Eager flex_attention traces its hooks through dynamo (backend "eager"), which retraces
    # whenever a hook's Python structure or constants change: hooks written per field (below) retraced
    # on most of the suite's calls (docs/measurements.md).  For small problems, where that
    # retrace is the whole cost, the eager backend writes every field as tensor data in one hook of
    # fixed structure - an absent field is its identity (bias 0, slope 0, no cap, every key visible),
    # exact in every dtype - and dynamo keeps a graph or two per dtype; what
    # the mask, lengths and segment ids hide is one boolean tensor its mask_mod reads.  Large
    # problems get the per-field hooks (no zero bias or all-True mask to read), and so does every
    # problem of the benchmarks, which switch uniform_hooks off: more ops under vmap cost a small
    # call more than the call.  tests/test_backends_variants.py checks that both give the same bits.
    uniform_hooks = True
    UNIFORM_MAX_SCORES = 1 << 20  # B * H * Lq * Lk up to which the uniform hooks are used

    def _uniform_mods(self, call, batch, B, H, Lq, Lk, device, dtype):
        torch = self.torch
        i32, i64 = dict(dtype=torch.int32, device=device), dict(dtype=torch.int64, device=device)
        wide = torch.float64 if dtype == torch.float64 else torch.float32  # the dtype alibi_slopes come in

        # every captured tensor of one dtype and row-major strides (even on size-1 axes, which
        # .contiguous() leaves as they are), given or absent: dynamo guards on dtypes and strides
        dense = torch.contiguous_format

        def per_head(x, absent, dtype):  # mask or bias (..., Lq, Lk) -> (B, H, Lq, Lk)
            x = torch.full((), absent, dtype=dtype, device=device) if x is None else x
            return x.expand(*batch, Lq, Lk).reshape(B, H, Lq, Lk).clone(memory_format=dense)

        def per_sequence(x, absent, *tail):  # lengths (...,) or segment ids (..., L) -> (B, ·)
            if x is None:
                return torch.full((B, *tail), absent, **i32)
            return x.expand(*batch[:-1], *tail).reshape(B, *tail).clone(memory_format=dense)

        bias = per_head(call.bias, 0.0, dtype)
        # what the mask, the lengths and the segment ids hide, as one tensor: each index a hook reads
        # costs a call time under flex's vmaps (seven reads cost twice what these three do)
        q_len, kv_len = per_sequence(call.q_lengths, Lq), per_sequence(call.kv_lengths, Lk)  # (B,)
        q_seg, kv_seg = per_sequence(call.q_segment_ids, 0, Lq), per_sequence(call.kv_segment_ids, 0, Lk)  # (B, L)
        q_pos, kv_pos = torch.arange(Lq, **i64)[:, None], torch.arange(Lk, **i64)  # (Lq, 1), (Lk,)
        keep = per_head(call.mask, True, torch.bool)  # (B, H, Lq, Lk)
        kv_start = per_sequence(call.kv_starts, 0)  # (B,) left padding: keys before it hidden
        keep = keep & (q_pos < q_len[:, None, None, None]) & (kv_pos < kv_len[:, None, None, None])
        keep = keep & (kv_pos >= kv_start[:, None, None, None])
        keep = (keep & (q_seg[:, None, :, None] == kv_seg[:, None, None, :])).clone(memory_format=dense)
        capped = torch.tensor(call.softcap is not None, device=device)
        # the scores' working precision (float64 only for float64): a float64 cap would promote them
        cap = torch.tensor(call.softcap if call.softcap is not None else 1.0, dtype=wide, device=device)
        slopes = call.alibi_slopes if call.alibi_slopes is not None else torch.zeros(H, dtype=wide, device=device)
        o = self._offsets(call, (q_len, kv_len, kv_start), B, Lq, Lk, i64)  # (B,) query 0's diagonal key
        unlimited = Lq + Lk  # a window side this wide hides no key
        left, right = call.window if call.window is not None else (None, None)
        left, right = (torch.tensor(unlimited if side is None else side, **i64) for side in (left, right))
        not_causal = torch.tensor(not call.is_causal, device=device)

        def score_mod(score, b, h, q_idx, kv_idx):  # score: already scaled
            score = torch.where(capped, torch.tanh(score / cap) * cap, score)
            score = score + bias[b, h, q_idx, kv_idx]
            return score - (slopes[h] * (q_idx + o[b] - kv_idx).abs()).to(score.dtype)

        def mask_mod(b, h, q_idx, kv_idx):
            d = q_idx + o[b]
            keep_pair = not_causal | (kv_idx <= d)
            keep_pair = keep_pair & (kv_idx <= d + right) & (kv_idx >= d - left)
            return keep_pair & keep[b, h, q_idx, kv_idx]

        # Every block partial (mask_mod decides each pair): a valid, conservative BlockMask, and all
        # eager flex reads of it - its dense math evaluates mask_mod at every pair.  create_block_mask
        # would vmap mask_mod over the grid first (a cost on every call) only to find the blocks.
        blocks = (-(-Lq // _BLOCK), -(-Lk // _BLOCK))
        kv_indices = torch.arange(blocks[1], **i32).expand(B, H, *blocks).clone(memory_format=dense)
        kv_count = torch.full((B, H, blocks[0]), blocks[1], **i32)
        return score_mod, self._fa.BlockMask.from_kv_blocks(kv_count, kv_indices, BLOCK_SIZE=_BLOCK,
                                                            mask_mod=mask_mod, seq_lengths=(Lq, Lk))

    def _offsets(self, call, lengths, B, Lq, Lk, i64):
        """(B,) int64: the key on query 0's diagonal - Lk - Lq bottom-right, else 0; with per-sequence
        positions kv_len_b - q_len_b bottom-right, kv_start_b top-left (specs.masks.sequence_offsets)."""
        torch = self.torch
        if call.positions != "per_sequence":
            return torch.full((B,), Lk - Lq if call.causal_alignment == "bottom_right" else 0, **i64)
        q_len, kv_len, kv_start = (x.to(torch.int64) for x in lengths)
        return (kv_len - q_len if call.causal_alignment == "bottom_right" else kv_start).clone()

    def _specialised_mods(self, call, batch, B, H, Lq, Lk, device):
        """Hooks with only the problem's fields: what a compiled kernel specialises on (block skipping)."""
        torch = self.torch

        def per_head(x):  # mask or bias (..., Lq, Lk) -> (B, H, Lq, Lk)
            return None if x is None else x.expand(*batch, Lq, Lk).reshape(B, H, Lq, Lk).contiguous()

        def per_sequence(x, *tail):  # lengths (...,) or segment ids (..., L) -> (B, ·)
            return None if x is None else x.expand(*batch[:-1], *tail).reshape(B, *tail)

        bias, mask = per_head(call.bias), per_head(call.mask)
        cap, slopes = call.softcap, call.alibi_slopes
        q_len, kv_len = per_sequence(call.q_lengths), per_sequence(call.kv_lengths)
        q_seg, kv_seg = per_sequence(call.q_segment_ids, Lq), per_sequence(call.kv_segment_ids, Lk)
        kv_start = per_sequence(call.kv_starts)
        o = Lk - Lq if call.causal_alignment == "bottom_right" else 0  # query i's diagonal is key i + o
        if call.positions == "per_sequence":  # one diagonal per sequence: o[b]
            i64 = dict(dtype=torch.int64, device=device)
            full = (torch.full((B,), n, **i64) if x is None else x for x, n in ((q_len, Lq), (kv_len, Lk), (kv_start, 0)))
            o = self._offsets(call, tuple(full), B, Lq, Lk, i64)  # (B,)
        per_b = not isinstance(o, int)
        left, right = call.window if call.window is not None else (None, None)
        causal = call.is_causal

        def score_mod(score, b, h, q_idx, kv_idx):  # score: already scaled
            if cap is not None:
                score = torch.tanh(score / cap) * cap
            if bias is not None:
                score = score + bias[b, h, q_idx, kv_idx]
            if slopes is not None:
                score = score - (slopes[h] * (q_idx + (o[b] if per_b else o) - kv_idx).abs()).to(score.dtype)
            return score

        def mask_mod(b, h, q_idx, kv_idx):
            keep = q_idx >= 0  # True, as a tensor
            o_b = o[b] if per_b else o
            if causal:
                keep = keep & (kv_idx <= q_idx + o_b)
            if right is not None:
                keep = keep & (kv_idx <= q_idx + o_b + right)
            if left is not None:
                keep = keep & (kv_idx >= q_idx + o_b - left)
            if kv_start is not None:
                keep = keep & (kv_idx >= kv_start[b])
            if mask is not None:
                keep = keep & mask[b, h, q_idx, kv_idx]
            if kv_len is not None:
                keep = keep & (kv_idx < kv_len[b])
            if q_len is not None:
                keep = keep & (q_idx < q_len[b])
            if q_seg is not None:
                keep = keep & (q_seg[b, q_idx] == kv_seg[b, kv_idx])
            return keep

        scored = cap is not None or bias is not None or slopes is not None
        per_batch = per_b or any(x is not None for x in (mask, q_len, kv_len, q_seg, kv_start))
        hides = causal or call.window is not None or per_batch
        block = (call.knobs or {}).get("block_size", _BLOCK)  # compiled flex's knob: its CPU kernel's tile
        size = {} if block == _BLOCK else {"BLOCK_SIZE": block}
        block_mask = self._fa.create_block_mask(mask_mod, B if per_batch else None, H if mask is not None else None,
                                                Lq, Lk, device=device, **size) if hides or size else None
        return (score_mod if scored else None, block_mask)


class TorchFlexCompiled(TorchFlex):
    """torch.compile(flex_attention): the fused CPU kernel users deploy; compiles per shape."""

    name = "torch-flex-compiled"
    compiled = True
    compiles_per_shape = True  # the suite gives it a bounded shape menu
    uniform_hooks = False  # one kernel per static field, as users write their hooks
    call_timeout = 300.0  # s: a first call compiles (docs/measurements.md), more on a loaded machine
    # Its tuning knob (issue 31: "compiled flex's kernel options are knobs"), measured on torch 2.13 CPU:
    # the CPU template (torch/_inductor/kernel/flex/flex_cpu.py) tiles by the BlockMask's BLOCK_SIZE - its
    # q and kv split sizes - so that is the knob: create_block_mask(..., BLOCK_SIZE=16) against flex's 128
    # (a full block mask where the problem hides nothing): not bitwise the same (block 32 on a causal 200-key
    # problem: 2.4e-7 apart), each within the reference; 16 cuts the shape menu's 17 and 129 keys into tiles
    # with a one-key tail.  kernel_options are no knob on this CPU: BLOCK_M/BLOCK_N and PRESCALE_QK
    # are the Triton (GPU) template's, PARTITION_SIZE is read by the CPU template's decoding path only, and
    # each - an unknown key too - was accepted and gave the default's output bit for bit (Lq = 200, and
    # PARTITION_SIZE 256/512 on a decode step against 1024 keys).  Two settings, each one more compile a static
    # configuration (the knobs family's compiles: docs/measurements.md).
    knobs = {"block_size": (_BLOCK, 16)}
    capabilities = Capabilities(dtypes=("float16", "bfloat16", "float32"), device="cpu", gradients=False,
                                features=_EVERY_FEATURE - {"lse"})
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left", padded_rows="zeros",
                          deviations=_DEVIATIONS,
                          notes=("torch.compile(flex_attention): the first call at a new shape, dtype or static "
                                 "field compiles (tens of seconds on a CPU)",
                                 "CPU: float16/bfloat16/float32 only, inference only, no LSE (torch 2.13)"))

    def load(self):
        super().load()
        if getattr(self, "_compiled_flex", None) is None:
            # dynamic=False: one compile per shape.  With dynamic shapes (dynamic=True, or the default
            # after a shape change) torch 2.13's CPU template fails to build when score_mod captures a
            # tensor in a closure (C++ error: 'cur_qSplitSize2' was not declared in this scope).
            self._compiled_flex = self.torch.compile(self._fa.flex_attention, dynamic=False)

    def _flex(self):
        return self._compiled_flex

    def _tracing(self):
        """dynamic=False: one kernel per shape, as users compile it - more than dynamo's 8 a function, so the
        recompile limits are raised around each call, in the thread that compiles: torch 2.13's dynamo config
        is per thread (ContextVars), and a limit set at `load` on pytest's thread left the suite's call thread
        at 8 - its 9th configuration ran flex eagerly (the knobs family's second block size reached it)."""
        config = self.torch._dynamo.config
        return config.patch(recompile_limit=max(config.recompile_limit, _RECOMPILE_LIMIT),
                            accumulated_recompile_limit=max(config.accumulated_recompile_limit, _RECOMPILE_LIMIT))
