"""Family: tuning knobs must not change the answer.

A backend declares its knobs and their domains (`Backend.knobs`, default first: numpy-tiled's block
size; FA3's num_splits and pack_gqa, which FA3's own tests loop over at one tolerance).  Each drawn
problem runs at the default and at a drawn setting: the two outputs within both error budgets of
the reference, bitwise where `Semantics.knob_exact` is declared; the LSEs within both budgets where the
backend returns one.  A block size that drops the last
partial block, or a split count that counts a split twice, changes the answer and fails here.  A backend
with gradients takes each setting through its backward too (padded and packed), judged against the
reference: a backward tiled by the knob has tail tiles of its own.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from attnspec.properties import serving_calls as S
from attnspec.properties.case import Case
from attnspec.properties.draws import in_format, row_seed
from attnspec.properties.explore import prop
from attnspec.properties.judge import check_gradients, close_lses, close_outputs, grad_out, unchanged

if TYPE_CHECKING:
    from attnspec.properties.target import Target


def _setting(draw, case: Case, target: Target) -> dict:
    """A setting of every knob, drawn from its domain; at least one off its default when any can be."""
    knobs = target.backend.knobs
    setting = {name: draw(st.sampled_from(tuple(domain)), label=f"knob {name}") for name, domain in knobs.items()}
    movable = [n for n, d in knobs.items() if len(d) > 1]
    if movable and all(setting[n] == knobs[n][0] for n in knobs):
        name = draw(st.sampled_from(movable), label="knob moved")
        setting[name] = draw(st.sampled_from(tuple(knobs[name][1:])), label=f"knob {name} off its default")
    return {"knobs": setting}


def _knobbed(target: Target) -> None:
    if not target.backend.knobs:
        import pytest
        pytest.skip(f"{target.name} declares no tuning knobs (Backend.knobs)")


def _same_answer(name: str, target: Target, case: Case, setting: dict) -> None:
    default = target.forward(case)  # (B, H, Lq, Ev)
    tuned = target.forward(case, knobs=setting)  # (B, H, Lq, Ev)
    what = f"knobs {setting} against the default"
    if target.backend.semantics.knob_exact:  # declared: every setting the same program up to its schedule
        unchanged(name, default, tuned, case.judged_rows(), what)
    else:
        close_outputs(name, target, case, default, tuned, case, what)
    if target.supports("lse"):  # a split count's combine may merge the outputs right and return one split's LSE
        _, lse = target.forward(case, return_lse=True)  # (B, H, Lq)
        _, tuned_lse = target.forward(case, knobs=setting, return_lse=True)  # (B, H, Lq)
        close_lses(name, target, case, lse, tuned_lse, what)


@prop(params=_setting)
def test_knob_setting_changes_nothing(target: Target, case: Case, params: dict):
    """The output at a drawn knob setting equals the default's: within both budgets (bitwise if knob_exact)."""
    _knobbed(target)
    _same_answer("knob_setting_changes_nothing", target, case, params["knobs"])


def _split_path_settings(target: Target) -> list:
    """4 queries against 600 and 2000 keys (a split-KV path, where a num_splits acts; the draws stop near 300
    keys; a heuristic may split only past 1024) at every setting of each knob off its default, the others at
    theirs."""
    knobs = target.backend.knobs
    if not knobs:
        return [(None, {})]
    defaults = {name: tuple(domain)[0] for name, domain in knobs.items()}
    out = []
    for Lk in (600, 2000):
        label = f"4 queries against {Lk} keys"
        rng = np.random.default_rng(row_seed(label))
        q, k, v = (in_format(rng.standard_normal((1, 2, L, 32)), target.budget_dtype) for L in (4, Lk, Lk))
        case = target.exact(Case(q, k, v, label=label))
        out += [(case, {"knobs": {**defaults, name: value}}) for name, domain in knobs.items()
                for value in tuple(domain)[1:]] or [(case, {"knobs": defaults})]
    return out


@prop(grid=_split_path_settings)
def test_knob_settings_on_a_split_path(target: Target, case: Case, params: dict):
    """Each knob's every setting on a few queries against long keys (a split count that drops the last
    Lk mod n keys acts only there): the default's output, within both budgets (bitwise if knob_exact)."""
    _knobbed(target)
    _same_answer("knob_settings_on_a_split_path", target, case, params["knobs"])


def _format_settings(target: Target) -> list:
    """Decodes and a chunk against 1537, 601 and 70 keys (lengths no split count divides) in each format the
    backend calls besides the padded one (its packed call, its first paged layout in 16-key pages), at every
    setting of each knob off its default: a split count acts on a decode's paged call above all."""
    knobs = target.backend.knobs
    formats = [f for f in ("packed",) if f in target.caps.formats] + list(S.paged_layouts(target)[:1])
    if not knobs or not formats:
        return [(None, {})]
    defaults = {name: tuple(domain)[0] for name, domain in knobs.items()}
    label = "1, 4 and 2 queries against 1537, 601 and 70 keys"
    rng = np.random.default_rng(row_seed(label))
    q, k, v = (in_format(rng.standard_normal((3, 2, L, 32)), target.budget_dtype) for L in (4, 1537, 1537))
    aligned = "bottom_right" in target.alignments  # causal where the backend takes the anchors' alignment
    fields = {"q_lengths": np.array([1, 4, 2]), "kv_lengths": np.array([1537, 601, 70]), "positions": "per_sequence",
              **({"causal_alignment": "bottom_right"} if aligned else {})}
    case = target.exact(Case(q, k, v, None, aligned, None, fields, label=label))
    settings = [{**defaults, name: value} for name, domain in knobs.items() for value in tuple(domain)[1:]]
    return [(case, {"format": fmt, "knobs": setting}) for fmt in formats for setting in settings]


@prop(requires=("seq_lengths", "seq_positions"), grid=_format_settings)
def test_knob_settings_in_format_calls(target: Target, case: Case, params: dict):
    """Each knob's every setting in the packed and paged calls (a kernel's split-KV decode path is its paged
    call's: Dao-AILab/flash-attention#1217, num_splits > 1 wrong with a block table only): the default's
    output there, within both budgets (bitwise if knob_exact); the LSE within both budgets where returned."""
    _knobbed(target)
    if case is None:
        import pytest
        pytest.skip(f"{target.name} takes no packed or paged call (declares {', '.join(target.caps.formats)})")
    fmt, setting, lse = params["format"], params["knobs"], target.supports("lse")

    def call(knobs):
        if fmt == "packed":
            return S.packed(target, case, return_lse=lse, knobs=knobs)  # (B, H, Lq, Ev)[, (B, H, Lq)]
        return S.paged(target, case, 16, fmt, return_lse=lse, knobs=knobs)  # (B, H, Lq, Ev)[, (B, H, Lq)]

    (default, default_lse), (tuned, tuned_lse) = ((y if lse else (y, None)) for y in (call(None), call(setting)))
    what = f"the {fmt} call at knobs {setting} against the default"
    with S.as_called(case):
        if target.backend.semantics.knob_exact:  # declared: every setting the same program up to its schedule
            unchanged("knob_settings_in_format_calls", default, tuned, case.judged_rows(), what)
        else:
            close_outputs("knob_settings_in_format_calls", target, case, default, tuned, case, what)
        if lse:
            close_lses("knob_settings_in_format_calls", target, case, default_lse, tuned_lse, what)


def _backward_settings(target: Target) -> list:
    """37 queries against 71 keys, and 71 of each causal (lengths no block size or split count divides),
    through the backward; two sequences of 37 and 20 queries against 71 and 45 keys through the packed
    backward where the backend takes one; at every setting of each knob off its default."""
    knobs = target.backend.knobs
    if not knobs:
        return [(None, {})]
    defaults = {name: tuple(domain)[0] for name, domain in knobs.items()}
    settings = [{**defaults, name: value} for name, domain in knobs.items() for value in tuple(domain)[1:]]
    problems = []
    for label, Lq, causal in (("37 queries against 71 keys", 37, False), ("71 queries and keys, causal", 71, True)):
        rng = np.random.default_rng(row_seed(label))
        q, k, v = (in_format(rng.standard_normal((1, 2, L, 32)), target.budget_dtype) for L in (Lq, 71, 71))
        problems.append(("padded", target.exact(Case(q, k, v, None, causal, label=label))))
    if "packed" in target.caps.formats and target.supports("seq_lengths") and target.supports("seq_positions"):
        label = "37 and 20 queries against 71 and 45 keys, packed"
        rng = np.random.default_rng(row_seed(label))
        q, k, v = (in_format(rng.standard_normal((2, 2, L, 32)), target.budget_dtype) for L in (37, 71, 71))
        aligned = "bottom_right" in target.alignments  # causal where the backend takes the anchors' alignment
        fields = {"q_lengths": np.array([37, 20]), "kv_lengths": np.array([71, 45]), "positions": "per_sequence",
                  **({"causal_alignment": "bottom_right"} if aligned else {})}
        problems.append(("packed", target.exact(Case(q, k, v, None, aligned, None, fields, label=label))))
    return [(case, {"format": fmt, "knobs": setting}) for fmt, case in problems for setting in settings]


@prop(gradients=True, grid=_backward_settings)
def test_knob_settings_in_the_backward(target: Target, case: Case, params: dict):
    """Each knob's every setting through the backward (a backward loops over its own key and query tiles:
    a tail tile that only a setting off the default leaves, dropped or read past, changes dK, dV or dQ there):
    dQ, dK, dV against the reference within their budgets; through the packed backward too, where taken."""
    _knobbed(target)
    if params["format"] == "packed":
        S.packed_gradients(target, case, 1, 0, "knob_settings_in_the_backward", knobs=params["knobs"])
    else:
        check_gradients("knob_settings_in_the_backward", target, case, grad_out(case, target.dtype, 0),
                        knobs=params["knobs"])
