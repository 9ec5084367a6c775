"""The out-of-bounds probe (issue 30, item 5): a valid packed or paged call with one index argument
made bad, handed to the backend's own hook (``native_packed`` / ``native_paged``) as it is - the
harness's validation (`specs.formats.validate_*`) bypassed - and what the backend did with it.

Refusing (raising anything) is the good answer.  Returning is a finding, never a crash of the suite:
NaN in the output where the valid call had none means it read out of bounds; numbers alone mean it
ignored, clamped or wrapped the bad index onto data.  Every stray read is made to show as NaN where
it can: each tensor is a view into a NaN buffer (``GUARD`` tokens, pages or table columns either side:
a kernel addressing raw memory past an end reads NaN), the pool's first and last pages are unused NaN
pages (a page id clamped into the pool, or -1 wrapped by NumPy or torch indexing, lands there), and
the block table's guard columns name such a page.  properties/test_bad_indices.py asks it of every
backend taking the format: recorded, or judged where `Semantics.rejects_bad_indices` is declared.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.backends.base import Unsupported
from attnspec.backends.serving import PackedArgs, PagedArgs, _prepared
from attnspec.specs import formats as Fm

GUARD = 2  # NaN tokens or pages (and guard table columns) either side of each tensor
PAGE = 2   # the paged probe's page size: two full pages a sequence, its block table exactly full

# kind -> (format, what is made bad); each a bad input of issue 30 item 5
BAD_INPUTS = {
    "cu_seqlens_decreasing": ("packed", "cu_seqlens_k not monotone (sequence 1's keys end before they start)"),
    "cu_seqlens_past_tokens": ("packed", f"cu_seqlens_k[-1] {GUARD} tokens beyond the key tensor"),
    "seqused_k_over_sequence": ("packed", f"seqused_k {GUARD} over the last sequence's keys (into NaN tokens)"),
    "cu_seqlens_q_decreasing": ("packed", "cu_seqlens_q not monotone (sequence 1's queries end before they start)"),
    "max_seqlen_q_short": ("packed", "max_seqlen_q one below the longest sequence's queries (a grid that many rows "
                                     "tall leaves its last row unwritten)"),
    "page_id_past_pool": ("paged", "a page id read = num_pages, one past the pool"),
    "page_id_negative": ("paged", "a page id read = -1"),
    "table_too_short": ("paged", "cache_seqlens one key past what sequence 1's block table holds"),
}
REFUSED = "refused"  # then "refused (ExceptionType)"
OUT_OF_BOUNDS = "silent: reads out of bounds (NaN)"
NUMBERS = "silent: numbers (the bad index ignored, clamped or wrapped onto data)"
NO_OUTPUT = "silent: no output of the right shape"


def problem(fmt: str, E: int = 4) -> tuple:
    """(q, k, v, fields) of the probe: three sequences of 2, 1, 3 queries over 3, 4, 2 keys (packed) or two of
    3 queries over 4 keys (paged: every query real, two full pages each); no mask; values on a k/8 grid
    (exact in every dtype), so NaN in an output comes from memory no call may read."""
    rng = np.random.default_rng(30)
    B = 3 if fmt == "packed" else 2
    q, k, v = (np.round(rng.standard_normal((B, 2, L, E)) * 8) / 8 for L in (3, 4, 4))  # (B, H, L, E)
    fields = {"positions": "per_sequence"}
    if fmt == "packed":
        fields.update(q_lengths=np.array([2, 1, 3]), kv_lengths=np.array([3, 4, 2]))
    return q, k, v, fields


def _guarded(backend, dtype, x, fill=np.nan, cast=None):
    """x (n, ...) as a native view [GUARD:GUARD+n] of a native buffer (n + 2 GUARD, ...) filled with `fill`
    (frameworks whose slices copy, JAX's, keep no guard: nothing there addresses raw memory)."""
    buf = np.full((x.shape[0] + 2 * GUARD,) + x.shape[1:], fill, dtype=np.float64 if cast is None else np.int64)
    buf[GUARD:GUARD + x.shape[0]] = x
    native = backend.to_native(buf, cast) if cast else backend._natives(dtype, buf)[0]
    return native[GUARD:GUARD + x.shape[0]]


def _table(backend, table, guard_page: int):
    """(B, W) block table as a native view of a (B, W + GUARD) one whose guard columns name `guard_page`."""
    buf = np.full((table.shape[0], table.shape[1] + GUARD), guard_page, dtype=np.int64)
    buf[:, :table.shape[1]] = table
    return backend.to_native(buf, "int32")[:, :table.shape[1]]


def _packed_calls(backend, kind: str, dtype: str, p, call):
    """(hook, valid arguments, bad arguments) of a packed probe."""
    pk = Fm.to_packed(p, tail=0 if kind == "cu_seqlens_past_tokens" else 2)  # the NaN tail: tokens no sequence owns
    cu_k, used = pk.cu_seqlens_k.astype(np.int64), np.diff(pk.cu_seqlens_k).astype(np.int64)  # (B+1,), (B,)
    bad_cu, bad_used = cu_k.copy(), used.copy()
    cu_q, bad_cu_q, max_q = pk.cu_seqlens_q.astype(np.int64), pk.cu_seqlens_q.astype(np.int64).copy(), pk.max_seqlen_q
    if kind == "cu_seqlens_q_decreasing":
        bad_cu_q[1], bad_cu_q[2] = cu_q[2], cu_q[1]
    elif kind == "max_seqlen_q_short":
        max_q = pk.max_seqlen_q - 1
    elif kind == "cu_seqlens_decreasing":
        bad_cu[1], bad_cu[2] = cu_k[2], cu_k[1]
    elif kind == "cu_seqlens_past_tokens":  # every bad read stays inside the guarded allocation
        bad_cu[-1] += GUARD
    elif kind == "seqused_k_over_sequence":
        bad_used[-1] += GUARD
    q, k, v = (_guarded(backend, dtype, x) for x in (pk.q, pk.k, pk.v))

    def args(cu, seqused, cu_queries, max_queries):  # seqused_k only where it is the bad argument
        given = kind == "seqused_k_over_sequence"
        return PackedArgs(_guarded(backend, dtype, cu_queries, 0, "int32"), _guarded(backend, dtype, cu, 0, "int32"),
                          max_queries, int(max(np.diff(cu).max(), seqused.max() if given else 0)),
                          _guarded(backend, dtype, seqused, 0, "int32") if given else None)
    call = replace(call, q_lengths=None, kv_lengths=None, kv_starts=None, positions="per_sequence")
    return backend.native_packed, (q, k, v, args(cu_k, used, cu_q, pk.max_seqlen_q), call), (
        q, k, v, args(bad_cu, bad_used, bad_cu_q, max_q), call)


def _paged_calls(backend, kind: str, dtype: str, p, call, layout: str):
    """(hook, valid arguments, bad arguments) of a paged probe."""
    pg = Fm.to_paged(p, PAGE, layout, pool=2.0, spare_columns=0, rng=0)
    pool = []
    for c in (pg.k_cache, pg.v_cache):  # an unused NaN page before and after the pool: page ids move up one
        nan = None if c is None else np.full((1,) + c.shape[1:], np.nan)
        pool.append(None if c is None else np.concatenate([nan, c, nan]))
    num_pages = pool[0].shape[0]
    table, lens = pg.block_table.astype(np.int64) + 1, pg.cache_seqlens.astype(np.int64)  # (B, W), (B,)
    bad_table, bad_lens = table.copy(), lens.copy()
    if kind == "page_id_past_pool":
        bad_table[0, 1] = num_pages
    elif kind == "page_id_negative":
        bad_table[0, 1] = -1
    else:
        bad_lens[1] = table.shape[1] * PAGE + 1
    B = p.batch_shape[0]
    q = backend._natives(dtype, np.broadcast_to(p.query, (B,) + np.shape(p.query)[1:]))[0]
    kc, vc = (None if c is None else _guarded(backend, dtype, c) for c in pool)

    def args(t, n):
        return PagedArgs(_table(backend, t, 0), _guarded(backend, dtype, n, 0, "int32"), None, layout, PAGE)
    call = replace(call, kv_lengths=None, kv_starts=None, positions="per_sequence")
    return backend.native_paged, (q, kc, vc, args(table, lens), call), (q, kc, vc, args(bad_table, bad_lens), call)


def _output(backend, y):
    """The returned output as float64 NumPy, or None when it is not one."""
    try:
        return np.asarray(backend.from_native(y), dtype=np.float64)
    except Exception:  # noqa: BLE001 - whatever came back, it is not an output
        return None


def probe(backend, kind: str, dtype: str = "float64") -> tuple:
    """(observed, detail): what the backend's own hook did with the bad input `kind` (BAD_INPUTS) -
    "refused (Type)", OUT_OF_BOUNDS, NUMBERS, NO_OUTPUT; "declined" when it takes no such call (or
    declines the valid probe), "error on the valid call" when that raised.  Never raises for anything
    the hook does; Unsupported when the backend takes no call of the format at all."""
    fmt = BAD_INPUTS[kind][0]
    layouts = [f.split("-", 1)[1] for f in backend.capabilities.formats if f.startswith("paged-")]
    if fmt == "paged" and not layouts:
        raise Unsupported(f"{backend.name} takes no paged call")
    fmt_name = "packed" if fmt == "packed" else f"paged-{layouts[0]}"
    q, k, v, fields = problem(fmt, backend.capabilities.fit_head_dim(4))
    p, call = _prepared(backend, fmt_name, q, k, v, dtype, False, dict(fields))  # Unsupported: not its call
    hook, valid, bad = (_packed_calls(backend, kind, dtype, p, call) if fmt == "packed"
                        else _paged_calls(backend, kind, dtype, p, call, layouts[0]))
    try:
        good = _output(backend, hook(*valid))
    except Unsupported as e:
        return "declined", str(e)
    except Exception as e:  # noqa: BLE001 - the valid call failing leaves nothing to compare: an answer
        return "error on the valid call", f"{type(e).__name__}: {e}"
    try:
        y = hook(*bad)
    except Exception as e:  # noqa: BLE001 - any exception refuses the input: the good answer
        return f"{REFUSED} ({type(e).__name__})", str(e)[:200]
    out = _output(backend, y)
    if out is None or good is None or out.shape != good.shape:
        return NO_OUTPUT, f"returned {type(y).__name__} {getattr(y, 'shape', '')}"
    stray = np.isnan(out) & ~np.isnan(good)  # NaN the valid call did not give: memory it never read
    if stray.any():
        return OUT_OF_BOUNDS, f"{int(stray.sum())} output values NaN"
    return NUMBERS, f"{int((out != good).sum())} output values differ from the valid call's"
