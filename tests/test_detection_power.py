"""properties/detection_power.py: its grid, summaries, kill-rate arithmetic and measurement plugin."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attnspec.properties import detection_power as dp

ROOT = Path(__file__).resolve().parents[1]


def test_grid_runs_from_large_to_small_in_steps_of_about_three():
    for dtype in dp.DTYPES:
        g = dp.grid(dtype)
        assert g == sorted(g, reverse=True) and g[0] == 10.0 ** dp.GRIDS[dtype][0]
        assert all(2.9 < a / b < 3.4 for a, b in zip(g, g[1:]))
        assert all("." not in dp._defect("gain", d, dtype)[0].split(":")[1] for d in g)  # resolve() splits at dots
        for target in dp.TARGETS[dtype].values():
            assert any(abs(d - target) <= 1e-12 * target for d in g), (dtype, target)


def test_summary_takes_the_smallest_d_every_run_rejects():
    rows = [dict(dtype="float16", defect="gain", rule=rule, d=d, rate=rate, runs=3, control_failed="")
            for rule, rates in (("attnspec", (1, 1, 2 / 3, 0)), ("flash", (1, 1, 1, 1 / 3)))
            for d, rate in zip((1e-2, 3e-3, 1e-3, 3e-4), rates)]
    (row,) = dp.summarize(rows)
    assert row["smallest_d_rejected"] == 3e-3 and row["smallest_d_sometimes"] == 1e-3
    assert row["flash_rule_smallest_d_rejected"] == 1e-3 and row["flash_rule_smallest_d_sometimes"] == 3e-4
    assert row["rate_at_target"] == 1 and row["meets_target"] is True  # float16 gain: 0.3 %


def test_plugin_drops_the_database_and_shrinking_and_sets_the_examples(tmp_path):
    (tmp_path / "test_profile.py").write_text(textwrap.dedent("""
        from hypothesis import Phase, settings
        def test_profile():
            s = settings.default
            assert s.database is None and Phase.shrink not in s.phases and s.max_examples == 3
            assert not s.derandomize
    """))
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{dp.EXAMPLES_ENV: "3"})
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                           "attnspec.properties.detection_power", "--hypothesis-seed=4", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_measured_run_reports_the_failed_property_and_can_stop_there():
    """Real suite runs: the seed mistake 'scale 1/E' fails default_scale; with stop, its first
    failure ends its run (ignored properties do not count)."""
    got = dp.suite_run(["tests.broken.seed_mistakes:ScaleByD"], seed=1, examples=3, extra=["-k", "default_scale"])
    failed, errored = got["broken-scale-by-d"]
    assert failed == {"default_scale"} and not errored
    two = ["-k", "default_scale or explicit_scale_honoured or test_matches_reference"]
    failed, _ = dp.suite_run(["tests.broken.seed_mistakes:NoScale"], seed=1, examples=6, extra=two, stop=True)[
        "broken-no-scale"]
    assert len(failed) == 1
    failed, _ = dp.suite_run(["tests.broken.seed_mistakes:NoScale"], seed=1, examples=6, extra=two, stop=True,
                             ignore=failed)["broken-no-scale"]
    assert len(failed) == 2  # the first failure was not counted: the next one stopped the run


@pytest.mark.parametrize("killed,runs,n,expected", [(5, 10, 2, 14), (9, 10, 6, 12), (2, 10, 2, 42),
                                                      (10, 10, 2, 4), (0, 10, 6, "inf")])
def test_examples_for_99_percent_follow_from_the_rate(killed, runs, n, expected):
    assert dp.examples_needed(dp.per_example(killed, runs, n)) == expected
