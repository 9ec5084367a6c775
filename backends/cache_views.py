"""Paged caches handed as strided views of larger storage, as serving engines hand them.

A kernel that reads its cache with the strides of a dense tensor (page p at p * P * Hkv * E) reads another
page, the other half or padding wherever the cache is a view: FlashInfer's K and V are the two halves of
one ``(num_pages, 2, P, Hkv, E)`` pool (``kv_cache[:, 0]``), as are vLLM's in a blocks-first allocation
(hybrid attention+Mamba models), MLA's latent and rope parts are slices of one cache row, and a framework
hands an NHD view of HND storage (a ``transpose``) without copying (ROCm/aiter#3498; an append's writes:
flashinfer-ai/flashinfer#527); vLLM pads a hybrid model's attention pages to a common size, so a page
stride need not be a whole number of slots (vllm-project/vllm-xpu-kernels#303).  The storage is built in
NumPy, made native once, and cut natively (basic indexing, ``swapaxes`` and a ``reshape`` that splits a
dense axis, which NumPy, torch and JAX arrays all have), so a torch kernel on a GPU receives
the view itself, not a contiguous copy of it.  JAX arrays have no strides to get wrong: a view there is a
copy, and the call is an ordinary one.
"""
from __future__ import annotations

import numpy as np

from attnspec.specs import formats as Fm

# "pool_halves": K and V the halves of one (pages, 2, ...) pool (separate layouts with Ev == E only);
# "wider_rows": each head's row inside one PADDING wider, NaN in the rest (K's row at the start, V's at
# the end: a storage offset ignored reads NaN); "transposed_storage": the declared layout a view of the other
# one's storage (NHD of HND, HND of NHD: a real view only where P > 1 and Hkv > 1); "padded_pages": each page
# followed by PADDING elements of NaN, rows dense inside it (vLLM's page_size_padded, which evens out the
# page sizes of a hybrid model's layers: a page stride that need not be a whole number of slots)
CACHE_VIEWS = ("pool_halves", "wider_rows", "transposed_storage", "padded_pages")
# elements: a row or page stride no dense one equals, 16-byte aligned rows and pages kept (fp8's vector
# loads); a page stride a whole number of slots only where a page's second axis holds 1, 2, 4, 8 or 16
PADDING = 16


def views_for(layout: str, page_size: int, kv_heads: int, E: int, Ev: int) -> tuple:
    """The views a cache in `layout` can be handed as, each of them strided (pool_halves needs separate
    caches of one head dim; transposing pages of one slot or one KV head changes no stride)."""
    stacked = Fm.split_layout(layout)[0]
    return tuple(v for v in CACHE_VIEWS if (v != "pool_halves" or (not stacked and E == Ev))
                 and (v != "transposed_storage" or (page_size > 1 and kv_heads > 1)))


def native_views(backend, dtype: str, k_cache: np.ndarray, v_cache, layout: str, view: str) -> tuple[list, list]:
    """([K cache, V cache] (V None for a stacked layout) as the backend's native views of storage built for
    `view`, the same values as the contiguous caches element for element; the storage no view covers, as
    (cache name, native storage, index of the uncovered part) - NaN, which a call must leave as it is)."""
    stacked, base = Fm.split_layout(layout)
    P, Hkv = k_cache.shape[1 + stacked:3 + stacked][::1 if base == "NHD" else -1]  # (pages, [2,] P|Hkv, Hkv|P, E)
    fits = views_for(layout, P, Hkv, k_cache.shape[-1], k_cache.shape[-1] if v_cache is None else v_cache.shape[-1])
    if view not in fits:
        raise ValueError(f"cache_view must be one of {fits} for layout {layout!r} and caches {k_cache.shape}; "
                         f"got {view!r}")
    if view == "pool_halves":
        pool, = backend._natives(dtype, np.stack([k_cache, v_cache], axis=1))  # (pages, 2, ...) one tensor
        return [pool[:, 0], pool[:, 1]], []
    out, uncovered = [], []
    for half, cache in enumerate((k_cache, v_cache)):
        if cache is None:
            out.append(None)
        elif view == "wider_rows":
            D = cache.shape[-1]
            gap = np.full(cache.shape[:-1] + (PADDING,), np.nan)  # read only by a kernel that misaddresses
            wide, = backend._natives(dtype, np.concatenate([cache, gap] if half == 0 else [gap, cache], axis=-1))
            out.append(wide[..., :D] if half == 0 else wide[..., PADDING:])  # (..., D) of (..., D + PADDING)
            gap_at = (Ellipsis, slice(D, None) if half == 0 else slice(None, PADDING))
            uncovered.append(("k_cache" if half == 0 else "v_cache", wide, gap_at))
        elif view == "padded_pages":
            W = int(np.prod(cache.shape[1:]))  # a page's elements
            padded = np.concatenate([cache.reshape(cache.shape[0], W), np.full((cache.shape[0], PADDING), np.nan)], 1)
            wide, = backend._natives(dtype, padded)  # (pages, W + PADDING)
            out.append(wide[:, :W].reshape(cache.shape))  # a view: the split axis is the dense one
            uncovered.append(("k_cache" if half == 0 else "v_cache", wide, (slice(None), slice(W, None))))
        else:  # transposed_storage: the P and Hkv axes, (pages, [2,] P, Hkv, D) <-> (pages, [2,] Hkv, P, D)
            a = 2 if cache.ndim == 5 else 1
            other, = backend._natives(dtype, np.ascontiguousarray(np.swapaxes(cache, a, a + 1)))
            out.append(other.swapaxes(a, a + 1))
    return out, uncovered


def written_outside(backend, uncovered: list) -> str:
    """The first cache whose storage outside its view a call wrote into ('' when none): memory the cache does
    not own (an engine's other rows, MLA's other part of the row), so a write there corrupts a neighbour
    that no check of the view sees (a vector store past the head dim, scratch kept in the gaps)."""
    for name, storage, at in uncovered:
        if not np.isnan(np.asarray(backend.from_native(storage), dtype=np.float64)[at]).all():
            return name
    return ""
