"""`attnspec run` and `attnspec report`: exit-2 paths, crashing or hanging backends recorded, the
suite children followed through the plugin's row stream (--attnspec-rows), and a plug-in of the user's own folder
checked and benchmarked from there (outputs under that folder, never in attnspec's own)."""
from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from attnspec import cli, procs, suites
from attnspec.commands import run_cmd
from attnspec.properties import results

SAMPLE = os.path.join(os.path.dirname(__file__), "data", "report_sample")
HAS_REPORT_DEPS = all(procs.importable(m) for m in ("pandas", "matplotlib", "jinja2"))
needs_report = pytest.mark.skipif(not HAS_REPORT_DEPS, reason="pandas, matplotlib and Jinja2 are needed to write a report")


@pytest.fixture(autouse=True)
def _a_folder_of_its_own(tmp_path, monkeypatch):
    """Every test here runs in a folder of its own: `attnspec run` keeps its lock, `.attnspec/` and
    `reports/out/` in the working folder, and tests side by side (pytest-xdist) must not share one (two
    in the checkout at once: the second refused as "already running")."""
    monkeypatch.chdir(tmp_path)


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


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_run_with_an_unknown_backend_exits_2(capsys, tmp_path):
    rc, _, err = run_cli(capsys, "run", "--backend", "no-such-backend", "--no-bench", "--out", str(tmp_path / "o"))
    assert_one_line_error(rc, err, "unknown backend 'no-such-backend'")
    assert not (tmp_path / "o").exists()


def test_run_without_asv_exits_2_before_running_anything(capsys, monkeypatch, tmp_path):
    """asv is looked for in this interpreter (sys.executable -m asv), not on PATH: the message names
    the interpreter that lacks it."""
    monkeypatch.setattr(procs, "importable", lambda module: module != "asv")
    monkeypatch.setattr(run_cmd, "select_backends", lambda args: pytest.fail("ran before checking for asv"))
    rc, _, err = run_cli(capsys, "run", "--out", str(tmp_path / "o"))
    assert_one_line_error(rc, err, f"asv is not installed for {sys.executable}", "--no-bench")


@pytest.mark.slow
def test_a_second_run_in_the_same_folder_refuses_while_the_first_runs(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    lock = str(tmp_path / ".attnspec" / "run.lock")
    first = subprocess.Popen([sys.executable, "-c", f"import time\nfrom attnspec import files\n"
                              f"with files.run_lock({lock!r}):\n    print('held', flush=True)\n    time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        monkeypatch.setattr(run_cmd, "_run", lambda *a: pytest.fail("ran beside another run"))
        rc, _, err = run_cli(capsys, "run", "--no-bench", "--backend", "numpy-naive")
        assert_one_line_error(rc, err, f"another attnspec run (pid {first.pid}", "is running in this folder")
    finally:
        first.kill()  # SIGKILL: the kernel releases its lock
        first.wait()
    monkeypatch.setattr(run_cmd, "_run", lambda *a: 0)
    assert run_cli(capsys, "run", "--no-bench", "--backend", "numpy-naive")[0] == 0
    assert (tmp_path / ".attnspec" / "run.lock").read_text() == ""  # released: nobody's pid in it


@pytest.mark.slow
@needs_report
@pytest.mark.timeout(300)
def test_sigterm_ends_a_run_like_ctrl_c_leaving_the_previous_report_and_no_lock(tmp_path):
    """SIGTERM (a scheduler's stop, a kill) in the middle of the suites: the children are ended, the
    previous report stays whole, the run's lock is released and no temporary is left beside it."""
    out = tmp_path / "reports" / "out"
    assert cli.main(["report", "--out", str(out), os.path.join(SAMPLE, "suite_cpu.json")]) == 0
    before = (out / "index.html").read_bytes()
    run = subprocess.Popen([sys.executable, "-m", "attnspec", "run", "--no-bench", "--backend", "numpy-naive"],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=_clean_env(ATTNSPEC_PROFILE="dev", HOME=str(tmp_path)))
    seen = []
    for line in run.stdout:  # the suite's child has started
        seen.append(line)
        if "[suite 1/1] numpy-naive: started" in line:
            break
    assert str(run.pid) in (tmp_path / ".attnspec" / "run.lock").read_text(), seen
    run.send_signal(signal.SIGTERM)
    rest = run.communicate(timeout=60)[0]
    assert run.returncode == 130, "".join(seen) + rest
    assert "interrupted; the previous report is left as it was" in rest
    assert (out / "index.html").read_bytes() == before
    assert (tmp_path / ".attnspec" / "run.lock").read_text() == ""  # released
    assert sorted(os.listdir(out.parent)) == ["out"]  # no staging or .old folder left


@needs_report
def test_a_run_whose_asv_file_is_truncated_reports_the_rest_and_exits_1(capsys, monkeypatch, tmp_path):
    """An asv process killed while writing its results (the OOM killer): the run's report is still
    written - conformance rows and all - naming the file it skipped, and the exit status says so."""
    from attnspec import asvtool

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    passed = dict(backend="numpy-naive", property="rows_sum_to_one", dtype="float64", status="passed", examples=6,
                  seconds=0.1, counterexample=None, message=None)
    monkeypatch.setattr(suites, "run_suites", lambda chosen, *a, **kw: {"conformance": [passed], "semantics": []})

    def machine_file(folder):
        path = os.path.join(folder, "home", asvtool.MACHINE_FILE)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"vm": {"machine": "vm"}, "version": 1}, f)
        return path

    written = []

    def killed_asv(cmd, env=None, prefix="", **kw):
        with open(cmd[cmd.index("--config") + 1]) as f:
            results = json.load(f)["results_dir"]
        os.makedirs(os.path.join(results, "vm"))
        with open(os.path.join(results, "vm", "machine.json"), "w") as f:
            json.dump({"machine": "vm", "version": 1}, f)
        path = os.path.join(results, "vm", "c0ffee-existing.json")
        with open(path, "w") as f:
            f.write('{"version": 2, "commit_hash": "c0ff')  # killed here
        written.append(path)
        return -9

    monkeypatch.setattr(asvtool, "machine_file", machine_file)
    monkeypatch.setattr(procs, "stream", killed_asv)
    rc, text, err = run_cli(capsys, "run", "--quick", "--backend", "numpy-naive", "--baselines", "")
    assert rc == 1, text[-2000:] + err[-2000:]
    for path in written:
        assert f"attnspec run: skipped: {path} — not a readable asv results file" in err, err
    assert "the report is incomplete" in err
    out = tmp_path / "reports" / "out"
    assert [r["backend"] for r in read_csv(out / "conformance.csv")] == ["numpy-naive"]
    assert f"skipped: {written[0]} — not a readable asv results file" in (out / "index.html").read_text(encoding="utf-8")


@needs_report
def test_report_with_one_truncated_input_writes_the_rest_and_exits_1(capsys, tmp_path):
    good = os.path.join(SAMPLE, "suite_cpu.json")
    with open(good) as f:
        text = f.read()
    bad = tmp_path / "suite_gpu.json"
    bad.write_text(text[: len(text) // 2])  # a writer killed half-way
    out = tmp_path / "o"
    rc, printed, err = run_cli(capsys, "report", "--out", str(out), good, str(bad), os.path.join(SAMPLE, "asv_results"))
    assert rc == 1, err
    assert f"attnspec report: skipped: {bad} — not valid JSON" in err and "the report is incomplete" in err
    assert "index.html" in printed and read_csv(out / "conformance.csv") and read_csv(out / "benchmarks.csv")
    assert f"skipped: {bad} — not valid JSON" in (out / "index.html").read_text(encoding="utf-8")


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


@needs_report
def test_report_rebuilds_from_the_sample(capsys, tmp_path):
    out = tmp_path / "o"
    rc, text, _ = run_cli(capsys, "report", "--out", str(out), os.path.join(SAMPLE, "suite_cpu.json"),
                          os.path.join(SAMPLE, "asv_results"))
    assert rc == 0 and "index.html" in text
    rc, _, _ = run_cli(capsys, "report", "--out", str(out))  # again, from its own stored copy
    assert rc == 0 and (out / "raw" / "suite.json").exists()


@needs_report
def test_report_writes_under_the_folder_it_is_started_from(capsys, monkeypatch, tmp_path):
    """The default --out is ./reports/out of the current folder, not attnspec's own."""
    monkeypatch.chdir(tmp_path)
    rc, text, _ = run_cli(capsys, "report", os.path.join(SAMPLE, "suite_cpu.json"))
    assert rc == 0, text
    assert (tmp_path / "reports" / "out" / "index.html").is_file()
    assert os.path.join("reports", "out", "index.html") in text
    assert run_cmd.DEFAULT_OUT == os.path.join("reports", "out")  # relative: resolved where attnspec starts


@pytest.mark.slow
def test_a_child_that_dies_or_hangs_is_recorded_and_the_rest_goes_on(tmp_path):
    crash = suites.run_suite_child("a", str(tmp_path / "a.json"), 30,
                             command=lambda b, p, log: [sys.executable, "-c", "import os; print('t.py::a PASSED'); "
                                                        "print('t.py::b', end=''); os._exit(3)"])
    (row,) = crash["conformance"]
    assert row["status"] == "crashed" and "exit status 3" in row["message"] and "t.py::b" in row["message"]
    hang = suites.run_suite_child("b", str(tmp_path / "b.json"), 1.5,
                            command=lambda b, p, log: [sys.executable, "-c", "import time; time.sleep(60)"])
    (row,) = hang["conformance"]
    assert row["status"] == "timed_out" and "1.5 s" in row["message"] and row["seconds"] < 30


@pytest.mark.slow
def test_the_suite_command_follows_the_child_through_its_row_stream():
    cmd = suites.suite_command("mypkg.attn:sdpa", "/x/s.json", "/x/s.json.rows.jsonl")
    assert cmd[:5] == [sys.executable, "-m", "pytest", "--pyargs", "attnspec.properties"]
    for flag, value in (("--backend", "mypkg.attn:sdpa"), ("--attnspec-json", "/x/s.json"),
                        ("--attnspec-rows", "/x/s.json.rows.jsonl")):
        assert cmd[cmd.index(flag) + 1] == value, flag


def _fake_backends(tmp_path):
    """tests/data/report_sample/fake_backends.py in a folder of its own (the suite writes its
    Hypothesis database in the folder it runs in: not in this checkout)."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(os.path.join(SAMPLE, "fake_backends.py"), work / "fake_backends.py")
    return work


@needs_report
@pytest.mark.slow
def test_run_records_a_crashing_and_a_hanging_backend(capsys, monkeypatch, tmp_path):
    """Through the real suite: fake plug-ins that os._exit() or sleep; the report still gets written.

    The hanging one is ended as soon as its report log shows the hung call (2 s per-call limit here),
    long before the suite's own limit: its stuck thread does not run on, and every test it had not
    finished is recorded as failed, not attempted."""
    monkeypatch.chdir(_fake_backends(tmp_path))  # plug-ins in the user's working folder are importable by the children
    monkeypatch.setenv("ATTNSPEC_CALL_TIMEOUT", "2")
    out = tmp_path / "out"
    rc, text, _ = run_cli(capsys, "run", "--backend", "fake_backends:Crashing", "--backend", "fake_backends:Hanging",
                          "--no-bench", "--suite-timeout", "300", "--out", str(out))
    assert rc == 1, text
    conf = read_csv(out / "conformance.csv")
    rows = {r["backend"]: r for r in conf if r["property"] == "(suite)"}
    assert rows["fake-crashing"]["status"] == "crashed", rows
    assert "while running " in rows["fake-crashing"]["message"], rows  # the test it died in, from the report log
    hung = rows["fake-hanging"]
    assert hung["status"] == "timed_out" and "per-call limit" in hung["message"], hung
    assert float(hung["seconds"]) < 120, hung  # ended at the hang, not at the 300 s limit
    skipped_attempts = [r for r in conf if r["backend"] == "fake-hanging" and r["message"].startswith("not attempted")]
    assert skipped_attempts and all(r["status"] == "failed" for r in skipped_attempts), conf
    verdicts = {r["backend"]: r["verdict"] for r in read_csv(out / "verdicts.csv")}
    assert verdicts == {"fake-crashing": "crashed", "fake-hanging": "timed out"}
    assert "[suite 2/2] fake_backends:Hanging" in text


# -- the suite's progress, read from the plugin's row stream (--attnspec-rows) ---------------------
#
# A stand-in for the suite: a real pytest run whose tests carry their rows in user_properties the
# way the suite's plugin does (properties/results.py), so the row stream is the one the plugin
# writes, not a hand-written imitation of it.

_FAKE_CONFTEST = f"""
TEST_KEY = {results.TEST_KEY!r}


def pytest_collection_modifyitems(items):
    for item in items:
        item.user_properties.append(
            (TEST_KEY, dict(backend="fake", property=item.originalname.removeprefix("test_"), dtype="float32")))
"""

_FAKE_SUITE = f"""
import os, time

import pytest

ROW, SEMANTICS = {results.ROW_KEY!r}, {results.SEMANTICS_KEY!r}
one = pytest.mark.parametrize("dtype", ["float32"], ids=["fake-float32"])
ENDING = os.environ["FAKE_ENDING"]  # hung: b's call hung and the process would run on; crash: dies in b; done


@one
def test_a(request, dtype):
    with open(os.environ["FAKE_PID_FILE"], "w") as f:
        f.write(str(os.getpid()))
    request.node.user_properties.append((ROW, dict(examples=3, hung="")))
    request.node.user_properties.append(
        (SEMANTICS, dict(backend="fake", question="q", dtype="float32", observed="nan", declared="nan", agrees=True)))


@one
def test_b(request, dtype):
    if ENDING == "crash":
        os._exit(3)
    request.node.user_properties.append(
        (ROW, dict(examples=1, failed=True, message="forward did not return", hung="forward")))
    pytest.fail("forward did not return")


@one
def test_c(request, dtype):
    if ENDING == "hung":  # the stuck call's thread: the child would run on for a minute
        time.sleep(60)
    request.node.user_properties.append((ROW, dict(examples=2, hung="")))
"""


def _fake_suite(tmp_path):
    suite = tmp_path / "fake_suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(_FAKE_CONFTEST)
    (suite / "test_fake.py").write_text(_FAKE_SUITE)
    return suite


def _fake_command(suite):
    return lambda backend, json_path, log: [sys.executable, "-m", "pytest", str(suite), "-q", "-p", "no:cacheprovider",
                                            "--attnspec-rows", log]


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["hung", "crash"])
def test_the_runner_reads_the_childs_row_stream(tmp_path, monkeypatch, ending):
    """Rows of the tests that finished come from the row stream when the child does not finish by itself."""
    suite = _fake_suite(tmp_path)
    pid_file = tmp_path / "pid"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAKE_ENDING", ending)
    monkeypatch.setenv("FAKE_PID_FILE", str(pid_file))
    start = time.monotonic()
    data = suites.run_suite_child("fake", str(tmp_path / "s.json"), 90, shown="fake", command=_fake_command(suite))
    rows = {r["property"]: r for r in data["conformance"]}
    assert rows["a"]["status"] == "passed" and rows["a"]["examples"] == 3
    assert data["semantics"] == [dict(backend="fake", question="q", dtype="float32", observed="nan", declared="nan",
                                      agrees=True)]
    assert not os.path.exists(tmp_path / "s.json.rows.jsonl")  # the stream is the runner's own: removed
    if ending == "hung":
        assert time.monotonic() - start < 30  # ended at the hang, not after the child's minute
        with pytest.raises(ProcessLookupError):  # and gone: no stuck thread left running
            os.kill(int(pid_file.read_text()), 0)
        assert rows["b"]["status"] == "failed" and rows["b"]["message"] == "forward did not return"
        assert rows["c"]["status"] == "failed", rows
        assert rows["c"]["message"].startswith("not attempted: an earlier forward call did not return")
        assert rows["(suite)"]["status"] == "timed_out" and "in b[float32]" in rows["(suite)"]["message"]
        assert "1 remaining test(s)" in rows["(suite)"]["message"]
    else:
        assert set(rows) == {"a", "(suite)"}
        assert rows["(suite)"]["status"] == "crashed", rows
        assert "while running b[float32]" in rows["(suite)"]["message"], rows["(suite)"]


def _row_stream(tmp_path) -> list[bytes]:
    """The lines of a finished run's row stream: a passes, b fails reporting a hung call, c passes."""
    suite = _fake_suite(tmp_path)
    log = tmp_path / "full.jsonl"
    env = dict(os.environ, FAKE_ENDING="done", FAKE_PID_FILE=str(tmp_path / "pid"))
    done = subprocess.run(_fake_command(suite)("fake", "", str(log)), cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr  # b failed
    return log.read_bytes().splitlines(keepends=True)


@pytest.mark.slow
def test_progress_reads_the_row_stream_while_the_child_runs(tmp_path):
    """Counts, the test running now and the hung call, from the stream as it stands while c runs
    (a torn last line waits for the rest); then the rest."""
    lines = _row_stream(tmp_path)
    entries = [json.loads(line) for line in lines]
    assert "collected" in entries[0] and len(entries[0]["collected"]) == 3
    b_done = next(i for i, e in enumerate(entries) if e.get("nodeid", "").endswith("test_b[fake-float32]"))
    path = tmp_path / "live.jsonl"
    torn = lines[b_done + 1][: len(lines[b_done + 1]) // 2]
    path.write_bytes(b"".join(lines[: b_done + 1]) + torn)
    shown = io.StringIO()
    progress = suites.SuiteProgress(label="fake", redraw=False, stream=shown, path=str(path))
    progress.read()
    assert progress.counts == {"passed": 1, "failed": 1}
    assert progress.hung == "forward" and progress.hung_in == "b[float32]"
    assert progress.current == "c[float32]"  # collected, not finished: running now
    text = progress.text()
    assert text.startswith("fake: 2/3 tests: 1 failed, 1 passed") and "running c[float32]" in text, text
    rows = progress.rows()
    assert [(r["property"], r["status"], r["examples"]) for r in rows["conformance"]] == [("a", "passed", 3),
                                                                                         ("b", "failed", 1)]
    assert rows["conformance"][1]["message"] == "forward did not return"
    assert [r["question"] for r in rows["semantics"]] == ["q"]
    (missing,) = progress.not_attempted("fake", "why")
    assert (missing["property"], missing["status"], missing["message"]) == ("c", "failed", "not attempted: why")
    progress.show(final=False)
    assert shown.getvalue().startswith("  fake: 2/3 tests")
    with open(path, "ab") as f:  # the rest of the torn line, and the end of the run
        f.write(lines[b_done + 1][len(torn):] + b"".join(lines[b_done + 2:]))
    progress.read()
    assert progress.counts == {"passed": 2, "failed": 1} and progress.current == ""
    assert progress.not_attempted("fake", "why") == [] and "3/3 tests" in progress.text()


def test_progress_of_a_log_not_written_yet_is_a_start(tmp_path):
    progress = suites.SuiteProgress(redraw=False, stream=io.StringIO(), path=str(tmp_path / "nothing.jsonl"))
    progress.read()
    assert progress.counts == {} and progress.current == "" and progress.text().startswith("starting")


@needs_report
def test_a_named_backend_with_nothing_tested_fails_the_run(capsys, monkeypatch, tmp_path):
    """Through the real suite: a backend whose declared dtypes have no error budget runs no test."""
    monkeypatch.chdir(_fake_backends(tmp_path))
    out = tmp_path / "out"
    rc, text, err = run_cli(capsys, "run", "--backend", "fake_backends:Int8Only", "--no-bench", "--out", str(out))
    assert rc == 1, text + err
    assert "fake-int8-only was asked for but not tested" in err and "selected no test" in err
    (verdict,) = read_csv(out / "verdicts.csv")
    assert verdict["backend"] == "fake-int8-only" and verdict["verdict"].startswith("not tested")


@needs_report
@pytest.mark.parametrize("asked", [True, False])
def test_an_unavailable_backend_fails_the_run_only_when_asked_for(capsys, monkeypatch, tmp_path, asked):
    """Named with --backend and not tested: exit 1.  Left out of the default selection (not installed): exit 0."""
    monkeypatch.delenv("ATTNSPEC_BACKENDS", raising=False)
    monkeypatch.setattr(run_cmd, "probe", lambda names: [
        ("numpy-naive", True, "", "numpy-naive"), ("torch-sdpa-cuda-flash", False, "no CUDA device", "torch-sdpa-cuda-flash")])
    passed = dict(backend="numpy-naive", property="rows_sum_to_one", dtype="float64", status="passed", examples=6,
                  seconds=0.1, counterexample=None, message=None)
    monkeypatch.setattr(suites, "run_suites", lambda chosen, *a, **kw: {"conformance": [passed], "semantics": []})
    names = ["--backend", "numpy-naive", "--backend", "torch-sdpa-cuda-flash"] if asked else []
    rc, text, err = run_cli(capsys, "run", *names, "--no-bench", "--out", str(tmp_path / "out"))
    verdicts = {r["backend"]: r["verdict"] for r in read_csv(tmp_path / "out" / "verdicts.csv")}
    assert verdicts == {"numpy-naive": "conforms", "torch-sdpa-cuda-flash": "not tested (all skipped)"}
    if asked:
        assert rc == 1 and "torch-sdpa-cuda-flash was asked for but not tested: no CUDA device" in err
    else:
        assert rc == 0 and "not tested" not in err, err


@pytest.mark.slow
def test_the_commands_load_no_framework_until_a_report_is_built(tmp_path):
    code = ("import sys, attnspec.cli, attnspec.commands.run_cmd, attnspec.commands.report_cmd, attnspec.reports.build, "
            "attnspec.procs, attnspec.suites, attnspec.benchrun; "
            "heavy = {'pandas', 'matplotlib', 'torch', 'jax'} & set(sys.modules); assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_the_commands_do_not_import_the_cli(tmp_path):
    """No import cycle: the subcommands share attnspec.errors; `python -m attnspec.cli` exits 2 on a user error."""
    code = ("import sys, attnspec.commands.run_cmd, attnspec.commands.report_cmd, attnspec.commands.backends_cmd; "
            "assert 'attnspec.cli' not in sys.modules, 'a command imports attnspec.cli'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([sys.executable, "-m", "attnspec.cli", "report", "--out", str(tmp_path / "none")],
                          capture_output=True, text=True, cwd=tmp_path)
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


@pytest.mark.parametrize("command", ["run", "report"])
def test_out_never_replaces_what_is_not_a_report(capsys, monkeypatch, tmp_path, command):
    """--out pointing at the user's own folder or file: exit 2 before anything runs, nothing lost."""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")  # the run's own lock folder stays out of the listing below
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
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "thesis", "work"]  # no staging or .old folder left behind


# -- a plug-in in the user's own folder (not installed), from that folder ---------------------------

PLUGIN = '''"""A plug-in of the user's own: a correct plain function with PyTorch's signature over NumPy arrays."""
import numpy as np


def sdpa(query, key, value, attn_mask=None, is_causal=False, scale=None):
    scale = 1.0 / np.sqrt(query.shape[-1]) if scale is None else scale
    s = (query @ np.swapaxes(key, -1, -2)) * query.dtype.type(scale)  # (..., Lq, Lk)
    vis = np.ones(s.shape[-2:], dtype=bool) if attn_mask is None else attn_mask  # (..., Lq, Lk)
    if is_causal:
        vis = vis & np.tri(*s.shape[-2:], dtype=bool)  # (..., Lq, Lk)
    s = np.where(vis, s, -np.inf)  # (..., Lq, Lk)
    e = np.exp(s - np.nan_to_num(s.max(-1, keepdims=True, initial=-np.inf), neginf=0))  # (..., Lq, Lk)
    total = e.sum(-1, keepdims=True)  # (..., Lq, 1)
    return (e / np.where(total == 0, 1, total)) @ value  # (..., Lq, Ev)
'''
PLUGIN_NAME = "mypkg.attn:sdpa"


def _user_folder(tmp_path):
    """A folder outside this checkout holding mypkg/attn.py (not installed: importable from there only)."""
    user = tmp_path / "project"
    (user / "mypkg").mkdir(parents=True)
    (user / "mypkg" / "__init__.py").write_text("")
    (user / "mypkg" / "attn.py").write_text(PLUGIN)
    assert not os.path.realpath(user).startswith(os.path.realpath(procs.ROOT) + os.sep)
    return user


def _not_in_attnspecs_own_report():
    """attnspec's own folder got no report of this run (another may be there: it must not be ours)."""
    verdicts = os.path.join(procs.ROOT, "reports", "out", "verdicts.csv")
    return not os.path.exists(verdicts) or PLUGIN_NAME not in {r["backend"] for r in read_csv(verdicts)}


def _clean_env(**extra) -> dict:
    """The user's shell: no ATTNSPEC_/ASV_ settings of this test run, no path into this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSPEC_", "ASV_")) and k != "PYTHONPATH"}
    env.update(extra)
    return env


@pytest.mark.slow
@needs_report
@pytest.mark.timeout(600)
def test_run_checks_a_plugin_of_the_current_folder_and_reports_there(tmp_path):
    """`attnspec run --no-bench --backend mypkg.attn:sdpa`, as a user types it in their own folder:
    the plug-in imports in the suite's children, and the report lands in ./reports/out there."""
    user = _user_folder(tmp_path)
    script = os.path.join(os.path.dirname(sys.executable), "attnspec")
    command = [script] if os.path.isfile(script) else [sys.executable, "-m", "attnspec"]
    done = subprocess.run([*command, "run", "--no-bench", "--backend", PLUGIN_NAME], cwd=user, capture_output=True,
                          text=True, timeout=540, env=_clean_env(ATTNSPEC_PROFILE="dev", HOME=str(tmp_path)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = user / "reports" / "out"
    assert f"report written to {out / 'index.html'}" in done.stdout, done.stdout[-2000:]
    assert (out / "index.html").is_file()
    verdicts = {r["backend"]: r["verdict"] for r in read_csv(out / "verdicts.csv")}
    assert verdicts == {PLUGIN_NAME: "conforms"}
    conf = [r for r in read_csv(out / "conformance.csv") if r["backend"] == PLUGIN_NAME]
    assert len(conf) > 10 and {r["dtype"] for r in conf} == {"float32", "float64"}
    assert {r["status"] for r in conf} <= {"passed", "skipped", "recorded"} and any(r["status"] == "passed" for r in conf)
    assert _not_in_attnspecs_own_report()
    assert not (user / ".attnspec" / "asv").exists()  # --no-bench: no asv folder


@pytest.mark.slow
@needs_report
@pytest.mark.timeout(600)
@pytest.mark.skipif(importlib.util.find_spec("asv") is None or shutil.which("git") is None, reason="needs asv and git")
def test_a_benchmark_run_of_a_plugin_imports_it_in_asvs_processes(capsys, monkeypatch, tmp_path):
    """`attnspec run --quick --backend mypkg.attn:sdpa` from the user's folder: asv's benchmark
    processes import the plug-in through ASV_PYTHONPATH, its results and the report land there.

    Kept to seconds: the suite is stubbed (the test above runs it), the machine's roofs are left
    out, and the grid is cut to one size (ATTNSPEC_BENCH_*); asv's machine file is a fresh one, as
    on a first run."""
    user = _user_folder(tmp_path)
    for var in [v for v in os.environ if v.startswith(("ATTNSPEC_", "ASV_"))]:
        monkeypatch.delenv(var)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.chdir(user)
    monkeypatch.setattr(sys, "path", list(sys.path))  # cli.main puts the current folder on it
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    for var, value in (("T", "16"), ("E", "16"), ("OPS", "forward"), ("LK", "64"), ("MASKS", "causal"),
                       ("HALF", "float16")):
        monkeypatch.setenv(f"ATTNSPEC_BENCH_{var}", value)
    passed = dict(backend=PLUGIN_NAME, property="rows_sum_to_one", dtype="float64", status="passed", examples=6,
                  seconds=0.1, counterexample=None, message=None)
    monkeypatch.setattr(suites, "run_suites", lambda chosen, *a, **kw: {"conformance": [passed], "semantics": []})
    asv_runs = []
    real_stream = procs.stream

    def stream(cmd, env=None, prefix="", **kw):
        asv_runs.append((cmd, env))
        if "^bench_machine" in cmd:  # the machine's roofs: a minute of matmuls, not this test's subject
            return 0
        return real_stream(cmd, env=env, prefix=prefix, **kw)

    monkeypatch.setattr(procs, "stream", stream)
    rc, text, err = run_cli(capsys, "run", "--quick", "--backend", PLUGIN_NAME, "--baselines", "numpy-naive")
    assert rc == 0, text[-4000:] + err[-2000:]
    assert "benchmarked beside them (not checked; --baselines): numpy-naive" in text
    shards = [(cmd, env) for cmd, env in asv_runs if "^bench_machine" not in cmd]
    assert {b for _, env in shards for b in env["ATTNSPEC_BACKENDS"].split(",")} == {PLUGIN_NAME, "numpy-naive"}
    for shard_cmd, shard_env in shards:
        assert shard_env["ASV_PYTHONPATH"].split(os.pathsep)[0] == str(user) and "--quick" in shard_cmd
        assert shard_cmd[:3] == [sys.executable, "-m", "asv"]
        assert shard_cmd[shard_cmd.index("--config") + 1].startswith(str(user / ".attnspec" / "asv" / "quick") + os.sep)
    results = user / ".attnspec" / "asv" / "quick" / "results"  # the quick grid's own database
    assert not (tmp_path / "home" / ".asv-machine.json").exists()  # the user's machine file is not written
    assert any(p.name != "machine.json" for p in results.glob("*/*.json")), list(results.rglob("*"))
    import pandas as pd

    bench = pd.read_csv(user / "reports" / "out" / "benchmarks.csv")
    mine = bench[bench["backend"] == PLUGIN_NAME]
    time_rows = mine[(mine["metric"] == "time") & (mine["problem"] == "dense")]
    assert list(time_rows["T"]) == [16] and (time_rows["value"] > 0).all(), mine
    assert {"time", "gflops", "memory"} <= set(mine["metric"]), set(mine["metric"])
    assert set(mine[mine["metric"] == "time"]["problem"]) == {"dense", "decode", "causal"}
    beside = bench[(bench["backend"] == "numpy-naive") & (bench["metric"] == "time")]
    assert list(beside[(beside["problem"] == "dense") & (beside["dtype"] == "float32")]["T"]) == [16]  # timed beside it
    verdicts = {r["backend"]: r["verdict"] for r in read_csv(user / "reports" / "out" / "verdicts.csv")}
    assert verdicts == {PLUGIN_NAME: "conforms"}  # benchmarked only: no verdict for the baseline
    assert _not_in_attnspecs_own_report()


def test_an_unknown_baseline_is_bad_input_naming_the_option(capsys, monkeypatch):
    monkeypatch.setattr(run_cmd, "probe", lambda names: pytest.fail("probed before checking --baselines"))
    rc, text, err = run_cli(capsys, "run", "--quick", "--backend", "numpy-naive", "--baselines", "numpy-naive,nope")
    assert rc == 2 and err.strip().splitlines()[-1].startswith("attnspec run: --baselines: nope is not a built-in"), err


@needs_report
@pytest.mark.parametrize("names, environ, expected", [
    ((), {}, "dev"),                                         # every built-in: the light run
    (("numpy-naive",), {}, "deep"),                          # the one a user brings: the thorough run
    (("numpy-naive", "numpy-tiled", "torch-math", "jax-naive"), {}, "dev"),
    (("numpy-naive",), {"ATTNSPEC_PROFILE": "ci"}, "ci"),    # asked for: kept
])
def test_the_suites_depth_follows_the_runs_selection_not_each_childs(capsys, monkeypatch, tmp_path, names,
                                                                     environ, expected):
    """Each child names one backend (alone it would be deep): the run passes its own profile down."""
    monkeypatch.delenv("ATTNSPEC_BACKENDS", raising=False)
    monkeypatch.delenv("ATTNSPEC_PROFILE", raising=False)
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    for var, value in environ.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(run_cmd, "probe", lambda asked: [(n, True, "", n) for n in asked])
    seen = {}
    passed = dict(backend="numpy-naive", property="rows_sum_to_one", dtype="float64", status="passed", examples=6,
                  seconds=0.1, counterexample=None, message=None)

    def run_suites(chosen, *a, profile=""):
        seen["profile"] = profile
        return {"conformance": [passed], "semantics": []}

    monkeypatch.setattr(suites, "run_suites", run_suites)
    argv = [x for n in names for x in ("--backend", n)]
    rc, text, err = run_cli(capsys, "run", *argv, "--no-bench", "--out", str(tmp_path / "out"))
    assert seen["profile"] == expected and f"attnspec run: profile {expected} " in text, text + err


def test_a_run_after_an_interrupted_one_in_the_same_process_starts_its_children(tmp_path):
    """kill_all (Ctrl-C, SIGTERM) stops every child of that run; a later run in the same process (the
    command called again, the API) starts its children again instead of returning 'interrupted'."""
    procs.kill_all()
    assert procs.watch([sys.executable, "-c", "print('ran')"], timeout=60).rc != 0  # still stopping
    procs.start_run()
    done = procs.watch([sys.executable, "-c", "print('ran')"], timeout=60)
    assert done.rc == 0 and "ran" in done.output, done


_SELF_ENDED_CHILD = r'''
import json, sys
json_path, log = sys.argv[1], sys.argv[2]
row = dict(backend="fake", property="b", dtype="float32", status="failed", examples=1, seconds=2.0,
           counterexample="", message="forward did not return", hung="forward")
rest = dict(row, property="c", examples=0, seconds=0.0, hung="forward",
            message="not attempted: an earlier forward call did not return within the per-call limit")
with open(log, "w") as f:
    for r in (row, rest):
        f.write(json.dumps({"nodeid": "t::test_" + r["property"], "row": r}) + "\n")
with open(json_path, "w") as f:
    json.dump({"conformance": [row, rest], "semantics": []}, f)
sys.exit(1)
'''


def test_a_child_that_learned_the_hang_itself_gets_the_same_verdict(tmp_path):
    """A suite child whose backend hung fails its remaining tests at once (a hang is learned once) and may
    finish before the runner, reading its row stream, ends it - on a loaded machine it often does.  Either
    way the backend's verdict is the same: timed out at the per-call limit, naming the hung call; the rows
    it wrote are kept."""
    script = tmp_path / "child.py"
    script.write_text(_SELF_ENDED_CHILD)
    data = suites.run_suite_child("fake", str(tmp_path / "s.json"), 90, shown="fake",
                                  command=lambda backend, json_path, log: [sys.executable, str(script), json_path, log])
    rows = {r["property"]: r for r in data["conformance"]}
    assert rows["(suite)"]["status"] == "timed_out", rows
    assert "per-call limit" in rows["(suite)"]["message"] and "in b[float32]" in rows["(suite)"]["message"]
    assert rows["c"]["status"] == "failed" and rows["c"]["message"].startswith("not attempted")


def test_progress_counts_the_tests_of_every_dtype_fp8_included(tmp_path):
    """A backend's fp8 targets are collected tests like the rest: counted, shown running, and reported
    not attempted when the child dies before them."""
    ids = [f"properties/test_output.py::test_matches_reference[fake-{d}]" for d in ("float32", "float8_e4m3fn")]
    row = dict(backend="fake", property="matches_reference", dtype="float32", status="passed", examples=6,
               seconds=0.1, counterexample="", message="")
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"collected": ids}) + "\n" + json.dumps({"nodeid": ids[0], "row": row}) + "\n")
    progress = suites.SuiteProgress(label="fake", redraw=False, stream=io.StringIO(), path=str(path))
    progress.read()
    assert progress.text().startswith("fake: 1/2 tests") and progress.current == "matches_reference[float8_e4m3fn]"
    (missing,) = progress.not_attempted("fake", "why")
    assert (missing["property"], missing["dtype"]) == ("matches_reference", "float8_e4m3fn")
