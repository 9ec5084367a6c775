"""Serving-era call formats at the backend contract: a padded problem lowered, called, raised back.

A backend declares the formats it takes in ``Capabilities.formats`` (`specs.formats.FORMATS`:
"padded" by default, "packed", "paged-NHD", "paged-HND", "paged-stacked-NHD", "paged-stacked-HND",
"append") and implements the hook of each:

- ``native_packed(q, k, v, args, call)``: q ``(total_q, Hq, E)``, k/v ``(total_k, Hkv, E)`` native;
  ``args`` a `PackedArgs` (cu_seqlens_q/k int32 native, max_seqlen_q/k ints, seqused_k or None);
  returns ``(total_q, Hq, Ev)``, or ``(out, lse (Hq, total_q))`` when ``call.return_lse``.
- ``native_paged(q, k_cache, v_cache, args, call)``: q ``(B, Hq, Lq, E)`` native, the caches in
  ``args.layout``; ``args`` a `PagedArgs` (block_table, cache_seqlens, cache_leftpad or None);
  returns ``(B, Hq, Lq, Ev)``, or ``(out, lse (B, Hq, Lq))``.  A stacked layout's one tensor
  (FlashInfer's ``paged_kv_cache``, ``(num_pages, 2, P, Hkv, E)`` or ``(num_pages, 2, Hkv, P, E)``)
  comes as ``k_cache``, ``v_cache`` None.

The ``call`` holds every other field, and a setting of the backend's knobs where one is asked
(``knobs=`` to any of the calls below: ``call.knobs``, as for the padded forward); the sequences'
extents travel in the format's own arguments (its q_lengths - packed only -, kv_lengths and kv_starts
are None, positions per sequence).  fp8
inputs' descales stay in the call as drawn, ``(B, Hkv)`` or a form that broadcasts to it: their first
axis is the sequence, as FA3's varlen and kvcache calls index theirs (a packed call has no batch axis
of its own to read them by).  The
harness (`forward_packed`, `forward_paged`) validates the padded problem once, lowers it with
`specs.formats` - NaN wherever nothing may be read -, checks what comes back and raises it to
(B, Hq, Lq, Ev), so the reference stays one pipeline.  A backend that takes no padded call at all
(a varlen kernel) is called through its format by `Backend.forward` (`forward_via_format`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from attnspec.backends.base import BackendFailure, Unsupported
from attnspec.backends.cache_views import native_views, written_outside
from attnspec.specs import formats as Fm
from attnspec.specs.problem import validate


@dataclass(frozen=True)
class PackedArgs:
    cu_seqlens_q: object   # (B+1,) int32, native
    cu_seqlens_k: object   # (B+1,) int32, native
    max_seqlen_q: int
    max_seqlen_k: int
    seqused_k: object = None  # (B,) int32, native, or None


@dataclass(frozen=True)
class PagedArgs:
    block_table: object    # (B, max_pages) int32, native
    cache_seqlens: object  # (B,) int32, native
    cache_leftpad: object = None  # (B,) int32, native, or None
    layout: str = "NHD"  # specs.formats.PAGED_LAYOUTS: NHD, HND, stacked-NHD, stacked-HND
    page_size: int = 1


def _ints(backend, x):
    return None if x is None else backend.to_native(np.asarray(x, dtype=np.int64), "int32")


def _prepared(backend, fmt: str, q, k, v, dtype, return_lse, fields, op: str = "forward"):
    scale, knobs = fields.pop("scale", None), fields.pop("knobs", None)  # knobs: a setting of Backend.knobs
    p = validate(q, k, v, fields.pop("mask", None), fields.pop("is_causal", False), scale, **fields)
    if fmt not in backend.capabilities.formats:
        raise Unsupported(f"{backend.name} takes no {fmt} call (declares {', '.join(backend.capabilities.formats)})")
    backend.check_supported(dtype, op, problem=p, return_lse=return_lse)  # fp8: forward only, as declared
    backend._check_shapes(p)
    why = Fm.unpackable(p)
    if not why and fmt.startswith("paged-stacked") and p.E != p.Ev:
        why = f"one stacked tensor holds K and V, so it needs Ev == E (got E={p.E}, Ev={p.Ev})"
    if why:
        raise Unsupported(f"{backend.name} takes {fmt} calls only, and this problem has no {fmt} form: {why}")
    return p, backend.with_knobs(backend._call_of(p, dtype, return_lse, scale), knobs)


def _natives(backend, dtype, q, *rest) -> list:
    """q in the backend's query dtype (a 16-bit query beside fp8 K/V: Capabilities.fp8_query), the rest in dtype."""
    return backend._natives(backend.query_dtype(dtype), q) + backend._natives(dtype, *rest)


def _with_lse(backend, y, return_lse: bool, what: str):
    if not return_lse:
        return y, None
    if not isinstance(y, (tuple, list)) or len(y) != 2:
        raise BackendFailure(backend.name, f"{what} with return_lse returned {type(y).__name__}, expected (output, lse)")
    return y


def forward_packed(backend, q, k, v, dtype="float64", *, return_lse=False, tail=0, unused=0, fill=np.nan, rng=None,
                   tail_rows=False, layout="contiguous", **fields):
    """Output (B, Hq, Lq, Ev) of the backend's packed call on a padded problem (padded rows zeros);
    with return_lse, (output, lse (B, Hq, Lq) natural, padded rows -inf).  ``tail``/``unused``/``fill``/``rng``:
    `specs.formats.to_packed`'s tokens that must not be read.  ``tail_rows``: (output, the ``tail``
    output rows past cu_seqlens_q[-1] as returned (tail, Hq, Ev)) - rows no sequence owns.  ``layout``:
    the memory layout the packed q, k, v reach the call in (`Backend.relayout`; head_slice: a fused
    QKV projection's slices)."""
    if layout not in backend.capabilities.layouts:
        raise Unsupported(f"{backend.name} cannot be handed {layout} inputs (declares {backend.capabilities.layouts})")
    p, call = _prepared(backend, "packed", q, k, v, dtype, return_lse, fields)
    pk = Fm.to_packed(p, tail=tail, unused=unused, fill=fill, rng=rng)
    args = PackedArgs(_ints(backend, pk.cu_seqlens_q), _ints(backend, pk.cu_seqlens_k), pk.max_seqlen_q,
                      pk.max_seqlen_k, _ints(backend, pk.seqused_k))
    call = replace(call, q_lengths=None, kv_lengths=None, kv_starts=None, positions="per_sequence")
    qn, kn, vn = (backend.relayout(x, layout) for x in _natives(backend, dtype, pk.q, pk.k, pk.v))  # (total, H, ·)
    y = backend._call("packed forward", backend.native_packed, qn, kn, vn, args, call)
    out, lse = _with_lse(backend, y, return_lse, "packed forward")
    n = int(pk.cu_seqlens_q[-1])
    out = backend._check("packed output", out, pk.q.shape[:2] + (p.Ev,), backend.output_dtype(dtype))
    full = Fm.from_packed(out[:n], pk.cu_seqlens_q, p.Lq)  # (B, Hq, Lq, Ev)
    if tail_rows:
        return full, np.asarray(out[n:], dtype=np.float64)  # (tail, Hq, Ev)
    if not return_lse:
        return full
    lse = backend._check("packed lse", lse, (pk.q.shape[1], pk.q.shape[0]), None).astype(np.float64)
    return full, backend._natural(Fm.lse_from_packed(lse[:, :n], pk.cu_seqlens_q, p.Lq))  # a declared base 2: times ln 2


def forward_paged(backend, q, k, v, dtype="float64", *, page_size=16, layout="NHD", return_lse=False, pool=2.5,
                  spare_columns=1, fill=np.nan, rng=None, share=True, read_only=False, cache_view="", **fields):
    """Output (B, Hq, Lq, Ev) of the backend's paged call on a padded problem: its keys and values in a
    paged cache (`specs.formats.to_paged`, random placement, NaN wherever nothing may be read; pages of
    equal contents shared between sequences unless ``share=False``).  ``read_only``: a BackendFailure
    if the call wrote into its caches (no append was asked: a shared page would carry it to others).
    ``cache_view``: the caches handed as strided views of larger storage (`backends.cache_views`)."""
    fmt = f"paged-{layout}"
    _check_view_taken(backend, cache_view)
    p, call = _prepared(backend, fmt, q, k, v, dtype, return_lse, fields)
    pg = Fm.to_paged(p, page_size, layout, pool=pool, spare_columns=spare_columns, fill=fill, rng=rng, share=share)
    args = PagedArgs(_ints(backend, pg.block_table), _ints(backend, pg.cache_seqlens), _ints(backend, pg.cache_leftpad),
                     layout, page_size)
    call = replace(call, kv_lengths=None, kv_starts=None, positions="per_sequence")
    B = p.batch_shape[0]
    query = np.broadcast_to(p.query, (B,) + np.shape(p.query)[1:])  # (B, Hq, Lq, E)
    uncovered = []  # (cache, storage, index): the storage around a view, NaN, to stay so
    if cache_view:
        (qn,), ((kc, vc), uncovered) = _natives(backend, dtype, query), native_views(
            backend, dtype, pg.k_cache, pg.v_cache, layout, cache_view)
    else:
        qn, kc, vc = _natives(backend, dtype, query, pg.k_cache, pg.v_cache)
    caches = [(n, c) for n, c in (("k_cache", kc), ("v_cache", vc)) if c is not None]  # a stacked one: k_cache
    before = [np.array(backend.from_native(c)) for _, c in caches] if read_only else None  # copies, as given
    try:
        y = backend._call("paged forward", backend.native_paged, qn, kc, vc, args, call)
    except BackendFailure as e:
        if not cache_view or not e.what.startswith("paged forward raised"):
            raise
        raise BackendFailure(backend.name, f"{e.what} (its caches were {cache_view} views of larger storage; a kernel "
                             "that needs contiguous caches declares Capabilities.paged_cache_views=False, one that "
                             "takes some views the tuple of those)") from e
    out, lse = _with_lse(backend, y, return_lse, "paged forward")
    _check_outside(backend, "paged forward", cache_view, uncovered)
    for (name, c), was in zip(caches, before or (), strict=False):
        if not np.array_equal(np.asarray(backend.from_native(c)), was, equal_nan=True):
            raise BackendFailure(backend.name, f"paged forward wrote into {name}: a call without new keys must "
                                 "leave the cache as it was (its pages may be shared by other sequences)")
    shape = p.batch_shape + (p.Lq, p.Ev)
    out = backend._check("paged output", out, shape, backend.output_dtype(dtype))
    if not return_lse:
        return out
    return out, backend._natural(backend._check("paged lse", lse, p.batch_shape + (p.Lq,), None).astype(np.float64))


def forward_via_format(backend, q, k, v, mask, is_causal, scale, dtype, return_lse, fields):
    """`Backend.forward` of a backend that takes no padded call: through the first format it declares."""
    fmt = backend.capabilities.formats[0]
    # fixed placement and no tokens past the sequences: a plain call is deterministic (the families vary them)
    kw = dict(mask=mask, is_causal=is_causal, scale=scale, return_lse=return_lse, rng=0, **fields)
    if fmt == "packed":
        return forward_packed(backend, q, k, v, dtype, **kw)
    return forward_paged(backend, q, k, v, dtype, layout=fmt.split("-", 1)[1], **kw)


def append_paged(backend, q, k, v, n_new: int, dtype="float64", *, page_size=16, layout="NHD", rng=None,
                 fill=np.nan, cache_view="", **fields):
    """An append then attention (``native_paged_append``): the problem's last ``n_new`` keys of each
    sequence (its kv_lengths) are the new ones, the cache holds those before them and `fill` where they go.
    Returns (output (B, Hq, Lq, Ev), (K cache, V cache) after the call as NumPy, (K cache, V cache) as
    the reference update leaves them (`specs.formats.appended`)) - a stacked layout's halves.
    ``cache_view``: the caches handed (and written through) as strided views (`backends.cache_views`)."""
    if "append" not in backend.capabilities.formats:
        raise Unsupported(f"{backend.name} takes no append (declares {', '.join(backend.capabilities.formats)})")
    _check_view_taken(backend, cache_view)
    p, call = _prepared(backend, f"paged-{layout}", q, k, v, dtype, False, fields)
    pg = Fm.to_paged(p, page_size, layout, fill=fill, rng=rng)
    B, P, ends = p.batch_shape[0], page_size, np.asarray(pg.cache_seqlens, dtype=np.int64)
    starts = np.zeros(B, np.int64) if pg.cache_leftpad is None else np.asarray(pg.cache_leftpad, np.int64)
    if n_new < 0 or (ends - starts < n_new).any():
        raise ValueError(f"n_new must be in [0, the shortest sequence's keys {int((ends - starts).min())}]; got {n_new}")
    given = [None if c is None else c.copy() for c in (pg.k_cache, pg.v_cache)]  # the caches as handed over
    kc, vc = Fm.kv_halves(*given, layout)  # a stacked tensor's halves: views, written through
    nhd = Fm.split_layout(layout)[1] == "NHD"
    k_new = np.zeros((B, n_new, kc.shape[2 if nhd else 1], p.E))  # (B, n, Hkv, E)
    v_new = np.zeros((B, n_new, k_new.shape[2], p.Ev))  # (B, n, Hkv, Ev)
    for b in range(B):
        for t, j in enumerate(range(ends[b] - n_new, ends[b])):
            page, slot = pg.block_table[b, j // P], j % P
            cut = (page, slot) if nhd else (page, slice(None), slot)
            k_new[b, t], v_new[b, t] = kc[cut], vc[cut]
            kc[cut], vc[cut] = fill, fill  # before the append: past cache_seqlens, not written yet
    before = ends - n_new
    args = PagedArgs(_ints(backend, pg.block_table), _ints(backend, before), _ints(backend, pg.cache_leftpad),
                     layout, page_size)
    call = replace(call, kv_lengths=None, kv_starts=None, positions="per_sequence")
    qn, kcn, vcn, kn, vn = _natives(backend, dtype, np.broadcast_to(p.query, (B,) + np.shape(p.query)[1:]), *given,
                                    k_new, v_new)
    uncovered = []
    if cache_view:
        (kcn, vcn), uncovered = native_views(backend, dtype, *given, layout, cache_view)
    y = backend._call("paged append", backend.native_paged_append, qn, kcn, vcn, kn, vn, args, call)
    _check_outside(backend, "paged append", cache_view, uncovered)
    out = backend._check("paged append output", y, p.batch_shape + (p.Lq, p.Ev), backend.output_dtype(dtype))

    def numpy(xs):
        return [None if x is None else np.asarray(backend.from_native(x), dtype=np.float64) for x in xs]
    rounded = numpy(backend._natives(dtype, *given, k_new, v_new))
    want = Fm.appended(*rounded[:2], pg.block_table, before, *rounded[2:], layout)
    return out, Fm.kv_halves(*numpy((kcn, vcn)), layout), Fm.kv_halves(*want, layout)


def _check_view_taken(backend, cache_view: str) -> None:
    taken = backend.capabilities.paged_cache_views
    if cache_view and cache_view not in taken:
        raise Unsupported(f"{backend.name} takes no {cache_view} views of its paged caches (Capabilities."
                          f"paged_cache_views: {', '.join(taken) if taken else 'contiguous caches only'})")


def _check_outside(backend, what: str, cache_view: str, uncovered: list) -> None:
    name = written_outside(backend, uncovered)
    if name:
        raise BackendFailure(backend.name, f"{what} wrote outside {name}: into the storage around its {cache_view} "
                             "view (memory the cache does not own: the rest of an engine's cache row, or a page's padding)")


def _scatter_keys(x, cu_k, starts, ends, Lk: int) -> np.ndarray:
    """(total_k, Hkv, D) packed key gradients -> (B, Hkv, Lk, D): sequence b's at [starts_b, ends_b), zeros elsewhere."""
    B = len(starts)
    out = np.zeros((B, x.shape[1], Lk, x.shape[2]), dtype=np.float64)
    for b in range(B):
        n = ends[b] - starts[b]
        out[b, :, starts[b]:ends[b]] = np.swapaxes(x[cu_k[b]:cu_k[b] + n], 0, 1)
    return out


def backward_packed(backend, q, k, v, grad_out, dtype="float64", *, tail=0, unused=0, rng=None, **fields):
    """((dq, dk, dv) raised to the padded shapes, the largest |gradient| on tokens no sequence owns)
    of the backend's packed backward (``native_packed_backward(q, k, v, grad_out, args, call)`` ->
    packed (dq, dk, dv)); grad_out (B, Hq, Lq, Ev), NaN on the packed rows past cu_seqlens_q[-1]."""
    p, call = _prepared(backend, "packed", q, k, v, dtype, False, fields, op="forward_backward")
    pk = Fm.to_packed(p, tail=tail, unused=unused, fill=0.0, rng=rng)  # 0, not NaN: a gradient must be exactly 0 there
    B = p.batch_shape[0]
    ql, ks, ke = Fm.extents(p)
    g = np.broadcast_to(np.asarray(grad_out, dtype=np.float64), p.batch_shape + (p.Lq, p.Ev))
    rows = [np.swapaxes(g[b, :, :ql[b]], 0, 1) for b in range(B)]  # each (q_len_b, Hq, Ev)
    g_packed = np.concatenate(rows + [np.full((pk.q.shape[0] - int(ql.sum()), p.Hq, p.Ev), np.nan)])
    args = PackedArgs(_ints(backend, pk.cu_seqlens_q), _ints(backend, pk.cu_seqlens_k), pk.max_seqlen_q,
                      pk.max_seqlen_k, _ints(backend, pk.seqused_k))
    call = replace(call, q_lengths=None, kv_lengths=None, kv_starts=None, positions="per_sequence")
    natives = backend._natives(dtype, pk.q, pk.k, pk.v, g_packed)
    grads = backend._call("packed backward", backend.native_packed_backward, *natives, args, call)
    if not isinstance(grads, (tuple, list)) or len(grads) != 3:
        raise BackendFailure(backend.name, f"packed backward returned {type(grads).__name__}, expected (dq, dk, dv)")
    dq, dk, dv = (np.asarray(backend._check(f"packed d{n}", x, shape, None), dtype=np.float64)
                  for n, x, shape in zip("qkv", grads, (pk.q.shape, pk.k.shape, pk.v.shape), strict=True))
    cu_k = np.asarray(pk.cu_seqlens_k, np.int64)
    owned_k = np.zeros(pk.k.shape[0], dtype=bool)  # (total_k,) keys some sequence uses
    for b in range(B):
        owned_k[cu_k[b]:cu_k[b] + ke[b] - ks[b]] = True
    stray = max(float(np.abs(dq[int(ql.sum()):]).max(initial=0.0)),
                float(np.abs(dk[~owned_k]).max(initial=0.0)), float(np.abs(dv[~owned_k]).max(initial=0.0)))
    padded = (Fm.from_packed(dq[:int(ql.sum())], pk.cu_seqlens_q, p.Lq),
              _scatter_keys(dk, cu_k, ks, ke, p.Lk), _scatter_keys(dv, cu_k, ks, ke, p.Lk))
    return padded, stray


def prepare_format(backend, fmt: str, q, k, v, dtype="float32", *, page_size=16, rng=0, **fields):
    """`Backend.prepare` for a format (the benchmarks): lowered and converted once; returns a no-argument
    callable that runs the native packed or paged call and syncs (no NaN fill: a timed call reads numbers)."""
    p, call = _prepared(backend, fmt, q, k, v, dtype, False, fields)
    B = p.batch_shape[0]
    if fmt == "packed":
        pk = Fm.to_packed(p, fill=0.0, rng=rng)
        args = PackedArgs(_ints(backend, pk.cu_seqlens_q), _ints(backend, pk.cu_seqlens_k), pk.max_seqlen_q,
                          pk.max_seqlen_k, _ints(backend, pk.seqused_k))
        call = replace(call, q_lengths=None, kv_lengths=None, kv_starts=None, positions="per_sequence")
        natives, hook = _natives(backend, dtype, pk.q, pk.k, pk.v), backend.native_packed
    else:
        layout = fmt.split("-", 1)[1]  # NHD, HND, stacked-NHD, stacked-HND
        pg = Fm.to_paged(p, page_size, layout, fill=0.0, rng=rng)
        args = PagedArgs(_ints(backend, pg.block_table), _ints(backend, pg.cache_seqlens),
                         _ints(backend, pg.cache_leftpad), layout, page_size)
        call = replace(call, kv_lengths=None, kv_starts=None, positions="per_sequence")
        natives = _natives(backend, dtype, np.broadcast_to(p.query, (B,) + np.shape(p.query)[1:]), pg.k_cache,
                                   pg.v_cache)
        hook = backend.native_paged

    def run():
        y = hook(*natives, args, call)
        backend.sync(y)
        return y
    return run
