"""Paged caches handed as strided views of larger storage, as serving engines hand them.

A kernel that reads its cache with the strides of a dense tensor (page p at p * P * Hkv * E) reads another
page, the other half or padding wherever the cache is a view: FlashInfer's and vLLM's K and V are the two
halves of one ``(num_pages, 2, P, Hkv, E)`` pool (``kv_cache[:, 0]``), MLA's latent and rope parts are slices
of one cache row, and a framework hands an NHD view of HND storage (a ``transpose``) without copying
(ROCm/aiter#3498; an append's writes: flashinfer-ai/flashinfer#527).  The storage is built in NumPy, made
native once, and cut natively (basic indexing and ``swapaxes``, which NumPy, torch and JAX arrays all
have), so a torch kernel on a GPU receives the view itself, not a contiguous copy of it.  JAX arrays have
no strides to get wrong: a view there is a copy, and the call is an ordinary one.
"""
from __future__ import annotations

import numpy as np

from attnspec.specs import formats as Fm

# "pool_halves": K and V the halves of one (pages, 2, ...) pool (separate layouts with Ev == E only);
# "wider_rows": each head's row inside one of D + ROW_PADDING, NaN past D; "transposed_storage": the
# declared layout a view of the other one's storage (NHD of HND, HND of NHD)
CACHE_VIEWS = ("pool_halves", "wider_rows", "transposed_storage")
ROW_PADDING = 8  # a row stride no head dim's dense stride equals


def views_for(layout: str, E: int, Ev: int) -> tuple:
    """The views a cache in `layout` can be handed as (pool_halves needs separate caches of one head dim)."""
    stacked = Fm.split_layout(layout)[0]
    return tuple(v for v in CACHE_VIEWS if v != "pool_halves" or (not stacked and E == Ev))


def native_views(backend, dtype: str, k_cache: np.ndarray, v_cache, layout: str, view: str) -> list:
    """[K cache, V cache] (V None for a stacked layout) as the backend's native views of storage built for
    `view`; the same values as the contiguous caches, element for element."""
    if view not in views_for(layout, k_cache.shape[-1], k_cache.shape[-1] if v_cache is None else v_cache.shape[-1]):
        raise ValueError(f"cache_view must be one of {views_for(layout, 1, 1)} for layout {layout!r} (pool_halves "
                         f"needs separate caches of one head dim); got {view!r}")
    if view == "pool_halves":
        pool, = backend._natives(dtype, np.stack([k_cache, v_cache], axis=1))  # (pages, 2, ...) one tensor
        return [pool[:, 0], pool[:, 1]]
    out = []
    for cache in (k_cache, v_cache):
        if cache is None:
            out.append(None)
        elif view == "wider_rows":
            D = cache.shape[-1]
            gap = np.full(cache.shape[:-1] + (ROW_PADDING,), np.nan)  # read only by a dense-stride kernel
            wide, = backend._natives(dtype, np.concatenate([cache, gap], axis=-1))  # (..., D + ROW_PADDING)
            out.append(wide[..., :D])
        else:  # transposed_storage: the P and Hkv axes, (pages, [2,] P, Hkv, D) <-> (pages, [2,] Hkv, P, D)
            a = 2 if cache.ndim == 5 else 1
            other, = backend._natives(dtype, np.ascontiguousarray(np.swapaxes(cache, a, a + 1)))
            out.append(other.swapaxes(a, a + 1))
    return out
