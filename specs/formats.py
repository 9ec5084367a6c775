"""Call formats: a padded problem lowered to the layouts serving kernels take, and raised back.

- ``packed`` (flash-attention's ``flash_attn_varlen_func``, FlashInfer's ragged ``qo_indptr``/
  ``kv_indptr``, ``varlen_attn``): the tokens of every sequence concatenated on one axis, q
  ``(total_q, Hq, E)``, k/v ``(total_k, Hkv, E)``; sequence b owns query rows
  ``[cu_seqlens_q[b], cu_seqlens_q[b+1])`` and keys ``[cu_seqlens_k[b], cu_seqlens_k[b+1])``, of which
  the first ``seqused_k[b]`` are used when given.  Positions are per sequence.
- ``paged`` (``flash_attn_with_kvcache(block_table=)``, FlashInfer's paged wrappers, vLLM): key j of
  sequence b lives at ``cache[block_table[b, j // P], j % P]`` (NHD: ``(num_pages, P, Hkv, E)``;
  HND: ``(num_pages, Hkv, P, E)``); keys ``[cache_leftpad[b], cache_seqlens[b])`` are the sequence's.
  The stacked layouts hold K and V in one tensor, FlashInfer's ``paged_kv_cache``: ``(num_pages, 2, P,
  Hkv, E)`` (stacked-NHD) or ``(num_pages, 2, Hkv, P, E)`` (stacked-HND), index 0 of axis 1 the keys,
  1 the values; it travels as ``k_cache`` with ``v_cache`` None, and needs Ev == E.

Lowering fills everything a kernel must not read (tokens past ``cu_seqlens[-1]``, past
``seqused_k``, unused pages, each last page's tail, the left padding, unused table columns: valid
page ids of other pages) with ``fill`` (NaN by default), so a kernel that reads them is caught.
Only NumPy is used here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAGED_LAYOUTS = ("NHD", "HND", "stacked-NHD", "stacked-HND")
# "append": a paged call that first writes new keys into the cache in place (in its paged layouts)
FORMATS = ("padded", "packed") + tuple(f"paged-{layout}" for layout in PAGED_LAYOUTS) + ("append",)


@dataclass(frozen=True)
class Packed:
    q: np.ndarray             # (total_q, Hq, E) every sequence's queries, then `tail` tokens not read
    k: np.ndarray             # (total_k, Hkv, E)
    v: np.ndarray             # (total_k, Hkv, Ev)
    cu_seqlens_q: np.ndarray  # (B+1,) int32
    cu_seqlens_k: np.ndarray  # (B+1,) int32
    max_seqlen_q: int
    max_seqlen_k: int
    seqused_k: np.ndarray | None = None  # (B,) int32: keys used of each sequence's span


@dataclass(frozen=True)
class Paged:
    k_cache: np.ndarray       # (num_pages, P, Hkv, E) NHD, (num_pages, Hkv, P, E) HND; stacked: (num_pages, 2, ...)
    v_cache: np.ndarray | None  # (num_pages, P, Hkv, Ev) or (num_pages, Hkv, P, Ev); None when stacked
    block_table: np.ndarray   # (B, max_pages) int32
    cache_seqlens: np.ndarray  # (B,) int32: one past each sequence's last key
    cache_leftpad: np.ndarray | None = None  # (B,) int32: each sequence's first key
    layout: str = "NHD"

    @property
    def page_size(self) -> int:
        k, _ = kv_halves(self.k_cache, self.v_cache, self.layout)
        return int(k.shape[1 if split_layout(self.layout)[1] == "NHD" else 2])


def split_layout(layout: str) -> tuple:
    """(stacked, "NHD" or "HND") of a paged layout; ValueError naming `layout` for another."""
    if layout not in PAGED_LAYOUTS:
        raise ValueError(f"layout must be one of {PAGED_LAYOUTS}; got {layout!r}")
    return layout.startswith("stacked-"), layout.removeprefix("stacked-")


def kv_halves(k_cache, v_cache, layout: str) -> tuple:
    """(K cache, V cache) in the layout's NHD or HND form: a stacked tensor's two halves as views (writes
    go through; NumPy or torch alike), separate caches as they are."""
    return (k_cache[:, 0], k_cache[:, 1]) if split_layout(layout)[0] else (k_cache, v_cache)


def _ints(name: str, x, ndim: int) -> np.ndarray:
    if not str(getattr(x, "dtype", type(x).__name__)).startswith(("int", "uint")):
        raise ValueError(f"{name} must be an integer array; got {getattr(x, 'dtype', type(x).__name__)}")
    a = np.asarray(x)
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s); got shape {a.shape}")
    return a.astype(np.int64)


def _rank(name: str, x, rank: int, what: str) -> tuple:
    shape = tuple(np.shape(x))
    if len(shape) != rank:
        raise ValueError(f"{name} must be shaped {what}; got {shape}")
    return shape


# ---- validation (the harness's own input, and what a kernel should refuse) ---------------------

def validate_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=None) -> int:
    """The number of sequences B; ValueError naming the argument for a packed call that is not one."""
    (tq, hq, e), (tk, hk, ek) = _rank("q", q, 3, "(total_q, Hq, E)"), _rank("k", k, 3, "(total_k, Hkv, E)")
    tv, hv, _ = _rank("v", v, 3, "(total_k, Hkv, Ev)")
    if ek != e or (tv, hv) != (tk, hk):
        raise ValueError(f"k {np.shape(k)} and v {np.shape(v)} must be (total_k, Hkv, E), (total_k, Hkv, Ev) "
                         f"with q's E={e}")
    if hk == 0 or hq % hk:
        raise ValueError(f"q's heads Hq={hq} must be a multiple of k's Hkv={hk}")
    B = None
    for name, cu, total, most in (("cu_seqlens_q", cu_seqlens_q, tq, max_seqlen_q),
                                  ("cu_seqlens_k", cu_seqlens_k, tk, max_seqlen_k)):
        c = _ints(name, cu, 1)
        if c.size < 1 or (B is not None and c.size != B + 1):
            raise ValueError(f"{name} must be (B+1,) with the other's B; got shape {c.shape}")
        B = c.size - 1
        if c[0] < 0 or (np.diff(c) < 0).any():
            raise ValueError(f"{name} must start at >= 0 and never decrease; got {c.tolist()}")
        if c[-1] > total:
            raise ValueError(f"{name}[-1]={int(c[-1])} lies beyond the tensor's {total} tokens")
        seq = "q" if name.endswith("q") else "k"
        if isinstance(most, bool) or not isinstance(most, (int, np.integer)) or most < (np.diff(c).max(initial=0)):
            raise ValueError(f"max_seqlen_{seq} must be an int >= the longest sequence "
                             f"({int(np.diff(c).max(initial=0))}); got {most!r}")
    if seqused_k is not None:
        used, span = _ints("seqused_k", seqused_k, 1), np.diff(np.asarray(cu_seqlens_k, dtype=np.int64))
        if used.shape != span.shape or (used < 0).any() or (used > span).any():
            raise ValueError(f"seqused_k must be (B,) within each sequence's keys [0, {span.tolist()}]; "
                             f"got {used.tolist()}")
    return B


def validate_paged(k_cache, v_cache, block_table, cache_seqlens, cache_leftpad=None, layout="NHD") -> int:
    """The number of sequences B; ValueError naming the argument for a paged cache that is not one."""
    stacked, base = split_layout(layout)
    what = "(num_pages, page_size, Hkv, E)" if base == "NHD" else "(num_pages, Hkv, page_size, E)"
    if stacked:
        if v_cache is not None:
            raise ValueError(f"v_cache must be None in layout {layout}: K and V are the halves of k_cache")
        ks = _rank("k_cache", k_cache, 5, what.replace("pages, ", "pages, 2, ", 1))
        if ks[1] != 2:
            raise ValueError(f"k_cache's axis 1 must be 2 (0: K, 1: V) in layout {layout}; got shape {ks}")
        ks = vs = ks[:1] + ks[2:]
    else:
        ks, vs = _rank("k_cache", k_cache, 4, what), _rank("v_cache", v_cache, 4, what)
    if ks[:3] != vs[:3]:
        raise ValueError(f"k_cache {ks} and v_cache {vs} must share (num_pages, page_size, Hkv)")
    pages, P = ks[0], ks[1 if base == "NHD" else 2]
    table = _ints("block_table", block_table, 2)
    lens = _ints("cache_seqlens", cache_seqlens, 1)
    B = table.shape[0]
    if lens.shape != (B,) or (lens < 0).any():
        raise ValueError(f"cache_seqlens must be (B,) = ({B},) non-negative; got {lens.tolist()}")
    if P < 1 or (lens > table.shape[1] * P).any():
        raise ValueError(f"block_table of {table.shape[1]} pages of {P} is too short for cache_seqlens "
                         f"{lens.tolist()}")
    used = np.arange(table.shape[1])[None, :] < -(-lens // max(P, 1))[:, None]  # (B, max_pages) pages read
    if ((table < 0) | (table >= pages))[used].any():
        raise ValueError(f"block_table holds a page id outside the pool [0, {pages}): "
                         f"{table[used & ((table < 0) | (table >= pages))].tolist()}")
    if cache_leftpad is not None:
        pad = _ints("cache_leftpad", cache_leftpad, 1)
        if pad.shape != (B,) or (pad < 0).any() or (pad > lens).any():
            raise ValueError(f"cache_leftpad must be (B,) within [0, cache_seqlens={lens.tolist()}]; "
                             f"got {pad.tolist()}")
    return B


# ---- lowering a padded problem ------------------------------------------------------------------

def extents(p):
    """(q_len, kv_start, kv_end) per sequence of a rank-4 problem (B, H, L, E), each (B,) int64."""
    B = p.batch_shape[0]

    def per(x, default):
        return np.broadcast_to(np.asarray(default if x is None else x, dtype=np.int64), (B,))
    return per(p.q_lengths, p.Lq), per(p.kv_starts, 0), per(p.kv_lengths, p.Lk)


def unpackable(p) -> str:
    """Why a validated problem has no packed or paged form ('' when it has): a rank-4 batch, no mask, no
    bias, no segments, and positions that are the sequences' own."""
    if len(p.batch_shape) != 2:
        return f"needs (B, H, L, E) inputs; got batch shape {p.batch_shape}"
    for name in ("mask", "bias", "q_segment_ids"):
        if getattr(p, name) is not None:
            return f"a {name.replace('q_', '')} has no packed or paged form"
    if p.positions != "per_sequence" and (p.is_causal or p.window is not None or p.alibi_slopes is not None):
        ql, ks, ke = extents(p)
        from attnspec.specs.masks import offset, sequence_offsets
        if (sequence_offsets(p.Lq, p.Lk, p.causal_alignment, ql, ke, ks) != offset(p.Lq, p.Lk, p.causal_alignment)).any():
            return "global positions differ from the sequences' own (packed and paged calls count per sequence)"
    return ""


def _heads_first(x, B: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(x, dtype=np.float64), (B,) + np.shape(x)[1:])  # (B, H, L, D)


def to_packed(p, *, tail: int = 0, unused: int = 0, fill=np.nan, rng=None) -> Packed:
    """The packed form of a validated problem (see `unpackable`).

    Sequence b's queries are rows [0, q_len_b), its keys [kv_start_b, kv_len_b).  ``unused``: up to this
    many keys of `fill` after each sequence's used keys, inside its span (``seqused_k`` then says how many
    are used; drawn with ``rng``); ``tail``: tokens of `fill` past ``cu_seqlens[-1]`` on both sides."""
    why = unpackable(p)
    if why:
        raise ValueError(f"this problem has no packed form: {why}")
    B = p.batch_shape[0]
    ql, ks, ke = extents(p)
    q, k, v = _heads_first(p.query, B), _heads_first(p.key, B), _heads_first(p.value, B)
    extra = (np.zeros(B, dtype=np.int64) if not unused else
             np.random.default_rng(rng).integers(0, unused + 1, size=B))  # (B,) unused keys of each span
    qs = [np.swapaxes(q[b, :, :ql[b]], 0, 1) for b in range(B)]  # each (q_len_b, Hq, E)
    ks_, vs_ = [], []
    for b in range(B):
        kb, vb = np.swapaxes(k[b, :, ks[b]:ke[b]], 0, 1), np.swapaxes(v[b, :, ks[b]:ke[b]], 0, 1)  # (n_b, Hkv, D)
        ks_ += [kb, np.full((extra[b],) + kb.shape[1:], fill)]
        vs_ += [vb, np.full((extra[b],) + vb.shape[1:], fill)]
    Hq, Hkv, E, Ev = q.shape[1], k.shape[1], p.E, p.Ev
    qs.append(np.full((tail, Hq, E), fill))
    ks_.append(np.full((tail, Hkv, E), fill))
    vs_.append(np.full((tail, Hkv, Ev), fill))
    span = ke - ks + extra
    cu_q = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(span)]).astype(np.int32)
    return Packed(np.concatenate(qs), np.concatenate(ks_), np.concatenate(vs_), cu_q, cu_k,
                  int(ql.max(initial=0)), int(span.max(initial=0)),
                  (ke - ks).astype(np.int32) if unused else None)


def from_packed(out, cu_seqlens_q, Lq: int, fill=0.0) -> np.ndarray:
    """(total_q, Hq, Ev) -> (B, Hq, Lq, Ev): each sequence's rows back in place, padded rows `fill`."""
    cu = np.asarray(cu_seqlens_q, dtype=np.int64)
    out = np.asarray(out)
    full = np.full((cu.size - 1, out.shape[1], Lq, out.shape[2]), fill, dtype=out.dtype)  # (B, Hq, Lq, Ev)
    for b in range(cu.size - 1):
        full[b, :, :cu[b + 1] - cu[b]] = np.swapaxes(out[cu[b]:cu[b + 1]], 0, 1)
    return full


def lse_from_packed(lse, cu_seqlens_q, Lq: int) -> np.ndarray:
    """(Hq, total_q) (flash-attention's varlen LSE) -> (B, Hq, Lq); padded rows -inf."""
    return from_packed(np.swapaxes(np.asarray(lse), 0, 1)[..., None], cu_seqlens_q, Lq, -np.inf)[..., 0]


def to_paged(p, page_size: int, layout: str = "NHD", *, pool: float = 2.5, spare_columns: int = 1, fill=np.nan,
             rng=None, share: bool = False) -> Paged:
    """The paged form of a validated problem's keys and values (queries stay padded (B, Hq, Lq, E)).

    Each sequence's pages cover keys [0, kv_len_b); they sit at random places in a pool ``pool`` times
    the need; every slot no sequence owns - unused pages, last pages' tails, the left padding - holds
    `fill`, and ``spare_columns`` more table columns point at random pages (never to be read).
    ``share``: a full page whose keys and values (every head's) equal a page already placed is that
    page - one physical page in several block tables, read only, as prefix caching shares a prompt."""
    why = unpackable(p)
    if why:
        raise ValueError(f"this problem has no paged form: {why}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive int; got {page_size!r}")
    stacked, base = split_layout(layout)
    if stacked and p.E != p.Ev:
        raise ValueError(f"layout {layout} holds K and V in one tensor: it needs Ev == E; got E={p.E}, Ev={p.Ev}")
    gen = np.random.default_rng(rng)
    B = p.batch_shape[0]
    _, ks, ke = extents(p)
    k, v = _heads_first(p.key, B), _heads_first(p.value, B)  # (B, Hkv, Lk, D)
    need = -(-ke // page_size)  # (B,) pages each sequence reads
    pages = max(1, int(np.ceil(pool * max(int(need.sum()), 1))))
    order = gen.permutation(pages)  # random placement
    width = int(need.max(initial=0)) + spare_columns
    table = gen.integers(0, pages, size=(B, max(width, 1))).astype(np.int32)  # (B, max_pages) spare: garbage ids
    Hkv = k.shape[1]
    kc = np.full((pages, page_size, Hkv, p.E), fill)  # (num_pages, P, Hkv, E) NHD while filling
    vc = np.full((pages, page_size, Hkv, p.Ev), fill)
    at, placed = 0, {}
    for b in range(B):
        for c in range(need[b]):
            lo, hi = c * page_size, (c + 1) * page_size
            whole = share and ks[b] <= lo and hi <= ke[b]  # a full page of the sequence's own keys
            key = (k[b, :, lo:hi].tobytes(), v[b, :, lo:hi].tobytes()) if whole else None
            if key in placed:
                table[b, c] = placed[key]
                continue
            table[b, c] = order[at]
            at += 1
            if whole:
                placed[key] = table[b, c]
        for j in range(ks[b], ke[b]):  # the left padding [0, kv_start) stays `fill`: never read
            kc[table[b, j // page_size], j % page_size] = k[b, :, j]
            vc[table[b, j // page_size], j % page_size] = v[b, :, j]
    if base == "HND":
        kc, vc = np.swapaxes(kc, 1, 2).copy(), np.swapaxes(vc, 1, 2).copy()  # (num_pages, Hkv, P, D)
    if stacked:
        kc, vc = np.stack([kc, vc], axis=1), None  # (num_pages, 2, P, Hkv, E) or (num_pages, 2, Hkv, P, E)
    return Paged(kc, vc, table, ke.astype(np.int32), None if p.kv_starts is None else ks.astype(np.int32), layout)


def gather_paged(k_cache, v_cache, block_table, cache_seqlens, layout: str = "NHD", Lk: int | None = None) -> tuple:
    """The contiguous (B, Hkv, Lk, D) keys and values of a paged cache; slots past cache_seqlens zeros."""
    validate_paged(k_cache, v_cache, block_table, cache_seqlens, None, layout)
    nhd = split_layout(layout)[1] == "NHD"
    kc, vc = (np.asarray(x) if nhd else np.swapaxes(np.asarray(x), 1, 2) for x in kv_halves(k_cache, v_cache, layout))
    P, lens, table = kc.shape[1], np.asarray(cache_seqlens, dtype=np.int64), np.asarray(block_table, dtype=np.int64)
    Lk = int(lens.max(initial=0)) if Lk is None else Lk
    j = np.arange(Lk)  # (Lk,)
    cols = np.minimum(j // P, table.shape[1] - 1)
    page = table[:, cols]  # (B, Lk)
    inside = j[None, :] < lens[:, None]  # (B, Lk)
    page = np.where(inside, page, 0)
    k, v = kc[page, j % P], vc[page, j % P]  # (B, Lk, Hkv, D)
    k, v = (np.where(inside[..., None, None], x, 0) for x in (k, v))
    return np.swapaxes(k, 1, 2), np.swapaxes(v, 1, 2)  # (B, Hkv, Lk, E), (B, Hkv, Lk, Ev)


def appended(k_cache, v_cache, block_table, cache_seqlens, k_new, v_new, layout: str = "NHD") -> tuple:
    """The reference update of an append (flash_attn_with_kvcache(k=, v=), FlashInfer's append_paged_kv_cache):
    copies of the caches with new key t of sequence b, k_new[b, t] ((B, n, Hkv, E)), at slot
    cache_seqlens[b] + t through the block table; every other slot as it was, bit for bit.  A stacked
    layout's one tensor comes back as (kv_cache, None)."""
    lens = np.asarray(cache_seqlens, dtype=np.int64)
    n = np.shape(k_new)[1]
    validate_paged(k_cache, v_cache, block_table, lens + n, None, layout)  # the grown cache must fit its table
    out = [None if x is None else np.array(x, copy=True) for x in (k_cache, v_cache)]
    kc, vc = kv_halves(*out, layout)  # views into the copies
    nhd = split_layout(layout)[1] == "NHD"
    P = kc.shape[1 if nhd else 2]
    table = np.asarray(block_table, dtype=np.int64)
    for b in range(table.shape[0]):
        for t in range(n):
            j = lens[b] + t
            page, slot = table[b, j // P], j % P
            if nhd:
                kc[page, slot], vc[page, slot] = k_new[b, t], v_new[b, t]  # (Hkv, D)
            else:
                kc[page, :, slot], vc[page, :, slot] = k_new[b, t], v_new[b, t]
    return tuple(out)
