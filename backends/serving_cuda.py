"""CUDA serving kernels at the format hooks (issue 30): PyTorch's varlen_attn, flash-attention, FlashInfer.

- ``torch-varlen-cuda``: ``torch.nn.attention.varlen.varlen_attn`` - packed (``cu_seq_q/k``, ``seqused_k``)
  and paged-NHD (``block_table`` with ``seqused_k``, queries packed).  It calls
  ``aten._flash_attention_forward``, which has no CPU kernel (torch 2.13 CPU: NotImplementedError
  "Could not run 'aten::_flash_attention_forward' with arguments from the 'CPU' backend"), so it is CUDA only.
  Causal is ``window_size=(-1, 0)``; no softcap or ALiBi; LSE (T_q, H_q).
- ``flash-attn-varlen-cuda`` / ``flash-attn-kvcache-cuda``: the ``flash_attn`` package's
  ``flash_attn_varlen_func`` (packed) and ``flash_attn_with_kvcache`` (paged-NHD and append, ``k=``/``v=``
  written in place at ``cache_seqlens``; FA2 documents "page_block_size must be a multiple of 256").
- ``flashinfer-prefill-cuda`` / ``flashinfer-decode-cuda``: FlashInfer's ragged and paged prefill wrappers
  and its paged decode wrapper (one query a sequence), NHD and HND, block tables converted to
  ``paged_kv_indptr``/``paged_kv_indices``/``paged_kv_last_page_len`` by `specs.indptr`; its LSE is base 2
  (multiplied by ln 2 here).

Each imports its package in ``load``: without it, or without a GPU, ``availability()`` is False with the
reason and the suite skips every check.  All align causal and windows bottom-right per sequence.
What each declares is what the anchors document, not yet measured: tools/gpu_check.sh runs them.
"""
from __future__ import annotations

import importlib
import math

import numpy as np

from attnspec.backends.base import BackendUnavailable, Capabilities, Semantics, Unsupported
from attnspec.backends.torch_backends import TorchBackend, _import_torch

_HALF = ("float16", "bfloat16")
_BASE = frozenset({"gqa", "seq_lengths", "seq_positions", "lse", "window"})
_NOTE = "declared from the library's documentation, not yet run here (tools/gpu_check.sh runs it on a GPU)"


def _window(call) -> tuple:
    """flash-attention's window_size (left, right), -1 unbounded; under causal, right = 0 (what causal leaves)."""
    left, right = (None, None) if call.window is None else call.window
    right = 0 if call.is_causal else right
    return -1 if left is None else int(left), -1 if right is None else int(right)


class _ServingCuda(TorchBackend):
    device = "cuda"
    package = ""  # the module imported in load; "" - torch's own
    semantics = Semantics(fully_masked="zeros", causal_alignment="bottom_right", notes=(_NOTE,))

    def load(self):
        self.torch = _import_torch()
        if self.package:
            try:
                self.lib = importlib.import_module(self.package)
            except ImportError as e:
                raise BackendUnavailable(f"{self.package} is not installed ({e})") from None
        if not self.torch.cuda.is_available():
            raise BackendUnavailable("no CUDA device")

    def _attention(self, q, k, v, call):
        raise Unsupported(f"{self.name} takes no padded call")

    def _q_rows(self, q, call):
        """A paged call's queries (B, Hq, Lq, E) packed: ((total_q, Hq, E), cu_seqlens_q (B+1,) int32, lengths)."""
        torch, (B, _, Lq, _) = self.torch, q.shape
        lens = [Lq] * B if call.q_lengths is None else [int(x) for x in call.q_lengths.tolist()]
        rows = torch.cat([q[b, :, :lens[b]].transpose(0, 1) for b in range(B)])  # (total_q, Hq, E)
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=q.device)  # (B+1,)
        return rows.contiguous(), cu, lens

    def _rows_back(self, out, lens, Lq):
        """(total_q, Hq, Ev) -> (B, Hq, Lq, Ev), padded query rows zeros."""
        full = out.new_zeros((len(lens), out.shape[1], Lq, out.shape[2]))  # (B, Hq, Lq, Ev)
        at = 0
        for b, n in enumerate(lens):
            full[b, :, :n] = out[at:at + n].transpose(0, 1)
            at += n
        return full

    def _lse_back(self, lse, lens, Lq):
        """(Hq, total_q) -> (B, Hq, Lq), padded rows -inf."""
        full = self._rows_back(lse.transpose(0, 1)[..., None].float(), lens, Lq)[..., 0]
        rows = self.torch.arange(Lq, device=lse.device)[None, :] < self.torch.tensor(lens, device=lse.device)[:, None]
        return full.masked_fill(~rows[:, None], float("-inf"))


class TorchVarlenCuda(_ServingCuda):
    name = "torch-varlen-cuda"
    capabilities = Capabilities(dtypes=_HALF, device="cuda", masks=False, equal_head_dims=True, head_dim_multiple=8,
                                max_head_dim=256, features=_BASE, formats=("packed", "paged-NHD"))

    def load(self):
        super().load()
        try:
            from torch.nn.attention.varlen import AuxRequest, varlen_attn
        except ImportError as e:
            raise BackendUnavailable(f"this torch has no torch.nn.attention.varlen ({e})") from None
        self._varlen, self._aux = varlen_attn, AuxRequest

    def _run(self, q, k, v, cu_q, cu_k, max_q, max_k, call, **kw):
        y = self._varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale=call.scale, window_size=_window(call),
                         enable_gqa=q.shape[1] != k.shape[-2], return_aux=self._aux(lse=True) if call.return_lse else None,
                         **kw)
        return (y[0], y[1].transpose(0, 1)) if call.return_lse else y  # (T_q, Hq, Ev), lse (Hq, T_q)

    def native_packed(self, q, k, v, args, call):
        kw = {} if args.seqused_k is None else {"seqused_k": args.seqused_k}
        return self._run(q, k, v, args.cu_seqlens_q, args.cu_seqlens_k, args.max_seqlen_q, args.max_seqlen_k, call, **kw)

    def native_paged(self, q, k_cache, v_cache, args, call):
        if args.cache_leftpad is not None:
            raise Unsupported(f"{self.name}: varlen_attn has no cache_leftpad")
        rows, cu_q, lens = self._q_rows(q, call)
        max_k = int(args.cache_seqlens.max()) if args.cache_seqlens.numel() else 0
        y = self._run(rows, k_cache, v_cache, cu_q, None, max(lens, default=0), max_k, call,
                      seqused_k=args.cache_seqlens, block_table=args.block_table)
        out, lse = y if call.return_lse else (y, None)
        full = self._rows_back(out, lens, q.shape[2])
        return (full, self._lse_back(lse, lens, q.shape[2])) if call.return_lse else full


class _FlashAttn(_ServingCuda):
    package = "flash_attn"

    def _options(self, call) -> dict:
        kw = {"softmax_scale": call.scale, "causal": bool(call.is_causal), "window_size": _window(call)}
        if call.softcap is not None:
            kw["softcap"] = float(call.softcap)
        if call.alibi_slopes is not None:
            kw["alibi_slopes"] = call.alibi_slopes.float()
        return kw


class FlashAttnVarlenCuda(_FlashAttn):
    name = "flash-attn-varlen-cuda"
    capabilities = Capabilities(dtypes=_HALF, device="cuda", masks=False, equal_head_dims=True, head_dim_multiple=8,
                                max_head_dim=256, features=_BASE | {"softcap", "alibi"}, formats=("packed",))

    def native_packed(self, q, k, v, args, call):
        kw = dict(self._options(call), return_attn_probs=bool(call.return_lse))
        if args.seqused_k is not None:  # FA3's varlen has seqused_k, FA2's does not
            kw["seqused_k"] = args.seqused_k
        y = self.lib.flash_attn_varlen_func(q, k, v, args.cu_seqlens_q, args.cu_seqlens_k, args.max_seqlen_q,
                                            args.max_seqlen_k, **kw)
        return (y[0], y[1]) if call.return_lse else y  # (total_q, Hq, Ev), lse (Hq, total_q)


class FlashAttnKvcacheCuda(_FlashAttn):
    name = "flash-attn-kvcache-cuda"
    capabilities = Capabilities(dtypes=_HALF, device="cuda", masks=False, equal_head_dims=True, head_dim_multiple=8,
                                max_head_dim=256, features=_BASE | {"softcap", "alibi"},
                                formats=("paged-NHD", "append"))
    _new_keys: dict = {}

    def native_paged_append(self, q, k_cache, v_cache, k_new, v_new, args, call):
        self._new_keys = {"k": k_new, "v": v_new}  # (B, n, Hkv, D): written in place at cache_seqlens
        try:
            return self.native_paged(q, k_cache, v_cache, args, call)
        finally:
            self._new_keys = {}

    def native_paged(self, q, k_cache, v_cache, args, call):
        if call.q_lengths is not None:
            raise Unsupported(f"{self.name}: flash_attn_with_kvcache takes every query row as real (no query lengths)")
        if args.page_size % 256:
            raise Unsupported(f"{self.name}: FA2 documents 'page_block_size must be a multiple of 256' "
                              f"(asked: {args.page_size})")
        kw = dict(self._options(call), cache_seqlens=args.cache_seqlens, block_table=args.block_table,
                  return_softmax_lse=bool(call.return_lse), **self._new_keys)
        if args.cache_leftpad is not None:
            kw["cache_leftpad"] = args.cache_leftpad
        y = self.lib.flash_attn_with_kvcache(q.transpose(1, 2).contiguous(), k_cache, v_cache, **kw)  # q (B, Lq, Hq, E)
        if call.return_lse:
            return y[0].transpose(1, 2), y[1]  # (B, Hq, Lq, Ev), (B, Hq, Lq)
        return y.transpose(1, 2)


class _FlashInfer(_ServingCuda):
    package = "flashinfer"
    capabilities = Capabilities(dtypes=_HALF, device="cuda", masks=False, equal_head_dims=True,
                                head_dims=(64, 128, 256), features=_BASE | {"softcap"},
                                formats=("packed", "paged-NHD", "paged-HND"))

    def _workspace(self):
        if getattr(self, "_ws", None) is None:
            self._ws = self.torch.empty(128 << 20, dtype=self.torch.uint8, device=self.device)  # FlashInfer's example
        return self._ws

    def _plan_kw(self, q, call) -> dict:
        left, right = _window(call)
        if right != -1 and not call.is_causal:
            raise Unsupported(f"{self.name}: FlashInfer's window is window_left only (asked right={right})")
        return dict(causal=bool(call.is_causal), sm_scale=q.shape[-1] ** -0.5 if call.scale is None else call.scale,
                    window_left=left, logits_soft_cap=float(call.softcap or 0.0), q_data_type=q.dtype)

    def _pages(self, args, B):
        """paged_kv_indptr, _indices, _last_page_len on the device (specs.indptr)."""
        from attnspec.specs.indptr import paged_indptr
        if args.cache_leftpad is not None:
            raise Unsupported(f"{self.name}: FlashInfer has no cache_leftpad")
        arrays = paged_indptr(args.block_table.cpu().numpy(), args.cache_seqlens.cpu().numpy(), args.page_size)
        return [self.torch.from_numpy(a).to(self.device) for a in arrays]

    def _lse(self, lse):
        return lse * math.log(2.0)  # FlashInfer's log2-sum-exp2 in natural log


class FlashInferPrefillCuda(_FlashInfer):
    name = "flashinfer-prefill-cuda"

    def native_packed(self, q, k, v, args, call):
        if args.seqused_k is not None:
            raise Unsupported(f"{self.name}: the ragged wrapper has no seqused_k")
        w = self.lib.prefill.BatchPrefillWithRaggedKVCacheWrapper(self._workspace(), "NHD")
        w.plan(args.cu_seqlens_q, args.cu_seqlens_k, q.shape[1], k.shape[1], q.shape[2], **self._plan_kw(q, call))
        y = w.run(q, k, v, return_lse=bool(call.return_lse))
        return (y[0], self._lse(y[1]).transpose(0, 1)) if call.return_lse else y  # lse (total_q, Hq) -> (Hq, total_q)

    def native_paged(self, q, k_cache, v_cache, args, call):
        rows, cu_q, lens = self._q_rows(q, call)
        Hkv = k_cache.shape[2 if args.layout == "NHD" else 1]
        w = self.lib.prefill.BatchPrefillWithPagedKVCacheWrapper(self._workspace(), args.layout)
        w.plan(cu_q, *self._pages(args, q.shape[0]), q.shape[1], Hkv, q.shape[-1], args.page_size, **self._plan_kw(q, call))
        y = w.run(rows, (k_cache, v_cache), return_lse=bool(call.return_lse))
        out, lse = y if call.return_lse else (y, None)
        full = self._rows_back(out, lens, q.shape[2])
        return (full, self._lse_back(self._lse(lse).transpose(0, 1), lens, q.shape[2])) if call.return_lse else full


class FlashInferDecodeCuda(_FlashInfer):
    name = "flashinfer-decode-cuda"
    capabilities = Capabilities(dtypes=_HALF, device="cuda", masks=False, equal_head_dims=True,
                                head_dims=(64, 128, 256), features=_BASE | {"softcap"},
                                formats=("paged-NHD", "paged-HND"))

    def native_paged(self, q, k_cache, v_cache, args, call):
        if q.shape[2] != 1:
            raise Unsupported(f"{self.name}: the decode wrapper takes one query a sequence (asked Lq={q.shape[2]})")
        kw = self._plan_kw(q, call)
        del kw["causal"], kw["q_data_type"]  # one query after its keys (bottom-right): causal hides nothing
        Hkv = k_cache.shape[2 if args.layout == "NHD" else 1]
        w = self.lib.decode.BatchDecodeWithPagedKVCacheWrapper(self._workspace(), args.layout)
        w.plan(*self._pages(args, q.shape[0]), q.shape[1], Hkv, q.shape[-1], args.page_size, q_data_type=q.dtype, **kw)
        y = w.run(q[:, :, 0].contiguous(), (k_cache, v_cache), return_lse=bool(call.return_lse))  # q (B, Hq, E)
        if call.return_lse:
            return y[0][:, :, None], self._lse(y[1])[:, :, None].float()  # (B, Hq, 1, Ev), (B, Hq, 1)
        return y[:, :, None]
