"""Family: paged KV caches (block tables) - flash_attn_with_kvcache's and vLLM's format (issue 30).

Run only on backends that declare per-sequence positions and a ``paged-*`` format.  A drawn
problem's keys and values are written to a paged cache (`specs.formats.to_paged`): pages at random
places in a pool 2-3x the need, page sizes 1, 2, 3, 5, 16, 64, 128, 256, NaN in unused pages, each last page's
tail, the left padding (``cache_leftpad``) and pages that spare table columns point to; in each layout the
backend declares (NHD, HND, and stacked: FlashInfer's one K/V tensor, drawn where Ev == E).  Every query
row is real (a decode or chunked-prefill batch: flash_attn_with_kvcache has no query lengths).
Bugs this catches: output depending on page placement (pytorch/pytorch#182593), a block table not
used (tanishqkumar/ssd#23), ``cache_leftpad`` accepted and never used (Dao-AILab/flash-attention#1788),
reading a last page's tail.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnspec.backends.cache_views import CACHE_VIEWS, views_for
from attnspec.properties import serving_calls as S
from attnspec.properties.explore import prop
from attnspec.properties.judge import agreement, close_outputs, require, unchanged, verdict

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target


def _layout(target: Target, params: dict, case: Case) -> str:
    """The drawn layout where it can hold the case (a stacked one needs Ev == E), else the first that can
    (none: the drawn one, and the call declines)."""
    declared = S.paged_layouts(target)
    if not declared:
        import pytest
        pytest.skip(f"{target.name} takes no paged call (declares {', '.join(target.caps.formats)})")
    fit = S.paged_layouts(target, case) or declared
    return params["layout"] if params["layout"] in fit else fit[0]


@prop(requires=S.REQUIRES, draw=S.DRAW, params=S.per_sequence)
def test_paged_matches_reference(target: Target, case: Case, params: dict):
    """A paged call equals the reference on the contiguous problem (positions per sequence, left padding)."""
    layout = _layout(target, params, case)
    case = S.problem_of(case, params, queries=False)
    with S.as_called(case):
        agreement(target, case, S.paged(target, case, params["page_size"], layout, params["seed"], pool=params["pool"]))


@prop(requires=S.REQUIRES, draw=S.DRAW, params=S.per_sequence)
def test_page_placement_bitwise(target: Target, case: Case, params: dict):
    """Two random placements of the same pages (same page size) give the same output, bit for bit."""
    layout = _layout(target, params, case)
    case = S.problem_of(case, params, queries=False)
    a = S.paged(target, case, params["page_size"], layout, params["seed"], pool=params["pool"])  # (B, H, Lq, Ev)
    b = S.paged(target, case, params["page_size"], layout, params["seed"] + 1)  # another pool size too, mostly
    with S.as_called(case):
        unchanged("page_placement_bitwise", a, b, case.judged_rows(), "the pages placed elsewhere in the pool")


@prop(requires=S.REQUIRES, draw=S.DRAW, params=S.per_sequence)
def test_paged_shared_prefix(target: Target, case: Case, params: dict):
    """Sequences with a common prompt prefix whose pages their block tables share (prefix caching), read
    only: the reference's output, and bit for bit the output of the same keys in pages of their own."""
    layout = _layout(target, params, case)
    case, n = S.shared_prefix(S.problem_of(case, params, queries=False), params["page_size"])
    shared = S.paged(target, case, params["page_size"], layout, params["seed"], pool=params["pool"])  # (B, H, Lq, Ev)
    with S.as_called(case):
        agreement(target, case, shared)
        own = S.paged(target, case, params["page_size"], layout, params["seed"], pool=params["pool"], share=False)
        unchanged("paged_shared_prefix", shared, own, case.judged_rows(),
                  f"the first {n} keys in pages of each sequence's own instead of shared ones")


@prop(requires=S.REQUIRES, draw=S.DRAW, params=S.per_sequence)
def test_paged_layouts_agree(target: Target, case: Case, params: dict):
    """NHD, HND and stacked (one K/V tensor) caches of the same pages give the same output, each within
    its budget: the first layout the backend declares against another, drawn (two calls an example,
    whatever the number of layouts: each pair is met over the examples).

    Within both budgets, not bit for bit: a kernel may tile each layout its own way (two HND pages an
    online-softmax step, one NHD page), which rounds differently and is correct; a wrong read (K and V
    halves swapped, a half at the wrong page stride, HND's axes crossed) differs by far more."""
    layouts = S.paged_layouts(target)
    if len(layouts) < 2:
        import pytest
        pytest.skip(f"{target.name} takes one paged layout ({', '.join(layouts) or 'none'})")
    pair = (layouts[0], layouts[1 + params["seed"] % (len(layouts) - 1)])
    E, Ev = case.k.shape[-1], case.v.shape[-1]
    if Ev != E and any(x.startswith("stacked-") for x in pair):  # one stacked tensor holds Ev == E only:
        v = np.concatenate([case.v] * -(-E // Ev), axis=-1)[..., :E]  # the drawn values, E of them
        case = case.replace(v=v)
    case = S.problem_of(case, params, queries=False)
    first, other = (S.paged(target, case, params["page_size"], layout, params["seed"]) for layout in pair)
    with S.as_called(case):
        close_outputs("paged_layouts_agree", target, case, first, other, case, f"{pair[0]} against {pair[1]}")


def _with_view(draw, case: Case, target: Target) -> dict:
    """per_sequence's params and the strided view the caches come as (backends/cache_views.py)."""
    from hypothesis import strategies as st

    taken = target.caps.paged_cache_views or CACHE_VIEWS  # () skips the property
    return {**S.per_sequence(draw, case, target), "cache_view": draw(st.sampled_from(taken), label="cache view")}


@prop(requires=S.REQUIRES, draw=S.DRAW, params=_with_view)
def test_paged_cache_views(target: Target, case: Case, params: dict):
    """Caches handed as strided views of larger storage equal the reference: K and V the halves of one
    blocks-first (pages, 2, ...) pool (FlashInfer's layout; vLLM's hybrid attention+Mamba caches), each row
    inside a wider one, NaN around it (MLA's slices of one cache row), the declared layout a view of the other
    one's storage, each page followed by padding (vLLM's page_size_padded).  A kernel that reads with a dense
    tensor's strides reads the other half, NaN or the crossed axis (ROCm/aiter#3498,
    vllm-project/vllm-xpu-kernels#165); one that counts the page stride in whole slots misreads padded pages
    (vllm-project/vllm-xpu-kernels#303).  With "append" declared, an append through the views too
    (flashinfer-ai/flashinfer#527, a page append's stride bug): the caches after it the reference update.
    Neither call may write into the NaN around a row or page (memory the cache does not own).
    A backend declaring contiguous caches only (Capabilities.paged_cache_views) is skipped; one declaring some
    views is handed those."""
    if not target.caps.paged_cache_views:
        import pytest
        pytest.skip(f"{target.name} takes contiguous paged caches only (Capabilities.paged_cache_views)")
    layout = _layout(target, params, case)
    case = S.problem_of(case, params, queries=False)
    views = [v for v in views_for(layout, params["page_size"], case.k.shape[1], case.k.shape[-1], case.v.shape[-1])
             if v in target.caps.paged_cache_views]
    from hypothesis import assume

    assume(views)  # empty only for a backend taking pool halves or a transposed storage alone, where they cannot be
    view = params["cache_view"] if params["cache_view"] in views else views[0]
    with S.as_called(case):
        agreement(target, case, S.paged(target, case, params["page_size"], layout, params["seed"], pool=params["pool"],
                                        cache_view=view))
    if "append" in target.caps.formats:  # written through the views too (a cache write into vLLM's halves)
        _appended_as_the_reference(target, case, params, layout, "paged_cache_views", cache_view=view)


def _full_cache(target: Target) -> list:
    """Decode steps (Lq = 1) and chunks against caches exactly full and one key past a page; left padding
    of 129 and 256 keys (past a 128-key block: a kernel that skips the padding's whole blocks and masks the
    rest with an offset not made block-relative hides the first real keys)."""
    from attnspec.properties.case import Case
    from attnspec.properties.draws import in_format, row_seed

    cases = []
    for case, params in S.edge_cases(target):
        case = case.replace(q_lengths=None)
        cases.append((case, {**params, "page_size": 4}))
    rng = np.random.default_rng(row_seed("left padding past a key block"))  # each row's data by its label
    q, k, v = (in_format(rng.standard_normal((2, 2, L, 8)), target.budget_dtype) for L in (2, 300, 300))
    fields = {"kv_lengths": np.array([300, 290]), "kv_starts": np.array([129, 256]), "positions": "per_sequence"}
    cases.append((Case(q, k, v, None, False, None, fields, label="left padding past a key block"),
                  {"seed": len(cases), "page_size": 4}))
    # a cache that is left padding all through (kv_starts = kv_lengths): an empty-sequence guard on
    # cache_seqlens alone lets its rows through as NaN
    rng = np.random.default_rng(row_seed("a cache all left padding"))
    q, k, v = (in_format(rng.standard_normal((2, 2, L, 8)), target.budget_dtype) for L in (1, 9, 9))
    fields = {"kv_lengths": np.array([5, 9]), "kv_starts": np.array([5, 2]), "positions": "per_sequence"}
    cases.append((Case(q, k, v, None, False, None, fields, label="a cache all left padding"),
                  {"seed": len(cases), "page_size": 4}))
    # pages over 128 keys (a kernel whose in-page slot index is a 128-key tile's misreads slots 128 and up:
    # flashinfer#4347); the draws give 256-key pages a cache that long only by chance
    rng = np.random.default_rng(row_seed("3 queries against 300 and 200 keys in 256-key pages"))
    q, k, v = (in_format(rng.standard_normal((2, 2, L, 8)), target.budget_dtype) for L in (3, 300, 300))
    fields = {"kv_lengths": np.array([300, 200]), "positions": "per_sequence"}
    cases.append((Case(q, k, v, None, False, None, fields, label="3 queries against 300 and 200 keys in 256-key pages"),
                  {"seed": len(cases), "page_size": 256}))
    # decodes past 512 keys again with grouped heads and each variant the backend takes: a multi-partition
    # decode kernel (vLLM's paged_attention_v2) has a KV-head map and a launch of its own, which may leave
    # a field out
    variants = {"gqa": {}, "alibi": {"alibi_slopes": 2.0 ** -np.arange(1.0, 9.0, 2.0)}, "softcap": {"softcap": 1.0},
                "sinks": {"sinks": np.array([3.0, 7.0, -1.0, 5.0])}}
    H = 4 if target.supports("gqa") else 2
    rng = np.random.default_rng(row_seed("decodes past 512-key splits"))
    q, k, v = (in_format(rng.standard_normal((3, h, L, 8)), target.budget_dtype) for h, L in ((H, 1), (2, 1537), (2, 1537)))
    for feature, extra in variants.items():
        if target.supports(feature):
            fields = {"kv_lengths": np.array([1000, 513, 1537]), "positions": "per_sequence",
                      **({"enable_gqa": True} if H > 2 else {}),
                      # the anchors' alignment, where the backend takes it (ALiBi's distances depend on it)
                      **({"causal_alignment": "bottom_right"} if "bottom_right" in target.alignments else {}),
                      **{n: x if np.ndim(x) == 0 else x[:H] for n, x in extra.items()}}  # per query head: H of them
            label = f"decodes past 512-key splits, {feature}, {H} query heads on 2 KV heads"
            cases.append((Case(q, k, v, None, False, None, fields, label=label), {"seed": len(cases), "page_size": 16}))
    # a long decode's window (a partition the window ends inside is masked too, not only the last) and ALiBi
    # under left padding (distances from the query's own position, the padding counted in neither)
    rng = np.random.default_rng(row_seed("decodes past 512 keys, causal"))
    q, k, v = (in_format(rng.standard_normal((2, 2, L, 8)), target.budget_dtype) for L in (1, 1000, 1000))
    long_decodes = {"window": {"window": (100, 0)},
                    "alibi": {"alibi_slopes": np.array([2.0 ** -1, 2.0 ** -5]), "kv_starts": np.array([3, 40])}}
    for feature, extra in long_decodes.items():
        if target.supports(feature) and "bottom_right" in target.alignments:
            fields = {"kv_lengths": np.array([1000, 700]), "positions": "per_sequence",
                      "causal_alignment": "bottom_right", **extra}
            cases.append((Case(q, k, v, None, True, None, fields, label=f"decodes past 512 keys, causal, {feature}"
                               + (", left padding 3 and 40" if "kv_starts" in extra else "")),
                          {"seed": len(cases), "page_size": 16}))
    # a decode's window whose left edge falls inside a page (key 5 of 7; key 8 of 10 starts a page)
    if target.supports("window") and "bottom_right" in target.alignments:
        rng = np.random.default_rng(row_seed("decode window (1, 0) from inside a page"))
        q, k, v = (in_format(rng.standard_normal((2, 2, L, 8)), target.budget_dtype) for L in (1, 10, 10))
        fields = {"kv_lengths": np.array([7, 10]), "positions": "per_sequence", "window": (1, 0),
                  "causal_alignment": "bottom_right"}
        cases.append((Case(q, k, v, None, True, None, fields, label="decode window (1, 0) from inside a page"),
                      {"seed": len(cases), "page_size": 4}))
    return [(target.exact(case), params) for case, params in cases]  # fp8: rounded to its formats


@prop(requires=S.REQUIRES, grid=_full_cache)
def test_paged_edges(target: Target, case: Case, params: dict):
    """Edge problems in a paged cache of 4-key pages (16 for the long decodes' variants), no spare table
    column: empty sequences, one key, 63/64/65 keys (64: a cache exactly full, its table too), more queries
    than keys, one sequence (its pages scattered over the pool), decodes at head dims 512 and 576, decodes
    past 512-key splits (again with grouped heads and with ALiBi, a softcap or sinks where the backend takes
    them, and causal with a window or with ALiBi under left padding), 3..6 queries against
    keys past 512, left padding past a key block and through a whole cache, a decode's window from inside a page;
    with the LSE feature, each call's LSE too (a decode path's own LSE: the draws seldom decode)."""
    layout = _layout(target, {"layout": "NHD"}, case)
    with S.as_called(case):
        out = agreement(target, case, S.paged(target, case, params["page_size"], layout, params["seed"], spare_columns=0))
        if target.supports("lse"):
            _, lse = S.paged(target, case, params["page_size"], layout, params["seed"], spare_columns=0,
                             return_lse=True)  # (B, H, Lq)
            require(S.lse_verdict(target, case, lse))
    if target.backend.semantics.fully_masked == "zeros":
        unchanged("paged_edges", np.zeros_like(out), out, ~case.judged_rows(), "a row that sees no key")


@prop(requires=S.REQUIRES + ("lse",), draw=S.DRAW, params=S.per_sequence)
def test_paged_lse_matches_reference(target: Target, case: Case, params: dict):
    """A paged call's LSE equals the reference's, pages of 1 to 256 keys: a split-KV kernel that merges
    its pages' outputs right and returns one split's LSE shows here (a merge of that LSE would not)."""
    layout = _layout(target, params, case)
    case = S.problem_of(case, params, queries=False)
    with S.as_called(case):
        _, lse = S.paged(target, case, params["page_size"], layout, params["seed"], pool=params["pool"],
                         return_lse=True)  # (B, H, Lq)
        require(S.lse_verdict(target, case, lse))


def _appending(target: Target) -> None:
    if "append" not in target.caps.formats:
        import pytest
        pytest.skip(f"{target.name} takes no append (declares {', '.join(target.caps.formats)})")


@prop(requires=S.REQUIRES, draw=S.DRAW, params=S.per_sequence)
def test_append_writes_its_slots_only(target: Target, case: Case, params: dict):
    """After an append (a decode step or a chunk) the cache is the reference update bit for bit - every
    other slot, NaN ones included, unchanged - and the output attends over the grown cache."""
    from hypothesis import assume

    _appending(target)
    layout = _layout(target, params, case)
    case = S.problem_of(case, params, queries=False)
    assume(_appended_as_the_reference(target, case, params, layout, "append_writes_its_slots_only"))


def _appended_as_the_reference(target: Target, case: Case, params: dict, layout: str, name: str,
                               cache_view: str = "") -> bool:
    """A decode step's or a chunk's append judged (False: no sequence has room for one): the caches after it
    the reference update bit for bit, the output the reference's over the grown cache."""
    ends = case.lengths("kv")
    room = int((ends - case.fields.get("kv_starts", 0)).min())
    n = min(1 if params["seed"] % 2 else case.dims["Lq"], room)  # a decode step, or a chunk of Lq
    if n <= 0:
        return False
    out, stored, want = S.append(target, case, n, params["page_size"], layout, params["seed"], cache_view=cache_view)
    for cache, got, ref in zip(("k_cache", "v_cache"), stored, want, strict=True):
        same = (got == ref) | (np.isnan(got) & np.isnan(ref))
        where = None if same.all() else tuple(int(i) for i in np.argwhere(~same)[0])
        require(verdict(name, same.all(), where, float((~same).sum()),
                        f"{cache} after appending {n} key(s) a sequence{f' through {cache_view} views' * bool(cache_view)}"
                        f": slot {where} (page, ...) differs from the reference update ({int((~same).sum())} values)", 0.0))
    with S.as_called(case):
        agreement(target, case, out)
    return True


@prop(requires=S.REQUIRES, draw=S.DRAW.but(kinds=("causal",)), params=S.per_sequence)
def test_chunks_concatenate_to_prefill(target: Target, case: Case, params: dict):
    """A prompt's queries split in two chunks, each against the cache as it stood then (the first against
    the keys before the second chunk's), concatenate to the whole call: chunked prefill attends to the
    past, not only within its chunk (kekzl/imp#117)."""
    from hypothesis import assume

    layout = _layout(target, params, case)
    S.bottom_right(target, "a chunk's queries are not placed after the cache")
    case = S.problem_of(case, params, queries=False).replace(causal_alignment="bottom_right")  # the cache's
    Lq = case.dims["Lq"]
    c = Lq // 2
    ends, starts = S.ends_and_starts(case)
    early = ends - (Lq - c)  # (B,) the cache when the first chunk ran
    assume(c > 0 and (early >= starts).all())
    whole = S.paged(target, case, params["page_size"], layout, params["seed"])  # (B, H, Lq, Ev)
    first = case.replace(q=case.q[:, :, :c], kv_lengths=early)
    second = case.replace(q=case.q[:, :, c:])
    parts = np.concatenate([S.paged(target, first, params["page_size"], layout, params["seed"]),
                            S.paged(target, second, params["page_size"], layout, params["seed"])], axis=2)
    with S.as_called(case):
        close_outputs("chunks_concatenate_to_prefill", target, case, parts, whole, case, f"chunks of {c} and {Lq - c}")


DECODE_STEPS = 8  # the prefill's last rows replayed as decode steps (a call each)


@prop(requires=S.REQUIRES, draw=S.DRAW.but(kinds=("causal",)), params=S.per_sequence)
def test_paged_decode_steps_match_prefill(target: Target, case: Case, params: dict):
    """Decode steps - one query a sequence, against the cache as it stood at that token - reproduce the
    causal prefill's rows: its last row is a step over the whole cache, each earlier row a step over the
    cache one key shorter (up to the last DECODE_STEPS rows)."""
    from hypothesis import assume

    layout = _layout(target, params, case)
    S.bottom_right(target, "a decode step's query is not placed after the cache")
    case = S.problem_of(case, params, queries=False).replace(causal_alignment="bottom_right")
    Lq = case.dims["Lq"]
    ends, starts = S.ends_and_starts(case)
    first = max(0, int((Lq - (ends - starts)).max()), Lq - DECODE_STEPS)  # every sequence's step sees a key
    assume(first < Lq)
    whole = S.paged(target, case, params["page_size"], layout, params["seed"])  # (B, H, Lq, Ev)
    steps = whole.copy()
    for t in range(first, Lq):
        step = case.replace(q=case.q[:, :, t:t + 1], kv_lengths=ends - (Lq - 1 - t))  # query t after its keys
        steps[:, :, t:t + 1] = S.paged(target, step, params["page_size"], layout, params["seed"])
    with S.as_called(case):
        close_outputs("paged_decode_steps_match_prefill", target, case, steps, whole, case,
                      f"rows {first}..{Lq - 1} as decode steps against the prefill's")


@prop(requires=S.REQUIRES, draw=S.DRAW, params=S.per_sequence)
def test_paged_left_padding_equals_unpadded(target: Target, case: Case, params: dict):
    """A cache left-padded by p keys (cache_leftpad) gives the output of the same keys unpadded: the
    padding is never read and moves no position (the diagonal, ALiBi's distances)."""
    from hypothesis import assume

    layout = _layout(target, params, case)
    case = S.problem_of(case, params, queries=False)
    ends, starts = S.ends_and_starts(case)
    if not starts.any():  # no padding drawn: a key of padding for every sequence that has two
        starts = np.minimum(1, np.maximum(ends - 1, 0))
        assume(starts.any())
        case = case.replace(kv_starts=starts)
    B = case.dims["B"]
    k, v = (np.zeros((B,) + x.shape[1:]) for x in (case.k, case.v))  # (B, Hkv, Lk, ·)
    for b in range(B):  # sequence b's keys moved to the front
        k[b, :, :ends[b] - starts[b]] = np.broadcast_to(case.k, k.shape)[b, :, starts[b]:ends[b]]
        v[b, :, :ends[b] - starts[b]] = np.broadcast_to(case.v, v.shape)[b, :, starts[b]:ends[b]]
    unpadded = case.replace(k=k.astype(case.k.dtype), v=v.astype(case.v.dtype), kv_lengths=ends - starts,
                            kv_starts=None)
    padded = S.paged(target, case, params["page_size"], layout, params["seed"])  # (B, H, Lq, Ev)
    flat = S.paged(target, unpadded, params["page_size"], layout, params["seed"])
    with S.as_called(case):
        close_outputs("paged_left_padding_equals_unpadded", target, case, padded, flat, unpadded,
                      f"left-padded by {starts.tolist()} against the same keys unpadded")
