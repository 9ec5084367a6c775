"""Family: tuning knobs must not change the answer.

A backend declares its knobs and their domains (`Backend.knobs`, default first: numpy-tiled's block
size; FA3's num_splits and pack_gqa, which FA3's own tests loop over at one tolerance).  Each drawn
problem runs at the default and at a drawn setting: the two outputs within both error budgets of
the reference, bitwise where `Semantics.knob_exact` is declared.  A block size that drops the last
partial block, or a split count that counts a split twice, changes the answer and fails here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from hypothesis import strategies as st

from attnspec.properties.explore import prop
from attnspec.properties.judge import close_outputs, unchanged

if TYPE_CHECKING:
    from attnspec.properties.case import Case
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


@prop(params=_setting)
def test_knob_setting_changes_nothing(target: Target, case: Case, params: dict):
    """The output at a drawn knob setting equals the default's: within both budgets (bitwise if knob_exact)."""
    if not target.backend.knobs:
        import pytest
        pytest.skip(f"{target.name} declares no tuning knobs (Backend.knobs)")
    default = target.forward(case)  # (B, H, Lq, Ev)
    tuned = target.forward(case, knobs=params["knobs"])  # (B, H, Lq, Ev)
    what = f"knobs {params['knobs']} against the default"
    if target.backend.semantics.knob_exact:  # declared: every setting the same program up to its schedule
        unchanged("knob_setting_changes_nothing", default, tuned, case.judged_rows(), what)
    else:
        close_outputs("knob_setting_changes_nothing", target, case, default, tuned, case, what)
