"""torch-flex's packed call (backends/serving.py's hook): the sequences as document masks, natively.

The concatenated tokens run as ONE flex_attention call - q ``(1, Hq, total_q, E)``, k/v
``(1, Hkv, total_k, ·)`` - whose ``mask_mod`` keeps a pair only when query and key belong to the
same sequence (document ids from ``cu_seqlens``) and the per-sequence causal/window rule holds at
positions counted within the sequence (query i of sequence b on key i + o_b, o_b = kv_used_b -
q_len_b bottom-right, 0 top-left); ``score_mod`` applies the softcap and ALiBi at the same
positions.  Nothing is gathered into a padded batch.  Tokens no sequence owns (past
``cu_seqlens[-1]``, past ``seqused_k``) are zeroed first: eager flex multiplies hidden keys' zero
weights with their values, and 0 * NaN would reach the rows (the padded call's deviation).

Paged KV is not taken (measured on torch 2.13 CPU): ``torch.nn.attention.experimental.
_paged_attention.PagedAttention`` runs there - eager flex_attention over its (1, Hkv, n_pages * P, E)
cache with ``convert_logical_block_mask`` and ``get_score_mod`` matches the contiguous call
(2.4e-7, float32) - but its mask_mod only hides the keys of unused pages and eager flex still
multiplies their zero weights with the values: NaN in an unused page reaches every row (0 * NaN),
which the paged family's isolation property rejects, and its page table maps a physical page to
one logical page per sequence only (no page shared read-only at two positions).
"""
from __future__ import annotations

_BLOCK = 128  # flex_attention's default block size


def _documents(torch, cu, total: int, used=None):
    """(doc, pos): each token's sequence (-1 where none owns it) and its position within it, (total,) int64."""
    t = torch.arange(total, dtype=torch.int64, device=cu.device)  # (total,)
    B = cu.numel() - 1
    doc = torch.searchsorted(cu[1:], t, right=True)  # (total,) b with cu[b] <= t < cu[b+1]; B past the end
    b = doc.clamp(max=max(B - 1, 0))
    pos = t - cu[b] if B else t  # (total,)
    span = (cu[1:] - cu[:-1]) if used is None else used  # (B,) tokens a sequence reads
    owned = (t >= cu[0]) & (doc < B) & (pos < span[b] if B else t < 0)  # (total,)
    return torch.where(owned, doc, torch.full_like(doc, -1)), pos, owned


def flex_packed(self, q, k, v, args, call):
    """q (total_q, Hq, E), k/v (total_k, Hkv, D) -> (total_q, Hq, Ev) [, lse (Hq, total_q)]; rows no
    sequence owns, and rows that see no key, are zeros (their LSE -inf)."""
    torch = self.torch
    i64 = dict(dtype=torch.int64, device=q.device)
    cu_q, cu_k = args.cu_seqlens_q.to(torch.int64), args.cu_seqlens_k.to(torch.int64)  # (B+1,)
    used = None if args.seqused_k is None else args.seqused_k.to(torch.int64)  # (B,)
    (total_q, Hq, _), total_k, Ev = q.shape, k.shape[0], v.shape[-1]
    doc_q, pos_q, owned_q = _documents(torch, cu_q, total_q)
    doc_k, pos_k, owned_k = _documents(torch, cu_k, total_k, used)
    out = q.new_zeros((total_q, Hq, Ev))  # (total_q, Hq, Ev)
    lse = torch.full((Hq, total_q), float("-inf"), dtype=torch.float32 if q.dtype != torch.float64 else q.dtype,
                     device=q.device)  # (Hq, total_q)
    if total_q == 0 or not bool(owned_k.any()):  # no key read: every row sees nothing (flex raises at Lk = 0)
        if call.sinks is not None:  # an empty row's LSE is its head's sink
            lse = torch.where(owned_q[None, :], call.sinks.to(lse.dtype)[:, None], lse)  # (Hq, total_q)
        return (out, lse) if call.return_lse else out
    doc_k = torch.where(owned_k, doc_k, torch.full_like(doc_k, -2))  # never equal to an unowned query's -1
    q_len, kv_len = cu_q[1:] - cu_q[:-1], (cu_k[1:] - cu_k[:-1]) if used is None else used  # (B,)
    o = kv_len - q_len if call.causal_alignment == "bottom_right" else torch.zeros_like(q_len)  # (B,)
    diag = pos_q + o[doc_q.clamp(min=0)]  # (total_q,) query's diagonal key, within its sequence
    # tokens nothing may read zeroed: a hidden key's zero weight still multiplies its value
    q, k, v = (torch.where(m[:, None, None], x, torch.zeros_like(x)) for m, x in
               ((owned_q, q), (owned_k, k), (owned_k, v)))
    q, k, v = (x.permute(1, 0, 2)[None].clone(memory_format=torch.contiguous_format) for x in (q, k, v))  # (1, H, T, ·)

    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    capped = torch.tensor(call.softcap is not None, device=q.device)
    cap = torch.tensor(call.softcap if call.softcap is not None else 1.0, dtype=wide, device=q.device)
    slopes = call.alibi_slopes if call.alibi_slopes is not None else torch.zeros(Hq, dtype=wide, device=q.device)
    unlimited = total_q + total_k  # a window side this wide hides no key
    left, right = call.window if call.window is not None else (None, None)
    left, right = (torch.tensor(unlimited if side is None else side, **i64) for side in (left, right))
    not_causal = torch.tensor(not call.is_causal, device=q.device)

    # every field as tensor data in hooks of one structure (as the padded call's uniform hooks): dynamo
    # retraces on a hook's structure or constants, not on the tensors it reads
    def score_mod(score, b, h, q_idx, kv_idx):  # score: already scaled
        score = torch.where(capped, torch.tanh(score / cap) * cap, score)
        return score - (slopes[h] * (diag[q_idx] - pos_k[kv_idx]).abs()).to(score.dtype)

    def mask_mod(b, h, q_idx, kv_idx):
        d, j = diag[q_idx], pos_k[kv_idx]
        keep = (doc_q[q_idx] == doc_k[kv_idx]) & (not_causal | (j <= d))
        return keep & (j <= d + right) & (j >= d - left)

    # every block partial: mask_mod decides each pair (eager flex evaluates it densely anyway)
    blocks = (-(-total_q // _BLOCK), -(-total_k // _BLOCK))
    kv_indices = torch.arange(blocks[1], dtype=torch.int32, device=q.device).expand(1, 1, *blocks).contiguous()
    kv_count = torch.full((1, 1, blocks[0]), blocks[1], dtype=torch.int32, device=q.device)
    block_mask = self._fa.BlockMask.from_kv_blocks(kv_count, kv_indices, BLOCK_SIZE=_BLOCK, mask_mod=mask_mod,
                                                   seq_lengths=(total_q, total_k))
    y, aux = self._run_flex(q, k, v, score_mod, block_mask, call, self._fa.AuxRequest(lse=True))
    if call.sinks is not None:  # the sink's closed form on flex's own LSE, as the padded call
        y, aux = self._with_sinks(y, aux.lse, call.sinks)  # (1, Hq, total_q, Ev)
    rows = y[0].permute(1, 0, 2)  # (total_q, Hq, Ev)
    out = torch.where(owned_q[:, None, None], rows, torch.zeros_like(rows))  # (total_q, Hq, Ev)
    if not call.return_lse:
        return out
    return out, torch.where(owned_q[None, :], aux.lse[0].to(lse.dtype), lse)  # (Hq, total_q)
