"""What the packed and paged families share (issue 30): their draws and their calls through the Target.

A drawn case with per-sequence lengths (the ``seq_lengths`` draw) becomes a per-sequence problem
(``positions="per_sequence"``, sometimes left-padded with ``kv_starts``); the calls lower it to the
backend's format (`backends/serving.py`: NaN wherever nothing may be read) under the Target's time
limit and failure handling.  Draws stay small: these families run only on backends that declare
per-sequence positions and the format.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from attnspec.backends import serving
from attnspec.properties.case import Case
from attnspec.properties.distribution import cases
from attnspec.properties.judge import Failed, grad_out, require, rule_of, verdict, with_full_index
from attnspec.specs import error_budget
from attnspec.specs import fields as F
from attnspec.specs.invariants import Verdict

if TYPE_CHECKING:
    from attnspec.properties.target import Target

REQUIRES = ("seq_lengths", "seq_positions")
# no mask or bias: the formats have none (a boolean mask would make the problem unpackable)
DRAW = cases(kinds=("none", "causal"), avoid=frozenset({"bias", "segment_ids"}))
PAGE_SIZES = (1, 2, 3, 5, 16, 64, 128, 256)  # 128, 256: a page larger than most drawn caches
POOLS = (2.0, 2.5, 3.0)  # the pool's size over the pages the sequences need
PER_SEQUENCE_INTS = F.FIELDS_OF["seq_lengths"] + ("kv_starts",)  # (B,) a value each sequence
DESCALES = F.FIELDS_OF["descale"]  # fp8: (B, Hkv) or a form broadcast to it, the first axis the sequence


def skip_without(target: Target, fmt: str) -> None:
    if fmt not in target.caps.formats:
        import pytest
        pytest.skip(f"{target.name} takes no {fmt} call (declares {', '.join(target.caps.formats)})")


def paged_layouts(target: Target, case: Case | None = None) -> tuple:
    """The paged layouts the backend declares (NHD, HND, stacked-NHD, stacked-HND); with a case, those
    that can hold it (a stacked tensor holds K and V in one: Ev == E only)."""
    layouts = tuple(f.split("-", 1)[1] for f in target.caps.formats if f.startswith("paged-"))
    if case is not None and case.k.shape[-1] != case.v.shape[-1]:
        layouts = tuple(x for x in layouts if not x.startswith("stacked-"))
    return layouts


def per_sequence(draw, case: Case, target: Target) -> dict:
    """params: the case's per-sequence form - each sequence's left padding (half the draws, where the
    backend's alignment allows it) - and the format's own choices."""
    ends = case.lengths("kv")
    starts = np.zeros_like(ends)
    if draw(st.booleans(), label="left padding (kv_starts)"):
        raw = np.frombuffer(draw(st.binary(min_size=len(ends), max_size=len(ends)), label="kv_starts bytes"),
                            dtype=np.uint8).astype(np.int64)
        # a few keys, or up to 255: past a kernel's first key block (a padding offset not made block-relative)
        span = draw(st.sampled_from((4, 256)), label="left padding span")
        starts = np.minimum(raw % span + np.arange(len(ends)) % 2, np.maximum(ends - 1, 0))  # a key stays
    return {"kv_starts": starts, "seed": draw(st.integers(0, 2**16), label="placement seed"),
            "unused": draw(st.integers(0, 3), label="unused keys a sequence (seqused_k)"),
            "page_size": PAGE_SIZES[draw(st.integers(0, len(PAGE_SIZES) - 1), label="page size")],
            "pool": draw(st.sampled_from(POOLS), label="pool over the need"),
            "layout": draw(st.sampled_from(paged_layouts(target) or ("NHD",)), label="paged layout")}


def problem_of(case: Case, params: dict, queries: bool = True) -> Case:
    """The case with positions per sequence and its drawn left padding; ``queries=False``: every query row
    real (a decode or chunked-prefill batch against a cache: flash_attn_with_kvcache has no query lengths)."""
    starts = params.get("kv_starts")
    return case.replace(positions="per_sequence", kv_starts=starts if starts is not None and np.any(starts) else None,
                        **({} if queries else {"q_lengths": None}))


def bottom_right(target: Target, why: str) -> None:
    """Skip unless the backend aligns bottom-right: a decode step or a chunk sits after its cache."""
    if "bottom_right" not in target.alignments:
        import pytest
        pytest.skip(f"{target.name} aligns top-left only: {why}")


def ends_and_starts(case: Case) -> tuple:
    """(B,) each sequence's key end (kv_lengths, else Lk) and start (kv_starts, else 0)."""
    B = case.dims["B"]
    ends = case.lengths("kv").astype(np.int64)
    return ends, np.broadcast_to(case.fields.get("kv_starts", 0), (B,)).astype(np.int64)


def one_sequence(case: Case, b: int) -> Case:
    """Sequence b of the case alone, a batch of one: its tokens and its per-sequence fields."""
    B = case.dims["B"]

    def take(x):
        return np.broadcast_to(x, (B,) + np.shape(x)[1:])[b:b + 1]

    per = {name: take(value) for name, value in case.fields.items() if isinstance(value, np.ndarray)
           and (name in PER_SEQUENCE_INTS and value.ndim == 1 or name == "alibi_slopes" and value.ndim >= 2
                or name in DESCALES and value.ndim == 2)}  # fp8: a (B, Hkv) or (B, 1) descale's row b
    return case.replace(q=take(case.q), k=take(case.k), v=take(case.v), **per)


@contextlib.contextmanager
def as_called(case: Case):
    """A failure inside names the problem as called (positions per sequence, left padding): the
    drawn problem the report prints has them in its params."""
    try:
        yield
    except Failed as f:
        v = f.verdict
        raise Failed(dataclasses.replace(v, message=f"{v.message}\n  as called: {case!r}")) from None


def packed(target: Target, case: Case, unused: int = 0, seed: int = 0, fill=np.nan, tail: int = 2,
           return_lse: bool = False, layout: str = "contiguous", knobs: dict | None = None):
    """The backend's packed call on the case, raised back to (B, H, Lq, Ev); return_lse: (out, lse (B, H, Lq));
    layout: the memory layout its q, k, v are handed in (`Backend.relayout`); knobs: a setting of Backend.knobs."""
    y = target.call_backend("packed forward", serving.forward_packed, target.backend, case.q, case.k, case.v,
                            dtype=target.dtype, return_lse=return_lse, tail=tail, unused=unused, fill=fill, rng=seed,
                            layout=layout, **({"knobs": knobs} if knobs else {}), **case.call_kwargs)
    return target.as_observed(y) if return_lse else y


def paged(target: Target, case: Case, page_size: int, layout: str, seed: int = 0, fill=np.nan, spare_columns: int = 1,
          pool: float | None = None, share: bool = True, return_lse: bool = False, cache_view: str = "",
          knobs: dict | None = None):
    """The backend's paged call on the case (random placement from `seed`, in a pool `pool` times the need:
    drawn from POOLS by the seed when not given), (B, H, Lq, Ev); spare_columns=0: the longest sequence
    fills its block table exactly; pages of equal contents shared unless share=False.  A call that
    writes into its cache fails (`backends.serving.forward_paged`, read_only); return_lse: (out, lse (B, H, Lq));
    cache_view: the caches as strided views of larger storage (`backends.cache_views`); knobs: a setting of
    Backend.knobs."""
    pool = POOLS[seed % len(POOLS)] if pool is None else pool
    y = target.call_backend("paged forward", serving.forward_paged, target.backend, case.q, case.k, case.v,
                            dtype=target.dtype, page_size=page_size, layout=layout, fill=fill, rng=seed,
                            spare_columns=spare_columns, pool=pool, share=share, read_only=True,
                            return_lse=return_lse, cache_view=cache_view, **({"knobs": knobs} if knobs else {}),
                            **case.call_kwargs)
    return target.as_observed(y) if return_lse else y


def shared_prefix(case: Case, page_size: int) -> tuple:
    """(the case with every sequence's first n keys and values those of sequence 0, n) - n the whole
    pages every sequence holds from key 0 (no left padding there): a prompt prefix prefix caching would
    keep once, in pages the block tables share."""
    ends, starts = ends_and_starts(case)
    n = int(ends.min(initial=0)) // page_size * page_size if not np.any(starts) else 0
    B = case.dims["B"]
    k = np.array(np.broadcast_to(case.k, (B,) + np.shape(case.k)[1:]))  # (B, Hkv, Lk, E)
    v = np.array(np.broadcast_to(case.v, (B,) + np.shape(case.v)[1:]))  # (B, Hkv, Lk, Ev)
    k[:, :, :n], v[:, :, :n] = k[:1, :, :n], v[:1, :, :n]
    return case.replace(k=k, v=v), n


def edge_cases(target: Target) -> list:
    """Per-sequence problems at the edges, by construction: zero-length sequences (total_q < B), queries
    against no keys (an early exit that leaves their rows unwritten), max_seqlen = 1, key lengths at tile
    edges (63/64/65), more queries than keys under causal, decodes against caches past 512 keys that no
    split size divides (a split-KV decode that counts its splits rounding down drops the tail; the draws
    stop near 300 keys), and 3..6 queries against them, causal or not; sequences without queries between
    others and leading two (cu_seqlens repeating a boundary)."""
    from attnspec.properties.draws import in_format, row_seed

    fmt = target.budget_dtype
    out = []
    for label, ql, kl, causal in (("zero-length sequences, total_q < B", (0, 1, 0), (3, 2, 0), True),
                                  ("queries without keys", (2, 1, 3), (0, 4, 0), False),
                                  ("max_seqlen = 1", (1, 1, 1), (1, 1, 1), True),
                                  ("keys at tile edges 63/64/65", (2, 5, 1), (63, 64, 65), True),
                                  ("Lq_b > Lk_b under causal", (6, 3, 2), (2, 5, 1), True),
                                  ("unequal lengths, no mask", (4, 2, 3), (7, 1, 5), False),
                                  ("decodes past 512-key splits", (1, 1, 1), (1000, 513, 1537), False),
                                  # 2..16 queries a sequence against long keys (speculative decoding, a split-KV
                                  # path taken for few queries): a combine that places a sequence's partial
                                  # outputs by max_seqlen_q, a decode kernel sent a causal chunk
                                  ("ragged queries against keys past 512", (6, 3, 5), (600, 520, 100), False),
                                  ("ragged queries against keys past 512, causal", (6, 3, 5), (600, 520, 100), True),
                                  # a sequence with no queries between two others, and two leading ones: cu_seqlens
                                  # repeats a boundary (a token-to-sequence map built by a non-accumulating store
                                  # of boundary marks counts it once; (0, 1, 0) repeats none)
                                  ("no queries between two sequences", (2, 0, 3), (4, 3, 5), True),
                                  ("two leading sequences without queries", (0, 0, 2), (3, 1, 4), False)):
        B, Lq, Lk = len(ql), max(max(ql), 1), max(max(kl), 1)
        rng = np.random.default_rng(row_seed(label))  # the data by the label; the placement seed by position
        q, k, v = (in_format(rng.standard_normal((B, 2, L, 8)), fmt) for L in (Lq, Lk, Lk))
        fields = {"q_lengths": np.array(ql), "kv_lengths": np.array(kl), "positions": "per_sequence"}
        if "bottom_right" in target.alignments:  # the anchors' alignment, where the backend takes it
            fields["causal_alignment"] = "bottom_right"
        case = target.exact(Case(q, k, v, None, causal, None, fields, label=label))  # fp8: rounded to its formats
        out.append((case, {"seed": len(out)}))
    return out + _variant_edges(target, len(out))


def _variant_edges(target: Target, first_seed: int) -> list:
    """Format-path variants the draws reach thinly: 8 query heads on 2 KV heads (a varlen LSE written in another
    head order under grouping shows only where every head's LSE differs), decodes under groups of 20 (a decode
    kernel's 16-head tile that takes its KV head from the tile's first head: FlashML-org/FreeToken#177), sinks
    beside a softcap of their size (a sink passed through the softcap moves by O(1) only where cap * tanh(s /
    cap) is far from s), head dim 256 over three sequences (a backward pre-pass rowsum(dO * O) indexed by
    the first sequence's offsets in its head-dim-256 template: NVIDIA/TransformerEngine#3216), decodes at head
    dim 512 and MLA's 576/512 (a Q.K^T loop bounded by a 256-wide template; the draws stop at 256), one
    sequence (a single request's path gated on the batch, which may read its pages in pool order: the draws
    give per-sequence problems two or more), and 40 sequences (past a 32-lane warp's worth)."""
    from attnspec.properties.draws import in_format, row_seed

    ragged, decodes = np.array([4, 1, 3]), np.ones(3, int)
    rows = []  # (label, query heads, KV heads, head dims (E, Ev), query lengths, fields)
    if target.supports("gqa"):
        rows.append(("8 query heads on 2 KV heads", 8, 2, (8, 8), ragged, {"enable_gqa": True}))
        rows.append(("decodes, 40 query heads on 2 KV heads", 40, 2, (8, 8), decodes, {"enable_gqa": True}))
    if target.supports("sinks") and target.supports("softcap"):
        rows.append(("sinks beside a softcap of their size", 2, 2, (8, 8), ragged, {"sinks": np.array([3.0, 7.0]),
                                                                                 "softcap": 4.0}))
    rows.append(("head dim 256, 3 sequences", 2, 2, (256, 256), ragged, {}))
    rows.append(("decodes at head dim 512", 2, 2, (512, 512), decodes, {}))
    if target.supports("gqa") and not target.equal_head_dims:  # DeepSeek's MLA decode: latent 512 + rope 64
        rows.append(("MLA decodes: E 576, Ev 512, 8 query heads on 1 KV head", 8, 1, (576, 512), decodes,
                     {"enable_gqa": True}))
    rows.append(("one sequence, 3 queries against 70 keys", 2, 2, (8, 8), np.array([3]), {"kv_lengths": np.array([70])}))
    # 40 sequences, decodes and short chunks (a tile scheduler that reads each sequence's end from the next lane
    # of a 32-lane warp without a bound gives sequence 31 lane 0's: vllm-project/flash-attention#82)
    rows.append(("40 sequences", 2, 2, (8, 8), 1 + np.arange(40) % 3, {"kv_lengths": 3 + np.arange(40) % 5}))
    out = []
    for label, H, Hkv, (E, Ev), q_lengths, extra in rows:
        kv_lengths = extra.get("kv_lengths", np.array([7, 5, 6]))  # (B,)
        B, Lq, Lk = len(q_lengths), int(q_lengths.max()), int(kv_lengths.max())
        if target.caps.outside(E, Ev, Lq, Lk, True):  # past a declared limit (a head dim): left out by construction
            continue
        rng = np.random.default_rng(row_seed(label))
        q, k, v = (in_format(2 * rng.standard_normal((B, h, L, D)), target.budget_dtype) for h, L, D in
                   ((H, Lq, E), (Hkv, Lk, E), (Hkv, Lk, Ev)))  # spread 2: every head's LSE its own
        fields = {"q_lengths": q_lengths, "kv_lengths": kv_lengths, "positions": "per_sequence",
                  **({"causal_alignment": "bottom_right"} if "bottom_right" in target.alignments else {}), **extra}
        case = target.exact(Case(q, k, v, None, True, None, fields, label=label))
        out.append((case, {"seed": first_seed + len(out)}))
    return out


def append(target: Target, case: Case, n_new: int, page_size: int, layout: str, seed: int = 0, cache_view: str = ""):
    """The backend's append of each sequence's last n_new keys, then attention: (out, caches after,
    caches as the reference update leaves them) (`backends.serving.append_paged`); cache_view: the caches
    as strided views (`backends.cache_views`)."""
    return target.call_backend("paged append", serving.append_paged, target.backend, case.q, case.k, case.v, n_new,
                               dtype=target.dtype, page_size=page_size, layout=layout, rng=seed, cache_view=cache_view,
                               **case.call_kwargs)


def packed_backward(target: Target, case: Case, grad_out, unused: int = 0, seed: int = 0, tail: int = 2,
                    knobs: dict | None = None):
    """((dq, dk, dv) padded, the largest |gradient| on tokens no sequence owns) of the packed backward (at a
    setting of the backend's knobs: None, the defaults)."""
    extra = {"knobs": knobs} if knobs else {}
    return target.call_backend("packed backward", serving.backward_packed, target.backend, case.q, case.k, case.v,
                               grad_out, dtype=target.dtype, tail=tail, unused=unused, rng=seed, **extra,
                               **case.call_kwargs)


def lse_verdict(target: Target, case: Case, lse):
    """A format call's LSE (B, H, Lq) against the reference's on the rows that see a key (the LSE
    of a row that sees none is left open, as for the padded call: test_lse.py)."""
    rows = case.judged_rows()  # (B, H, Lq)
    return with_full_index(error_budget.check_lse(lse, case.problem, dtype=target.budget_dtype, rows=rows,
                                                  rule=rule_of(target)), rows)


def packed_gradients(target: Target, case: Case, unused: int, seed: int,
                     name: str = "packed_gradients_match_reference", knobs: dict | None = None) -> None:
    """dQ, dK, dV of the packed backward (at a knob setting), each sequence's within its budget, and exactly
    0 on tokens no sequence owns."""
    g = grad_out(case, target.dtype, seed)  # (B, H, Lq, Ev)
    grads, stray = packed_backward(target, case, g, unused, seed, knobs=knobs)
    if target.backend.semantics.fully_masked == "nan":  # declared: a row that sees no key is NaN, so may its dQ be;
        empty = ~case.judged_rows()  # (B, H, Lq) the keys' gradients (other sequences' too) are judged all the same
        grads = (np.where(empty[..., None] & np.isnan(grads[0]), 0.0, grads[0]), *grads[1:])
    with as_called(case):
        verdicts = error_budget.check_backward(grads, case.problem, None, None, g, dtype=target.budget_dtype,
                                               rule=rule_of(target))
        for which, v in zip(("dq", "dk", "dv"), verdicts, strict=False):
            require(v if v else Verdict(v.name, False, v.where, v.amount, f"{which}: {v.message}", v.limit))
        require(verdict(name, stray == 0.0, None, stray,
                        f"a gradient of {stray:.6g} on a token no sequence owns; it must be exactly 0", 0.0))
