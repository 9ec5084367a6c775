"""Family: a backend's merge entry point - attention states over disjoint keys merged through their
LSEs: two (FlashInfer's merge_state, vLLM's merge_attn_states: `Backend.native_merge`) or a list at
once (FA3's flash_attn_combine over its splits, FlashInfer's merge_states: `Backend.native_merge_states`),
both called as `Backend.merge(parts, dtype)`, like `specs.reference.merge(parts)`.

Backends offering a merge are checked against `specs.reference.merge` on drawn states:
empty ones (LSE -inf; +inf where the backend declares `empty_lse = "+inf"`, FA2's, which vLLM's
merge maps to -inf), huge gaps (1e4: one state's weight underflows), each within
`specs.merge_budget`; the merge regrouped and permuted (commutative and associative, FlashInfer's
recursive attention) within both groupings' budgets; two empty states exactly (0, -inf)
(flashinfer#4051 gave NaN); rows whose states tie exactly (their mean).  A list merge also on 1 to 6
states at once, and on 8, 9, 17 and 64 (past a combine's fixed split count): permuted, regrouped
(merge([merge(a, b), c]) and merge([a, merge(b, c)]), a list split anywhere), every state empty
exactly (0, -inf): a combine that drops the last split, or shifts by the first split's LSE rather than
the largest, fails here.  Both hooks again with the states handed as strided views (a transposed LSE:
vllm-project/vllm#22003); states 512 values wide (MLA's), past a merge's 256-column loop.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from attnspec.properties.distribution import cases
from attnspec.properties.explore import prop
from attnspec.properties.judge import require, shown, verdict, worst
from attnspec.specs import reference
from attnspec.specs.error_budget import round_to
from attnspec.specs.fp8 import is_fp8
from attnspec.specs.merge_budget import merge_allowed

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target

GAPS = (0.0, 30.0, 1e4)  # spread of the states' LSEs: alike, far (weights ~e^-30), underflowing
EMPTY = (0.0, 0.3, 1.0)  # share of empty states
# share of rows whose states all hold one finite LSE, exactly (drawn LSEs never tie by chance, yet equal
# halves of a row of equal scores do): a merge that picks "the larger" and "the smaller" state by strict
# comparisons returns one of them there, not their mean
TIED = (0.0, 0.5)
_SMALL = cases(kinds=("none",), regimes=("small",))  # the problem only sizes the states


LIST = (1, 6)  # states a list merge is drawn with: one (the state itself) to six splits,
MANY = (8, 9, 17, 64)  # or more than a combine kernel's fixed split count (8, 16, ...) holds, and one past


def _offered(target: Target, parts: int = 2) -> None:
    if not target.backend.offers_merge(parts):
        import pytest
        pytest.skip(f"{target.name} offers no merge" + (" (Backend.native_merge)" if parts == 2 else
                                                         " of a list of states (Backend.native_merge_states)"))
    if is_fp8(target.dtype):  # states are outputs: in the output's dtype, judged at the float dtypes
        import pytest
        pytest.skip("merge states are attention outputs, not fp8 inputs: the merge is judged at the float dtypes")


def _states(draw, case: Case, target: Target, count: int = 3, least: tuple = (0, 0, 0, 0)) -> dict:
    """`count` states shaped like the case's output (each axis at least `least`'s), exact in the dtype; LSEs
    exact in float32."""
    B, H, Lq, Ev = (max(n, m) for n, m in zip(case.q.shape[:-1] + case.v.shape[-1:], least, strict=True))
    seed = draw(st.integers(0, 2**16), label="states seed")
    gap, empty = draw(st.sampled_from(GAPS), label="LSE gap"), draw(st.sampled_from(EMPTY), label="empty share")
    tied_share = draw(st.sampled_from(TIED), label="tied share")
    rng = np.random.default_rng(seed)
    tied = rng.random((B, H, Lq)) < tied_share  # (B, H, Lq)
    out, first = [], None
    for _ in range(count):
        o = np.asarray(round_to(rng.standard_normal((B, H, Lq, Ev)), target.dtype), dtype=np.float64)
        lse = rng.standard_normal((B, H, Lq)) * 3 + rng.integers(-1, 2, (B, H, Lq)) * gap  # (B, H, Lq)
        first = lse if first is None else first
        lse = np.where(tied, first, lse)  # tied rows: the first state's LSE (where neither is empty)
        lse = np.where(rng.random((B, H, Lq)) < empty, -np.inf, np.float32(lse).astype(np.float64))
        out.append((np.where(np.isfinite(lse)[..., None], o, 0.0), lse))  # an empty state holds zeros
    return {"states": out}


def _as_given(target: Target, lse):
    """An empty state in the backend's declared convention: +inf where it declares FA2's."""
    return np.where(lse == -np.inf, np.inf, lse) if target.backend.semantics.empty_lse == "+inf" else lse


def _list(draw, case: Case, target: Target) -> dict:
    """1 to 6 states (or many: MANY), a permutation of them and a place to split the list."""
    count = draw(st.one_of(st.integers(*LIST), st.sampled_from(MANY)), label="states")
    found = _states(draw, case, target, count)
    found["order"] = draw(st.permutations(range(count)), label="permutation")
    found["cut"] = draw(st.integers(0, count), label="split the list after")
    return found


def _merge(target: Target, *parts, as_list: bool = False, layout: str = "contiguous"):
    """The backend's merge of parts [(o, lse)], empty states given in its declared convention; as_list: through
    its list hook whatever the count; layout: its native arrays handed with those strides (Backend.merge)."""
    o, lse = target.call_backend("merge", target.backend.merge, [(o, _as_given(target, lse)) for o, lse in parts],
                                 target.dtype, as_list=as_list, layout=layout)
    empty_given = np.inf if target.backend.semantics.empty_lse == "+inf" else -np.inf
    return o, np.where(lse == empty_given, -np.inf, lse)  # (B, H, Lq, Ev), (B, H, Lq): empty as -inf


def _judge(name: str, target: Target, got, parts, what: str, times: int = 1) -> None:
    """got (o, lse) against the reference merge of parts within `times` merges' budgets; rows where every
    part is empty exactly (0, -inf)."""
    want_o, want_lse = reference.merge(parts)  # (B, H, Lq, Ev), (B, H, Lq)
    o_tol, lse_tol = merge_allowed(parts, target.budget_dtype)
    empty = np.isneginf(want_lse)  # (B, H, Lq)
    bad_empty = empty & (np.any(got[0] != 0, axis=-1) | (got[1] != -np.inf))
    where, _ = worst(bad_empty.astype(float), bad_empty)
    require(verdict(name, not bad_empty.any(), where, float("nan"),
                    f"{what}: row {where} (batch, head, query) merges only empty states, so must be exactly "
                    f"(0, -inf); got lse {got[1][where] if where is not None else ''!r}", 0.0))
    with np.errstate(invalid="ignore"):
        excess = np.where(empty[..., None], 0.0, np.abs(got[0] - want_o) - times * o_tol)  # (B, H, Lq, Ev)
        lse_excess = np.where(empty, 0.0, np.abs(got[1] - want_lse) - times * lse_tol)  # (B, H, Lq)
    where, amount = worst(excess, ~empty[..., None] & np.ones_like(excess, dtype=bool))
    require(verdict(name, amount <= 0, where, amount,
                    f"{what}: merged output at {where} (batch, head, query, column) is "
                    f"{shown(excess, where, amount)} past its budget (specs.merge_budget)", 0.0))
    where, amount = worst(lse_excess, ~empty)
    require(verdict(name, amount <= 0, where, amount,
                    f"{what}: merged LSE at {where} (batch, head, query) is {shown(lse_excess, where, amount)} past "
                    "its budget", 0.0))


@prop(draw=_SMALL, params=_states)
def test_merge_matches_reference(target: Target, case: Case, params: dict):
    """merge(a, b) equals specs.reference.merge([a, b]) within the merge's budget; empty pairs (0, -inf)."""
    _offered(target)
    a, b, _ = params["states"]
    _judge("merge_matches_reference", target, _merge(target, a, b), [a, b], "merge(a, b)")


# the states' layouts a merge is handed (Backend.merge): an LSE that is a transposed view of a (Lq, H) buffer
# (vllm-project/vllm#22003: a cascade's output corrupted by a non-contiguous LSE), an offset view, a permuted one
MERGE_LAYOUTS = ("transposed", "offset", "permuted")


def _strided_states(draw, case: Case, target: Target) -> dict:
    """Three states with at least 2 batch elements and heads, 3 rows and 2 columns: a view that swaps two axes
    of length 1 reads the same bytes, so a strides bug needs two of each."""
    return _states(draw, case, target, 3, least=(2, 2, 3, 2))


@prop(draw=_SMALL, params=_strided_states)
def test_merge_layouts_agree(target: Target, case: Case, params: dict):
    """The states handed with other strides (each layout of MERGE_LAYOUTS the backend declares): merge(a, b),
    and merge([a, b, c]) where it merges lists, each the reference merge within its budget - a combine that
    reads its LSEs (or outputs) as dense arrays reads other rows' values."""
    _offered(target)
    layouts = [x for x in MERGE_LAYOUTS if x in target.caps.layouts]
    if not layouts:
        import pytest
        pytest.skip(f"{target.name} declares none of the layouts {MERGE_LAYOUTS} (Capabilities.layouts)")
    a, b, c = params["states"]
    for layout in layouts:
        _judge("merge_layouts_agree", target, _merge(target, a, b, layout=layout), [a, b], f"merge(a, b), {layout}")
        if target.backend.offers_merge(3):
            _judge("merge_layouts_agree", target, _merge(target, a, b, c, as_list=True, layout=layout), [a, b, c],
                   f"merge([a, b, c]), {layout}")


@prop(draw=_SMALL, params=_states)
def test_merge_regrouped_and_permuted(target: Target, case: Case, params: dict):
    """merge(merge(a, b), c), merge(a, merge(b, c)) and merge(merge(c, a), b): each the reference merge of
    the three within two merges' budgets (so the groupings agree within both)."""
    _offered(target)
    a, b, c = params["states"]
    for what, got in (("merge(merge(a, b), c)", lambda: _merge(target, _merge(target, a, b), c)),
                      ("merge(a, merge(b, c))", lambda: _merge(target, a, _merge(target, b, c))),
                      ("merge(merge(c, a), b)", lambda: _merge(target, _merge(target, c, a), b))):
        _judge("merge_regrouped_and_permuted", target, got(), [a, b, c], what, times=2)


def _two_empty(target: Target):
    from attnspec.properties.case import Case as C
    z = np.zeros((1, 2, 3, 4))  # (B, H, Lq, E): only the shapes matter
    return [(C(z, z, z), {"states": [(z.copy(), np.full((1, 2, 3), -np.inf))] * 3})]


WIDE = (1, 2, 65, 512)  # (B, H, Lq, Ev): MLA's 512-wide values (DeepSeek's absorbed decode), past a 64-row tile


def _wide_states(target: Target):
    """Three finite states 512 values wide over 65 rows, seeded by their label (the drawn ones are a few columns
    wide: a merge whose value loop covers 256 columns, flashinfer#761's head-dim dispatch, never shows there)."""
    from attnspec.properties.case import Case as C
    from attnspec.properties.draws import row_seed
    rng = np.random.default_rng(row_seed("merge: three states 512 values wide"))
    B, H, Lq, Ev = WIDE
    states = [(np.asarray(round_to(rng.standard_normal(WIDE), target.dtype), dtype=np.float64),  # (B, H, Lq, Ev)
               np.float32(rng.standard_normal((B, H, Lq)) * 3).astype(np.float64)) for _ in range(3)]  # (B, H, Lq)
    z = np.zeros((B, H, Lq, 4))  # (B, H, Lq, E): only the shapes matter
    return [(C(z, z, np.zeros(WIDE)), {"states": states})]


@prop(grid=_wide_states)
def test_merge_wide_values(target: Target, case: Case, params: dict):
    """States 512 values wide: merge(a, b), and merge([a, b, c]) where a list merge is offered, each the reference
    merge within its budget (a merge that writes the first 256 columns leaves the rest 0)."""
    _offered(target)
    a, b, c = params["states"]
    _judge("merge_wide_values", target, _merge(target, a, b), [a, b], "merge(a, b) of 512-wide states")
    if target.backend.offers_merge(3):
        _judge("merge_wide_values", target, _merge(target, a, b, c, as_list=True), [a, b, c],
               "merge([a, b, c]) of 512-wide states")


MANY_SPLITS = 257  # past a combine kernel instantiated for 128 or 256 splits (deepseek-ai/FlashMLA#199: 160..256)


def _many_states(target: Target):
    """257 finite states over 9 rows, seeded by their label, the last state's LSE 6 above the rest in every row
    (the draws give at most 64 states: a list merge that reads the first 128 or 256 splits drops the heaviest)."""
    from attnspec.properties.case import Case as C
    from attnspec.properties.draws import row_seed
    rng = np.random.default_rng(row_seed("merge: 257 states"))
    shape = (1, 2, 9, 16)  # (B, H, Lq, Ev)
    lses = rng.standard_normal((MANY_SPLITS,) + shape[:-1]) * 3  # (C, B, H, Lq)
    lses[-1] += 6.0
    states = [(np.asarray(round_to(rng.standard_normal(shape), target.dtype), dtype=np.float64),  # (B, H, Lq, Ev)
               np.float32(lse).astype(np.float64)) for lse in lses]  # (B, H, Lq)
    z = np.zeros(shape)  # (B, H, Lq, E): only the shapes matter
    return [(C(z, z, z), {"states": states})]


@prop(grid=_many_states)
def test_merge_many_splits(target: Target, case: Case, params: dict):
    """merge([s_1, ..., s_257]) in one call, where a list merge is offered: the reference merge within the
    budget of merging 257 states (a combine that reads at most 128 or 256 splits drops the last)."""
    states = params["states"]
    _offered(target, MANY_SPLITS)
    _judge("merge_many_splits", target, _merge(target, *states, as_list=True), states,
           f"merge of {len(states)} states")


@prop(grid=_two_empty)
def test_merge_of_empty_states(target: Target, case: Case, params: dict):
    """Two empty states merge to exactly (0, -inf): no exp(-inf - -inf) = NaN (flashinfer#4051)."""
    _offered(target)
    a, b, _ = params["states"]
    _judge("merge_of_empty_states", target, _merge(target, a, b), [a, b], "merge of two empty states")


# ---- a list merge (FA3's flash_attn_combine) ---------------------------------------------------------

@prop(draw=_SMALL, params=_list)
def test_merge_states_matches_reference(target: Target, case: Case, params: dict):
    """merge([s_1, ..., s_C]) in one call, C from 1 to 6 or one of MANY, equals specs.reference.merge within the budget of
    merging C states; rows where every state is empty exactly (0, -inf)."""
    states = params["states"]
    _offered(target, LIST[1])
    _judge("merge_states_matches_reference", target, _merge(target, *states, as_list=True), states,
           f"merge of {len(states)} state{'s' * (len(states) != 1)}")


@prop(draw=_SMALL, params=_list)
def test_merge_states_permuted_and_regrouped(target: Target, case: Case, params: dict):
    """The list permuted, and split in two at a drawn place with each part merged first: each the reference
    merge of all within two merges' budgets (a merge that drops a split, or weighs by position, differs)."""
    states, cut = params["states"], params["cut"]
    _offered(target, LIST[1])
    shuffled = [states[i] for i in params["order"]]
    _judge("merge_states_permuted_and_regrouped", target, _merge(target, *shuffled, as_list=True), states,
           f"merge of the {len(states)} states in the order {list(params['order'])}")
    head, tail = states[:cut], states[cut:]
    grouped = [_merge(target, *part, as_list=True) for part in (head, tail) if part]
    _judge("merge_states_permuted_and_regrouped", target, _merge(target, *grouped, as_list=True), states,
           f"merge([merge(states[:{cut}]), merge(states[{cut}:])])", times=2)


@prop(draw=_SMALL, params=lambda draw, case, target: _states(draw, case, target, 3))
def test_merge_states_associative(target: Target, case: Case, params: dict):
    """merge([merge([a, b]), c]) and merge([a, merge([b, c])]) as lists: each the reference merge of the three
    within two merges' budgets, so the groupings agree within both."""
    _offered(target, 3)
    a, b, c = params["states"]
    for what, got in (("merge([merge([a, b]), c])", lambda: _merge(target, _merge(target, a, b), c)),
                      ("merge([a, merge([b, c])])", lambda: _merge(target, a, _merge(target, b, c)))):
        _judge("merge_states_associative", target, got(), [a, b, c], what, times=2)


def _all_empty(target: Target):
    from attnspec.properties.case import Case as C
    z = np.zeros((1, 2, 3, 4))  # (B, H, Lq, E): only the shapes matter
    return [(C(z, z, z), {"states": [(z.copy(), np.full((1, 2, 3), -np.inf))] * count}) for count in (1, 3, 5)]


@prop(grid=_all_empty)
def test_merge_states_of_empty_states(target: Target, case: Case, params: dict):
    """One, three or five empty states merge to exactly (0, -inf) (FA3's combine of splits that saw nothing)."""
    states = params["states"]
    _offered(target, LIST[1])
    _judge("merge_states_of_empty_states", target, _merge(target, *states, as_list=True), states,
           f"merge of {len(states)} empty states")
