"""`attnspec run` and `attnspec report`: exit-2 paths, and crashing or hanging backends recorded."""
from __future__ import annotations

import csv
import os
import sys
import time

import pytest

from attnspec import cli
from attnspec.commands import run_cmd
from attnspec.reports import runner, suites

SAMPLE = os.path.join(os.path.dirname(__file__), "data", "report_sample")
HAS_REPORT_DEPS = all(runner.importable(m) for m in ("pandas", "matplotlib", "jinja2"))


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, err, *phrases):
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for phrase in phrases:
        assert phrase in lines[0]


def test_run_with_an_unknown_backend_exits_2(capsys, tmp_path):
    rc, _, err = run_cli(capsys, "run", "--backend", "no-such-backend", "--no-bench", "--out", str(tmp_path / "o"))
    assert_one_line_error(rc, err, "unknown backend 'no-such-backend'")
    assert not (tmp_path / "o").exists()


def test_run_without_asv_exits_2_before_running_anything(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(run_cmd.shutil, "which", lambda name: None)
    monkeypatch.setattr(run_cmd, "select_backends", lambda args: pytest.fail("ran before checking for asv"))
    rc, _, err = run_cli(capsys, "run", "--out", str(tmp_path / "o"))
    assert_one_line_error(rc, err, "asv is not installed", "--no-bench")


def test_run_rejects_a_nonpositive_suite_timeout(capsys, tmp_path):
    rc, _, err = run_cli(capsys, "run", "--no-bench", "--suite-timeout", "0", "--out", str(tmp_path / "o"))
    assert_one_line_error(rc, err, "--suite-timeout", "got 0")


def test_quick_and_full_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "--quick", "--full"])
    assert info.value.code == 2


@pytest.mark.parametrize("content, phrase", [
    (None, "results not found"),
    ("{not json", "not valid JSON"),
    ('{"conformance": 3, "semantics": []}', "'conformance' must be a list"),
])
def test_report_with_missing_or_corrupt_results_exits_2(capsys, tmp_path, content, phrase):
    path = tmp_path / "suite.json"
    if content is not None:
        path.write_text(content)
    rc, _, err = run_cli(capsys, "report", "--out", str(tmp_path / "o"), str(path if content else tmp_path / "nope"))
    assert_one_line_error(rc, err, phrase)
    assert not (tmp_path / "o").exists()


def test_report_without_stored_results_exits_2(capsys, tmp_path):
    rc, _, err = run_cli(capsys, "report", "--out", str(tmp_path / "empty"))
    assert_one_line_error(rc, err, "no stored results", "attnspec run")


def test_report_of_a_folder_that_holds_no_results_exits_2(capsys, tmp_path):
    (tmp_path / "junk").mkdir()
    rc, _, err = run_cli(capsys, "report", "--out", str(tmp_path / "o"), str(tmp_path / "junk"))
    assert_one_line_error(rc, err, "neither an asv results folder")


@pytest.mark.skipif(not HAS_REPORT_DEPS, reason="pandas, matplotlib and Jinja2 are needed to write a report")
def test_report_rebuilds_from_the_sample(capsys, tmp_path):
    out = tmp_path / "o"
    rc, text, _ = run_cli(capsys, "report", "--out", str(out), os.path.join(SAMPLE, "suite_cpu.json"),
                          os.path.join(SAMPLE, "asv_results"))
    assert rc == 0 and "index.html" in text
    rc, _, _ = run_cli(capsys, "report", "--out", str(out))  # again, from its own stored copy
    assert rc == 0 and (out / "raw" / "suite.json").exists()


def test_a_child_that_dies_or_hangs_is_recorded_and_the_rest_goes_on(tmp_path):
    crash = suites.run_suite("a", str(tmp_path / "a.json"), 30,
                             command=lambda b, p: [sys.executable, "-c", "import os; print('t.py::a PASSED'); "
                                                   "print('t.py::b', end=''); os._exit(3)"])
    (row,) = crash["conformance"]
    assert row["status"] == "crashed" and "exit status 3" in row["message"] and "t.py::b" in row["message"]
    hang = suites.run_suite("b", str(tmp_path / "b.json"), 1.5,
                            command=lambda b, p: [sys.executable, "-c", "import time; time.sleep(60)"])
    (row,) = hang["conformance"]
    assert row["status"] == "timed_out" and "1.5 s" in row["message"] and row["seconds"] < 30


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.skipif(not HAS_REPORT_DEPS, reason="pandas, matplotlib and Jinja2 are needed to write a report")
def test_run_records_a_crashing_and_a_hanging_backend(capsys, monkeypatch, tmp_path):
    """Through the real suite: fake plug-ins that os._exit() or sleep; the report still gets written.

    The hanging one is ended as soon as the plugin reports its hung call (2 s per-call limit here),
    long before the suite's own limit: its stuck thread does not run on, and every test it had not
    finished is recorded as failed, not attempted."""
    monkeypatch.chdir(SAMPLE)  # plug-ins in the user's working folder are importable by the children
    monkeypatch.setenv("ATTNSPEC_CALL_TIMEOUT", "2")
    out = tmp_path / "out"
    rc, text, _ = run_cli(capsys, "run", "--backend", "fake_backends:Crashing", "--backend", "fake_backends:Hanging",
                          "--no-bench", "--suite-timeout", "300", "--out", str(out))
    assert rc == 1, text
    conf = read_csv(out / "conformance.csv")
    rows = {r["backend"]: r for r in conf if r["property"] == "(suite)"}
    assert rows["fake-crashing"]["status"] == "crashed", rows
    hung = rows["fake-hanging"]
    assert hung["status"] == "timed_out" and "per-call limit" in hung["message"], hung
    assert float(hung["seconds"]) < 120, hung  # ended at the hang, not at the 300 s limit
    skipped_attempts = [r for r in conf if r["backend"] == "fake-hanging" and r["message"].startswith("not attempted")]
    assert skipped_attempts and all(r["status"] == "failed" for r in skipped_attempts)
    verdicts = {r["backend"]: r["verdict"] for r in read_csv(out / "verdicts.csv")}
    assert verdicts == {"fake-crashing": "crashed", "fake-hanging": "timed out"}
    assert "[suite 2/2] fake_backends:Hanging" in text


_FAKE_SUITE = """
import json, os, sys, time
def say(**line):
    with open(os.environ["ATTNSPEC_PROGRESS"], "a") as f:
        f.write(json.dumps(line) + "\\n")
key = lambda p: dict(test="t.py::" + p, backend="fake", property=p, dtype="float32")
say(event="collected", tests=[key("a"), key("b"), key("c")])
say(event="started", **key("a"))
say(event="finished", **key("a"), status="passed", examples=3, seconds=0.1, counterexample=None, message=None,
    semantics=[dict(backend="fake", question="q", observed="nan", declared=None, agrees=None)], hung=None)
say(event="started", **key("b"))
open(sys.argv[1], "w").write(str(os.getpid()))
"""


@pytest.mark.parametrize("ending", ["hung", "crash"])
def test_the_runner_reads_the_plugins_progress_channel(tmp_path, ending):
    """Rows of the tests that finished come from the channel when the child does not finish by itself."""
    pid_file = tmp_path / "pid"
    if ending == "hung":  # 'b' finishes, reporting a hung call; the child would then run on for a minute
        tail = ("say(event='finished', **key('b'), status='failed', examples=1, seconds=2.0, counterexample='', "
                "message='forward did not return', semantics=[], hung='forward')\ntime.sleep(60)")
    else:  # dies in the middle of 'b'
        tail = "os._exit(3)"
    script = tmp_path / "child.py"
    script.write_text(_FAKE_SUITE + tail + "\n")
    start = time.monotonic()
    data = suites.run_suite("fake", str(tmp_path / "s.json"), 90, shown="fake",
                            command=lambda b, p: [sys.executable, str(script), str(pid_file)])
    rows = {r["property"]: r for r in data["conformance"]}
    assert rows["a"]["status"] == "passed" and rows["a"]["examples"] == 3
    assert data["semantics"] == [dict(backend="fake", question="q", observed="nan", declared=None, agrees=None)]
    if ending == "hung":
        assert time.monotonic() - start < 30  # ended at the hang, not after the child's minute
        with pytest.raises(ProcessLookupError):  # and gone: no stuck thread left running
            os.kill(int(pid_file.read_text()), 0)
        assert rows["b"]["status"] == "failed" and rows["c"]["status"] == "failed"
        assert rows["c"]["message"].startswith("not attempted: an earlier forward call did not return")
        assert rows["(suite)"]["status"] == "timed_out" and "in b[float32]" in rows["(suite)"]["message"]
        assert "1 remaining test(s)" in rows["(suite)"]["message"]
    else:
        assert set(rows) == {"a", "(suite)"}
        assert rows["(suite)"]["status"] == "crashed" and "while running b[float32]" in rows["(suite)"]["message"]


@pytest.mark.skipif(not HAS_REPORT_DEPS, reason="pandas, matplotlib and Jinja2 are needed to write a report")
def test_a_named_backend_with_nothing_tested_fails_the_run(capsys, monkeypatch, tmp_path):
    """Through the real suite: a backend whose declared dtypes have no error budget runs no test."""
    monkeypatch.chdir(SAMPLE)
    out = tmp_path / "out"
    rc, text, err = run_cli(capsys, "run", "--backend", "fake_backends:Int8Only", "--no-bench", "--out", str(out))
    assert rc == 1, text + err
    assert "fake-int8-only was asked for but not tested" in err and "selected no test" in err
    (verdict,) = read_csv(out / "verdicts.csv")
    assert verdict["backend"] == "fake-int8-only" and verdict["verdict"].startswith("not tested")


@pytest.mark.skipif(not HAS_REPORT_DEPS, reason="pandas, matplotlib and Jinja2 are needed to write a report")
@pytest.mark.parametrize("asked", [True, False])
def test_an_unavailable_backend_fails_the_run_only_when_asked_for(capsys, monkeypatch, tmp_path, asked):
    """Named with --backend and not tested: exit 1.  Left out of the default selection (not installed): exit 0."""
    monkeypatch.delenv("ATTNSPEC_BACKENDS", raising=False)
    monkeypatch.setattr(run_cmd, "probe", lambda names: [("numpy-naive", True, "", "numpy-naive"),
                                                         ("torch-sdpa-cuda-flash", False, "no CUDA device", "torch-sdpa-cuda-flash")])
    passed = dict(backend="numpy-naive", property="rows_sum_to_one", dtype="float64", status="passed", examples=6,
                  seconds=0.1, counterexample=None, message=None)
    monkeypatch.setattr(run_cmd, "run_suites", lambda chosen, *a: {"conformance": [passed], "semantics": []})
    names = ["--backend", "numpy-naive", "--backend", "torch-sdpa-cuda-flash"] if asked else []
    rc, text, err = run_cli(capsys, "run", *names, "--no-bench", "--out", str(tmp_path / "out"))
    verdicts = {r["backend"]: r["verdict"] for r in read_csv(tmp_path / "out" / "verdicts.csv")}
    assert verdicts == {"numpy-naive": "conforms", "torch-sdpa-cuda-flash": "not tested (all skipped)"}
    if asked:
        assert rc == 1 and "torch-sdpa-cuda-flash was asked for but not tested: no CUDA device" in err
    else:
        assert rc == 0 and "not tested" not in err, err


def test_the_commands_load_no_framework_until_a_report_is_built():
    import subprocess

    code = ("import sys, attnspec.cli, attnspec.commands.run_cmd, attnspec.commands.report_cmd, reports.build, "
            "reports.runner, reports.suites; heavy = {'pandas', 'matplotlib', 'torch', 'jax'} & set(sys.modules); "
            "assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=runner.ROOT)
    assert done.returncode == 0, done.stderr


def test_the_commands_do_not_import_the_cli(tmp_path):
    """No import cycle: the subcommands share attnspec.errors; `python -m attnspec.cli` exits 2 on a user error."""
    import subprocess

    code = ("import sys, attnspec.commands.run_cmd, attnspec.commands.report_cmd, attnspec.commands.backends_cmd; "
            "assert 'attnspec.cli' not in sys.modules, 'a command imports attnspec.cli'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=runner.ROOT)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([sys.executable, "-m", "attnspec.cli", "report", "--out", str(tmp_path / "none")],
                          capture_output=True, text=True, cwd=runner.ROOT)
    assert done.returncode == 2 and "no stored results" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["run", "report"])
def test_a_missing_report_dependency_exits_2_naming_it(capsys, monkeypatch, tmp_path, command):
    from attnspec.reports import build

    monkeypatch.setattr(build, "missing_modules", lambda: ["jinja2"])
    monkeypatch.setattr(run_cmd, "select_backends", lambda args: pytest.fail("ran before checking the report's needs"))
    extra = ["--no-bench"] if command == "run" else [os.path.join(SAMPLE, "suite_cpu.json")]
    rc, _, err = run_cli(capsys, command, "--out", str(tmp_path / "o"), *extra)
    assert_one_line_error(rc, err, "jinja2 is not installed", ".[report]")
    assert not (tmp_path / "o").exists()


def test_each_mode_runs_the_benchmark_grid_of_its_name():
    """The grids themselves are benchmarks/_grid.py's (tests/test_bench_grid.py checks them)."""
    assert {mode: env["ATTNSPEC_BENCH_GRID"] for mode, env in run_cmd.MODES.items()} == {
        "quick": "quick", "default": "default", "full": "full"}


@pytest.mark.parametrize("command", ["run", "report"])
def test_out_never_replaces_what_is_not_a_report(capsys, tmp_path, command):
    """--out pointing at the user's own folder or file: exit 2 before anything runs, nothing lost."""
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    extra = ["--no-bench", "--backend", "numpy-naive"] if command == "run" else [os.path.join(SAMPLE, "suite_cpu.json")]
    for out, phrase in ((mine, "other than an attnspec report"), (a_file, "is a file")):
        rc, _, err = run_cli(capsys, command, "--out", str(out), *extra)
        assert_one_line_error(rc, err, phrase)
    assert (mine / "thesis.tex").read_text() == "years of work" and sorted(os.listdir(mine)) == ["thesis.tex"]
    assert a_file.read_text() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "thesis"]  # no staging or .old folder left behind
