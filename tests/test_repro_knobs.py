"""Reproducers of the knobs family replay the knob setting (issue 31): a planted knob bug's reproducer fails
alone in a fresh process at the setting the suite drew, and passes with ``KNOBS = {}`` (the defaults); the
calls a reproducer replays before a stateful failure carry their knob settings."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from attnspec.backends.base import Backend, Capabilities
from attnspec.properties.case import Case
from attnspec.properties.repro import _earlier_call
from attnspec.properties.runner import run_suite
from attnspec.properties.target import signature
from tests.test_suite_reproducers import ROOT, run_reproducer

PLANTED = "tests.broken.convention_bugs:KnobDropsTail"  # block sizes that do not divide Lk drop the last keys


@pytest.mark.slow
def test_a_knob_bugs_reproducer_fails_at_its_knob_and_passes_at_the_defaults(tmp_path):
    work = tmp_path / "run"
    result = run_suite([PLANTED], json_path=str(work / "out.json"), profile="dev", cwd=str(tmp_path),
                       extra_args=["-n", "0", "-k", "test_knob_setting_changes_nothing", "--hypothesis-seed=0"],
                       pythonpath=[ROOT], timeout=600)
    (row,) = [r for r in result.conformance if r["status"] == "failed"]
    text = Path(row["reproducer"]).read_text(encoding="utf-8")
    knobs = re.search(r"^KNOBS = (\{.*?\})  #", text, re.M)
    assert knobs and re.fullmatch(r"\{'block_size': (4|16)\}", knobs.group(1)), text  # off the default, 1
    assert re.search(r"^params = dict\(knobs=KNOBS\)", text, re.M), text
    run = run_reproducer(row["reproducer"], tmp_path)  # from another folder, without PYTHONPATH
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.splitlines()[0] == ("knob_setting_changes_nothing FAILED on backend 'broken-knob-drops-tail' at "
                                          "float32 (the problem alone, in a fresh process)")
    assert f"knobs {knobs.group(1)} against the default" in run.stdout
    defaults = tmp_path / "defaults.py"
    defaults.write_text(text.replace(f"KNOBS = {knobs.group(1)}", "KNOBS = {}"), encoding="utf-8")
    run = run_reproducer(str(defaults), tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[0].startswith("knob_setting_changes_nothing PASSED on backend 'broken-knob-drops-tail'")


class _Remembers(Backend):
    """Records the knob setting of each call (what an autotuner's cache keyed by shape would keep)."""

    name = "remembers-knobs"
    capabilities = Capabilities(dtypes=("float64",))
    knobs = {"block_size": (1, 4)}

    def __init__(self):
        self.seen = []

    def native_attention(self, q, k, v, call):
        self.seen.append(call.knobs)
        return np.zeros(q.shape[:-1] + v.shape[-1:])  # (B, H, Lq, Ev)


def test_replayed_earlier_calls_carry_their_knob_settings():
    case = Case(*(np.zeros((1, 1, 2, 4)) for _ in range(3)))
    backend = _Remembers()
    _earlier_call(backend, signature("forward", case, "float64", knobs={"block_size": 4}))
    _earlier_call(backend, signature("forward", case, "float64"))
    _earlier_call(backend, signature("forward", case, "float64")[:-1])  # a reproducer written before knobs
    assert backend.seen == [{"block_size": 4}, None, None]
