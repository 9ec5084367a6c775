"""Family: packed calls (cu_seqlens) - flash_attn_varlen_func's format (issue 30).

Run only on backends that declare per-sequence positions and the ``packed`` format.  A drawn
padded problem with per-sequence lengths (and sometimes left padding) is lowered to the packed
form (`specs.formats.to_packed`) with NaN in every token nothing may read - past
``cu_seqlens[-1]``, past ``seqused_k`` - and the output raised back.  Bugs this catches:
alignment by the padded lengths instead of each sequence's (every anchor aligns per sequence),
reading past ``cu_seqlens`` or using the padded seqlen_k (vllm-project/flash-attention#18), one
sequence leaking into another, zero-length sequences and ``total_q < B``
(Dao-AILab/flash-attention#1537, #1619).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnspec.backends import serving
from attnspec.properties import serving_calls as S
from attnspec.properties.distribution import cases
from attnspec.properties.explore import prop
from attnspec.properties.judge import agreement, close_outputs, require, unchanged, verdict

if TYPE_CHECKING:
    from attnspec.properties.case import Case
    from attnspec.properties.target import Target


@prop(requires=S.REQUIRES, draw=S.DRAW, params=S.per_sequence)
def test_per_sequence_positions(target: Target, case: Case, params: dict):
    """A padded batch that declares per-sequence positions: each sequence aligned at its own lengths
    (and left padding), not at the padded Lk - Lq."""
    _padded_agrees(target, case, params)


def _padded_agrees(target: Target, case: Case, params: dict) -> None:
    """The case with per-sequence positions (and drawn left padding), as a padded call, within the budget."""
    if "padded" not in target.caps.formats:
        import pytest
        pytest.skip(f"{target.name} takes no padded call (its format's own properties check it)")
    case = S.problem_of(case, params)
    with S.as_called(case):
        agreement(target, case)


# What a padded call takes and the formats do not: a mask (or its keys as a -inf bias), a bias, segment ids.
# An adapter that routes per-sequence problems to a varlen kernel (no mask, bias or segment argument) drops them.
@prop(requires=S.REQUIRES, draw=cases(kinds=("mask", "causal_mask")), params=S.per_sequence)
def test_per_sequence_positions_keep_the_mask(target: Target, case: Case, params: dict):
    """Per-sequence positions beside hidden keys (a boolean mask, or the same keys as a -inf bias)."""
    _padded_agrees(target, case, params)


@prop(requires=S.REQUIRES + ("bias",), draw=cases(kinds=("none", "causal")), params=S.per_sequence)
def test_per_sequence_positions_keep_the_bias(target: Target, case: Case, params: dict):
    """Per-sequence positions beside an additive bias."""
    _padded_agrees(target, case, params)


@prop(requires=S.REQUIRES + ("segment_ids",), draw=cases(kinds=("none", "causal")), params=S.per_sequence)
def test_per_sequence_positions_keep_segment_ids(target: Target, case: Case, params: dict):
    """Per-sequence positions beside segment ids (packed documents within each sequence)."""
    _padded_agrees(target, case, params)


@prop(requires=S.REQUIRES, draw=S.DRAW, params=S.per_sequence)
def test_packed_matches_reference(target: Target, case: Case, params: dict):
    """Each sequence of a packed call equals the reference on that sequence alone (positions its own;
    NaN past cu_seqlens[-1] and past seqused_k)."""
    S.skip_without(target, "packed")
    case = S.problem_of(case, params)
    with S.as_called(case):
        agreement(target, case, S.packed(target, case, params["unused"], params["seed"]))


@prop(requires=S.REQUIRES + ("lse",), draw=S.DRAW, params=S.per_sequence)
def test_packed_lse_matches_reference(target: Target, case: Case, params: dict):
    """A packed call's LSE ((Hq, total_q), gathered back through cu_seqlens_q) equals the reference's per
    sequence, in the base the backend declares: a varlen path's own LSE slip (its padded call right) shows."""
    S.skip_without(target, "packed")
    case = S.problem_of(case, params)
    with S.as_called(case):
        _, lse = S.packed(target, case, params["unused"], params["seed"], return_lse=True)  # (B, H, Lq)
        require(S.lse_verdict(target, case, lse))


@prop(requires=S.REQUIRES, draw=S.DRAW, params=S.per_sequence)
def test_packed_head_slices(target: Target, case: Case, params: dict):
    """q, k, v handed as slices of wider heads axes (a fused QKV projection's views: token stride past
    H * E, an offset, NaN heads beside them) give the contiguous call's output: a varlen kernel that
    addresses token t at t * H * E reads other tokens' heads."""
    S.skip_without(target, "packed")
    if "head_slice" not in target.caps.layouts:
        import pytest
        pytest.skip(f"{target.name} cannot be handed head slices (declares {', '.join(target.caps.layouts)})")
    case = S.problem_of(case, params)
    with S.as_called(case):
        contiguous = S.packed(target, case, params["unused"], params["seed"])  # (B, H, Lq, Ev)
        sliced = S.packed(target, case, params["unused"], params["seed"], layout="head_slice")
        close_outputs("packed_head_slices", target, case, contiguous, sliced, case,
                      "contiguous packed q, k, v vs the same values as head slices of wider tensors")


@prop(requires=S.REQUIRES, draw=S.DRAW, params=S.per_sequence)
def test_packed_isolation(target: Target, case: Case, params: dict):
    """Changing every token of one sequence leaves every other sequence's rows bit for bit alone."""
    S.skip_without(target, "packed")
    case = S.problem_of(case, params)
    before = S.packed(target, case, params["unused"], params["seed"])  # (B, H, Lq, Ev)
    b = params["seed"] % case.dims["B"]
    other = case.replace(q=case.q.copy(), k=case.k.copy(), v=case.v.copy())
    other.q[b], other.k[b], other.v[b] = 2 * case.q[b], -case.k[b], 1 - case.v[b]
    rows = case.judged_rows().copy()
    rows[b] = False
    with S.as_called(case):
        unchanged("packed_isolation", before, S.packed(target, other, params["unused"], params["seed"]),
                  rows, f"sequence {b}'s tokens changed; a row of another sequence")


@prop(requires=S.REQUIRES, draw=S.DRAW, params=S.per_sequence)
def test_packed_equals_padded(target: Target, case: Case, params: dict):
    """The backend's packed call and its own padded call of the same problem agree within both budgets."""
    S.skip_without(target, "packed")
    if "padded" not in target.caps.formats:
        import pytest
        pytest.skip(f"{target.name} takes no padded call")
    case = S.problem_of(case, params)
    with S.as_called(case):
        close_outputs("packed_equals_padded", target, case, S.packed(target, case, params["unused"]),
                      target.forward(case), case, "packed against padded")


@prop(requires=S.REQUIRES, grid=S.edge_cases)
def test_packed_edges(target: Target, case: Case, params: dict):
    """Zero-length sequences (total_q < B), queries without keys, max_seqlen = 1, keys at tile edges,
    Lq_b > Lk_b under causal; with the LSE feature, each call's LSE too (decodes' own LSE path)."""
    S.skip_without(target, "packed")
    with S.as_called(case):
        out = agreement(target, case, S.packed(target, case, unused=1, seed=params["seed"]))
        if target.supports("lse"):
            _, lse = S.packed(target, case, unused=1, seed=params["seed"], return_lse=True)  # (B, H, Lq)
            require(S.lse_verdict(target, case, lse))
    empty = ~case.judged_rows()  # rows that see nothing, padded rows included: zeros or the declared choice
    if target.backend.semantics.fully_masked == "zeros":
        unchanged("packed_edges", np.zeros_like(out), out, empty, "a row that sees no key")


@prop(requires=S.REQUIRES, draw=S.DRAW, params=S.per_sequence, gradients=True)
def test_packed_gradients_match_reference(target: Target, case: Case, params: dict):
    """dQ, dK, dV of a packed call, each sequence's within its budget, and exactly 0 on the tokens no
    sequence owns (past cu_seqlens[-1], past seqused_k: pytorch/pytorch#176793's NaN gradients there)."""
    S.skip_without(target, "packed")
    S.packed_gradients(target, S.problem_of(case, params), params["unused"], params["seed"])


@prop(requires=S.REQUIRES, grid=S.edge_cases, gradients=True)
def test_packed_gradient_edges(target: Target, case: Case, params: dict):
    """The packed backward at the edges, by construction: zero-length sequences, one key a sequence
    (Dao-AILab/flash-attention#443: NaN gradients with length-1 keys), keys at tile edges."""
    S.skip_without(target, "packed")
    S.packed_gradients(target, case, 1, params["seed"])


@prop(requires=S.REQUIRES, draw=S.DRAW.but(kinds=("causal",)), params=S.per_sequence)
def test_packed_mixed_batch_equals_each_alone(target: Target, case: Case, params: dict):
    """A mixed batch - a decode step first (one query), prefill chunks after - gives every sequence what it
    gets alone, in a batch of one: no kernel chosen for the whole batch by one of its sequences."""
    from hypothesis import assume

    S.skip_without(target, "packed")
    case = S.problem_of(case, params)
    if "bottom_right" in target.alignments:  # a decode's query after its cache, as the anchors place it
        case = case.replace(causal_alignment="bottom_right")
    B, Lq = case.dims["B"], case.dims["Lq"]
    lengths = case.lengths("q").copy()
    lengths[0] = min(1, Lq)
    assume(B >= 2 and (lengths[1:] > 1).any())
    case = case.replace(q_lengths=lengths)
    mixed = S.packed(target, case, params["unused"], params["seed"])  # (B, H, Lq, Ev)
    alone = np.concatenate([S.packed(target, S.one_sequence(case, b), params["unused"], params["seed"])
                            for b in range(B)], axis=0)
    with S.as_called(case):
        close_outputs("packed_mixed_batch_equals_each_alone", target, case, mixed, alone, case,
                      f"q_lengths {lengths.tolist()} together against each sequence alone")


@prop(requires=S.REQUIRES, grid=S.edge_cases)
def test_packed_rows_past_cu_seqlens(target: Target, case: Case, params: dict):
    """The output rows of query tokens past cu_seqlens_q[-1] (flash-attention#1661: rows outside the
    sequences modified): rows no sequence owns, as a padded row past q_lengths - judged by the declared
    ``padded_rows`` (zeros: exactly 0; nan: all NaN), recorded when undeclared.  The tokens there hold
    0.5, so a kernel that attends with them writes something else."""
    S.skip_without(target, "packed")
    _, rows = target.call_backend("packed forward", serving.forward_packed, target.backend, case.q, case.k, case.v,
                                  dtype=target.dtype, tail=3, fill=0.5, rng=params["seed"], tail_rows=True,
                                  **case.call_kwargs)  # rows: (3, Hq, Ev)
    observed = "nan" if np.isnan(rows).all() else "zeros" if np.all(rows == 0) else "other"
    declared = target.backend.semantics.padded_rows
    agrees = None if declared not in ("zeros", "nan") else observed == declared
    target.answers.append(dict(backend=target.name, question="rows_past_cu_seqlens_q", dtype=target.dtype,
                               observed=observed, declared=declared, agrees=agrees))
    require(verdict("packed_rows_past_cu_seqlens", agrees is not False, None, float("nan"),
                    f"{target.name} declares padded_rows = {declared!r} but the output rows past cu_seqlens_q[-1] "
                    f"({case.label}) are {observed!r}: {np.nanmax(np.abs(rows)) if rows.size else 0:.6g} at most"))
