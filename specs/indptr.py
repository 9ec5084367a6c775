"""FlashInfer's names for packed and paged calls: CSR ``indptr`` arrays instead of cu_seqlens and tables.

FlashInfer's ragged and paged wrappers (``flashinfer.prefill.BatchPrefillWith{Ragged,Paged}KVCacheWrapper``,
``flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper``) take

- ``qo_indptr (B+1,)``: sequence b's query rows are ``[qo_indptr[b], qo_indptr[b+1])`` - the same array as
  flash-attention's ``cu_seqlens_q`` (and ``kv_indptr`` of the ragged wrapper is ``cu_seqlens_k``);
- ``paged_kv_indptr (B+1,)``: sequence b's pages are ``paged_kv_indices[paged_kv_indptr[b]:paged_kv_indptr[b+1]]``
  (a CSR row of the block table, only the pages it reads);
- ``paged_kv_last_page_len (B,)``: the keys in its last page, ``1 <= last <= page_size`` for a sequence with
  pages; FlashInfer's kv_len is ``page_size * (num_pages - 1) + last_page_len`` (0 for a sequence with no
  page: FlashInfer's ``paged_kv_t::get_length``, docs' "1 <= kv_last_page_len <= page_size").

So ``last_page_len = (cache_seqlens - 1) % page_size + 1`` where ``cache_seqlens > 0``, 0 where it is 0.
FlashInfer has no ``cache_leftpad``.  A last_page_len above the page size was once accepted by FlashInfer
(flashinfer-ai/flashinfer#320); `validate_indptr` refuses it.  Only NumPy here.
"""
from __future__ import annotations

import numpy as np


def _ints(name: str, x, ndim: int) -> np.ndarray:
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.integer) or a.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-d integer array; got {a.dtype} {a.shape}")
    return a.astype(np.int64)


def paged_indptr(block_table, cache_seqlens, page_size: int) -> tuple:
    """(paged_kv_indptr (B+1,), paged_kv_indices (total_pages,), paged_kv_last_page_len (B,)), int32 each,
    of a flash-attention block table (B, max_pages) and cache_seqlens (B,)."""
    table, lens = _ints("block_table", block_table, 2), _ints("cache_seqlens", cache_seqlens, 1)
    if isinstance(page_size, bool) or not isinstance(page_size, (int, np.integer)) or page_size < 1:
        raise ValueError(f"page_size must be a positive int; got {page_size!r}")
    if lens.shape != table.shape[:1] or (lens < 0).any():
        raise ValueError(f"cache_seqlens must be (B,) = ({table.shape[0]},) non-negative; got {lens.tolist()}")
    pages = -(-lens // page_size)  # (B,) pages each sequence reads
    if (pages > table.shape[1]).any():
        raise ValueError(f"block_table of {table.shape[1]} pages of {page_size} is too short for cache_seqlens "
                         f"{lens.tolist()}")
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = np.concatenate([table[b, :pages[b]] for b in range(len(lens))] + [np.zeros(0, np.int64)])
    last = np.where(lens > 0, (lens - 1) % page_size + 1, 0).astype(np.int32)
    return indptr, indices.astype(np.int32), last


def validate_indptr(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, page_size: int,
                    num_pages: int) -> np.ndarray:
    """Each sequence's kv_len (B,) int64; ValueError naming the argument for CSR pages that are not a cache."""
    indptr = _ints("paged_kv_indptr", paged_kv_indptr, 1)
    indices = _ints("paged_kv_indices", paged_kv_indices, 1)
    last = _ints("paged_kv_last_page_len", paged_kv_last_page_len, 1)
    if indptr.size < 1 or indptr[0] != 0 or (np.diff(indptr) < 0).any() or indptr[-1] > indices.size:
        raise ValueError(f"paged_kv_indptr must start at 0, never decrease and end within the "
                         f"{indices.size} indices; got {indptr.tolist()}")
    counts = np.diff(indptr)  # (B,) pages of each sequence
    if last.shape != counts.shape:
        raise ValueError(f"paged_kv_last_page_len must be (B,) = ({counts.size},); got {last.shape}")
    bad = (counts > 0) & ((last < 1) | (last > page_size)) | (counts == 0) & (last != 0)
    if bad.any():
        raise ValueError(f"paged_kv_last_page_len must be in [1, page_size={page_size}] for a sequence with pages "
                         f"(0 without); got {last.tolist()}")
    used = indices[:indptr[-1]]
    if ((used < 0) | (used >= num_pages)).any():
        raise ValueError(f"paged_kv_indices holds a page id outside the pool [0, {num_pages}): "
                         f"{used[(used < 0) | (used >= num_pages)].tolist()}")
    return np.where(counts > 0, page_size * (counts - 1) + last, 0)


def block_table_of(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, page_size: int, num_pages: int) -> tuple:
    """The inverse: (block_table (B, max_pages) int32, cache_seqlens (B,) int32); unused columns page 0."""
    lens = validate_indptr(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, page_size, num_pages)
    indptr, indices = np.asarray(paged_kv_indptr, np.int64), np.asarray(paged_kv_indices, np.int64)
    counts = np.diff(indptr)
    table = np.zeros((counts.size, max(int(counts.max(initial=0)), 1)), np.int32)  # (B, max_pages)
    for b in range(counts.size):
        table[b, :counts[b]] = indices[indptr[b]:indptr[b + 1]]
    return table, lens.astype(np.int32)
