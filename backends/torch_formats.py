"""torch-math's packed and paged calls (backends/serving.py's hooks), by its own gather in torch.

The packed sequences (or the pages a block table names) are copied with torch indexing into a
padded batch with per-sequence lengths and positions, then torch-math's padded kernel runs; the
output goes back onto the token axis.  Nothing is gathered through NumPy or `specs`: a slip in the
index arithmetic here is torch-math's, and the packed and paged families judge it.
"""
from __future__ import annotations

from dataclasses import replace


def _extents(torch, args) -> tuple:
    """(cu_q, cu_k, used_k) as Python ints: sequence b's rows and keys on the token axes."""
    cu_q = args.cu_seqlens_q.to(torch.int64).tolist()
    cu_k = args.cu_seqlens_k.to(torch.int64).tolist()
    used = [b - a for a, b in zip(cu_k[:-1], cu_k[1:], strict=True)] if args.seqused_k is None else \
        args.seqused_k.to(torch.int64).tolist()
    return cu_q, cu_k, used


def _gathered(self, q, k, v, args, call) -> tuple:
    """(qp, kp, vp, padded call, cu_q): the packed sequences copied into a padded batch with torch
    indexing (autograd follows the copies), lengths and positions per sequence."""
    torch = self.torch
    cu_q, cu_k, used = _extents(torch, args)
    B, Hq, Hkv = len(cu_q) - 1, q.shape[1], k.shape[1]
    qp = q.new_zeros((B, Hq, args.max_seqlen_q, q.shape[2]))  # (B, Hq, Lq, E)
    kp = k.new_zeros((B, Hkv, args.max_seqlen_k, k.shape[2]))  # (B, Hkv, Lk, E)
    vp = v.new_zeros((B, Hkv, args.max_seqlen_k, v.shape[2]))  # (B, Hkv, Lk, Ev)
    for b in range(B):
        nq, nk = cu_q[b + 1] - cu_q[b], used[b]
        qp[b, :, :nq] = q[cu_q[b]:cu_q[b + 1]].transpose(0, 1)  # (Hq, n_q, E)
        kp[b, :, :nk] = k[cu_k[b]:cu_k[b] + nk].transpose(0, 1)  # (Hkv, n_k, E)
        vp[b, :, :nk] = v[cu_k[b]:cu_k[b] + nk].transpose(0, 1)  # (Hkv, n_k, Ev)
    i32 = dict(dtype=torch.int32, device=q.device)
    q_lengths = torch.tensor([cu_q[b + 1] - cu_q[b] for b in range(B)], **i32)
    padded = replace(call, positions="per_sequence", q_lengths=q_lengths, kv_lengths=torch.tensor(used, **i32),
                     kv_starts=None)
    return qp, kp, vp, padded, cu_q


def _on_tokens(x, cu_q: list, total_q: int):
    """(B, Hq, Lq, D) per-sequence rows back onto the token axis: (total_q, Hq, D), zeros past the sequences."""
    rows = x.new_zeros((total_q, x.shape[1], x.shape[-1]))  # (total_q, Hq, D)
    for b in range(len(cu_q) - 1):
        rows[cu_q[b]:cu_q[b + 1]] = x[b, :, :cu_q[b + 1] - cu_q[b]].transpose(0, 1)  # (n_q, Hq, D)
    return rows


def gathered_packed(self, q, k, v, args, call):
    """q (total_q, Hq, E), k/v (total_k, Hkv, D) -> (total_q, Hq, Ev) [, lse (Hq, total_q)]; rows no
    sequence owns are zeros (their LSE -inf)."""
    qp, kp, vp, padded, cu_q = _gathered(self, q, k, v, args, call)
    y = self.native_attention(qp, kp, vp, padded)
    out, lse = y if call.return_lse else (y, None)  # (B, Hq, Lq, Ev), (B, Hq, Lq)
    rows = _on_tokens(out, cu_q, q.shape[0])  # (total_q, Hq, Ev)
    if lse is None:
        return rows
    lse = _on_tokens(lse[..., None], cu_q, q.shape[0])[..., 0]  # (total_q, Hq)
    unowned = self.torch.arange(q.shape[0], device=q.device) >= cu_q[-1]  # (total_q,)
    return rows, lse.masked_fill(unowned[:, None], float("-inf")).transpose(0, 1)  # (Hq, total_q)


def gathered_packed_backward(self, q, k, v, grad_out, args, call):
    """The packed call's (dq, dk, dv) through autograd over the same gather: tokens no sequence owns get
    exactly 0 (nothing was read from them)."""
    torch = self.torch
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    qp, kp, vp, padded, cu_q = _gathered(self, *leaves, args, call)
    out = self._attention(qp, kp, vp, replace(padded, return_lse=False))  # (B, Hq, Lq, Ev)
    rows = _on_tokens(out, cu_q, q.shape[0])  # (total_q, Hq, Ev)
    return torch.autograd.grad(rows, leaves, grad_out)


def gathered_paged(self, q, k_cache, v_cache, args, call):
    """q (B, Hq, Lq, E), caches (pages, P, Hkv, D) NHD or (pages, Hkv, P, D) HND -> (B, Hq, Lq, Ev)
    [, lse]: key j of sequence b read from page block_table[b, j // P], slot j % P.  A stacked layout's
    one tensor (pages, 2, ...) is read through its K and V halves (torch views)."""
    torch = self.torch
    if args.layout.startswith("stacked-"):
        k_cache, v_cache = k_cache[:, 0], k_cache[:, 1]  # (pages, P, Hkv, E) or (pages, Hkv, P, E) each
    kc, vc = (x if args.layout.endswith("NHD") else x.transpose(1, 2) for x in (k_cache, v_cache))  # (pages, P, Hkv, D)
    P = kc.shape[1]
    lens = args.cache_seqlens.to(torch.int64)  # (B,)
    table = args.block_table.to(torch.int64)  # (B, max_pages)
    Lk = int(lens.max()) if lens.numel() else 0
    j = torch.arange(Lk, device=q.device)  # (Lk,)
    inside = j[None, :] < lens[:, None]  # (B, Lk)
    cols = torch.clamp(j // P, max=table.shape[1] - 1)  # (Lk,) a slot past a sequence reads no column
    page = torch.where(inside, table[:, cols], torch.zeros_like(table[:, cols]))  # (B, Lk)
    k, v = kc[page, j % P], vc[page, j % P]  # (B, Lk, Hkv, D)
    k, v = (torch.where(inside[..., None, None], x, torch.zeros_like(x)).transpose(1, 2) for x in (k, v))  # (B, Hkv, Lk, D)
    starts = None if args.cache_leftpad is None else args.cache_leftpad.to(torch.int32)
    return self.native_attention(q, k, v, replace(call, positions="per_sequence", kv_lengths=lens.to(torch.int32),
                                                  kv_starts=starts))
