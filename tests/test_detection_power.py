"""tools/detection_power.py: its command line, grid, summaries, kill-rate arithmetic and measurement runs.

The tool belongs to this repository, not to the installed suite: it is given its graded defects
and planted bugs as module names (--defects tests.defects, --broken tests.broken), passes the
suite its options (--attnspec-rule, --attnspec-examples, --attnspec-no-shrink) and is itself the
pytest plugin of its measurement runs (-p tools.detection_power).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import detection_power as dp

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "detection_power.py"


def run_tool(*args, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSPEC_")}
    return subprocess.run([sys.executable, str(TOOL), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("args, flags", [
    ((), ["--defects"]),
    (("--broken", "tests.broken"), ["--defects"]),  # detection power needs the graded defects
    (("--kill-rates",), ["--broken"]),
    (("--controls",), ["--defects", "--broken"]),
])
def test_the_tool_refuses_to_run_without_its_modules(tmp_path, args, flags):
    """An argparse error naming the missing option (and this repository's modules), before any run."""
    done = run_tool(*args, "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "error:" in last, done.stderr
    for flag in flags:
        assert flag in last, last
    assert "required" in last and "tests.defects" in last and "tests.broken" in last, last
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()  # refused before writing


def test_grid_runs_from_large_to_small_in_steps_of_about_three(monkeypatch):
    from tests import defects

    monkeypatch.setattr(dp, "DEFECTS_MODULE", defects)  # what --defects tests.defects sets
    for dtype in dp.DTYPES:
        g = dp.grid(dtype)
        assert g == sorted(g, reverse=True) and g[0] == 10.0 ** dp.GRIDS[dtype][0]
        assert all(2.9 < a / b < 3.4 for a, b in zip(g, g[1:], strict=False))
        assert all("." not in dp._defect("gain", d, dtype)[0].split(":")[1] for d in g)  # resolve() splits at dots
        for target in dp.TARGETS[dtype].values():
            assert any(abs(d - target) <= 1e-12 * target for d in g), (dtype, target)
    spec, name = dp._defect("gain", 3e-3, "float16")
    assert spec.startswith("tests.defects:") and name == "defect-gain-0.003-float16"


def test_summary_takes_the_smallest_d_every_run_rejects():
    rows = [dict(dtype="float16", defect="gain", rule=rule, d=d, rate=rate, runs=3, control_failed="")
            for rule, rates in (("attnspec", (1, 1, 2 / 3, 0)), ("flash", (1, 1, 1, 1 / 3)))
            for d, rate in zip((1e-2, 3e-3, 1e-3, 3e-4), rates, strict=True)]
    (row,) = dp.summarize(rows)
    assert row["smallest_d_rejected"] == 3e-3 and row["smallest_d_sometimes"] == 1e-3
    assert row["flash_rule_smallest_d_rejected"] == 1e-3 and row["flash_rule_smallest_d_sometimes"] == 3e-4
    assert row["rate_at_target"] == 1 and row["meets_target"] is True  # float16 gain: 0.3 %


def test_a_measured_run_passes_the_suite_its_options_and_loads_the_tool_as_plugin(monkeypatch):
    """The rule, the example count and no shrinking are the suite's options now (no environment
    variables); the tool's own plugin stops a rejected backend when asked."""
    seen = {}

    class Result:
        returncode, output = 1, ""
        conformance = [dict(backend="b", property="p", status="failed"), dict(backend="b", property="q", status="error"),
                       dict(backend="c", property="p", status="passed")]

    def fake_run_suite(names, json_path, profile, env, timeout, extra_args):
        seen.update(names=names, json_path=json_path, profile=profile, env=env, args=extra_args)
        return Result()

    monkeypatch.setattr(dp, "run_suite", fake_run_suite)
    monkeypatch.setenv("ATTNSPEC_BACKENDS", "numpy-naive")  # the user's shell: not the measurement's
    got = dp.suite_run(["x:y"], seed=7, rule="flash", examples=3, extra=["-k", "default_scale"], stop=True,
                       ignore=["b_prop", "a_prop"])
    assert got == {"b": ({"p"}, {"q"}), "c": (set(), set())}
    args = seen["args"]
    assert args[:2] == ["-p", "tools.detection_power"] and "--hypothesis-seed=7" in args
    assert "--attnspec-rule=flash" in args and "--attnspec-examples=3" in args and "--attnspec-no-shrink" in args
    assert args[-2:] == ["-k", "default_scale"] and seen["names"] == ["x:y"] and seen["profile"] == "dev"
    env = seen["env"]
    assert env[dp.STOP_ENV] == "1" and env[dp.IGNORE_ENV] == "a_prop,b_prop" and "ATTNSPEC_BACKENDS" not in env
    assert not {"ATTNSPEC_BUDGET_RULE", "ATTNSPEC_MEASURE_EXAMPLES"} & set(env)  # gone: options instead
    assert not os.path.exists(os.path.dirname(seen["json_path"]))  # its scratch folder (JSON, reproducers) is gone
    dp.suite_run(["x:y"], seed=1)
    assert "--attnspec-rule=attnspec" in seen["args"] and not any(a.startswith("--attnspec-examples") for a in seen["args"])
    assert dp.STOP_ENV not in seen["env"]


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


def test_per_example_probability_inverts_the_kill_rate():
    p = dp.per_example(5, 10, 2)
    assert 1 - (1 - p) ** 2 == pytest.approx(0.5)
    assert dp.per_example(10, 10, 1) == pytest.approx(1 - 0.5 / 10)  # every run killed: a cautious 1 - 1/(2 runs)
    assert dp.examples_needed(1.0) == 1 and dp.examples_needed(0.0) == "inf"
