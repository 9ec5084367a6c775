"""Results are never lost: asv processes side by side share no file they write (a stub that writes
as asv does, slowly and in pieces, into many shards), one merge into the grid's database after them
(attnspec/asv_merge.py), a quick grid that never replaces the full sweep, files written whole and
a lock that keeps a second `attnspec run` out of the folder (attnspec/files.py)."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time

import pytest

from attnspec import asv_merge, asvtool, benchrun, files, procs

COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_number", "stats_repeat"]
COMMIT = "c0ffee" * 6 + "c0ff"
ENV_FILE = f"{COMMIT[:8]}-existing.json"


def _result_file(backends, ts=("64", "256"), base=1.0, commit=COMMIT):
    values = [base * (i + 1) for i in range(len(backends) * len(ts))]
    entry = [values, [[repr(b) for b in backends], list(ts)], "v1", 0, 2.0, [10] * len(values), [3] * len(values)]
    return {"version": 2, "commit_hash": commit, "env_name": "existing", "result_columns": COLUMNS,
            "results": {"bench_attention.TimeAttention.time_attention": entry}, "durations": {}, "params": {}}


def _write_slowly(path, text, pieces=4, pause=0.01):
    """As asv writes (util.write_json): open, then the text in pieces - a reader or a second writer
    in between sees or makes a broken file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        step = max(1, len(text) // pieces)
        for i in range(0, len(text), step):
            f.write(text[i:i + step])
            f.flush()
            time.sleep(pause)


def _fake_asv(cmd, env=None, prefix="", **kw):
    """asv run, stubbed: rewrites HOME's machine file and results_dir/benchmarks.json as it starts
    (both non-atomically, as asv does), then writes one results file for its backends."""
    config = _json(cmd[cmd.index("--config") + 1])
    results = config["results_dir"]
    machine_path = os.path.join(env["HOME"], asvtool.MACHINE_FILE)
    machines = _json(machine_path)  # asv: Machine.load reads, then saves it
    _write_slowly(machine_path, json.dumps(machines, indent=4))
    backends = env["ATTNSPEC_BACKENDS"].split(",")
    declared = {"bench_attention.TimeAttention.time_attention": {  # long enough to be written in many pieces
        "param_names": ["backend", "T"], "params": [[repr(b) for b in backends], ["64", "256"]], "code": "x" * 2000}}
    _write_slowly(os.path.join(results, "benchmarks.json"), json.dumps(declared, indent=4))
    _write_slowly(os.path.join(results, "vm", "machine.json"), json.dumps({"machine": "vm", "version": 1}))
    _write_slowly(os.path.join(results, "vm", ENV_FILE), json.dumps(_result_file(backends)))
    return 0


def _json(path):
    with open(path) as f:
        return json.load(f)


@pytest.fixture
def user(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(procs, "stream", _fake_asv)

    def machine_file(folder):
        path = os.path.join(folder, "home", asvtool.MACHINE_FILE)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        files.write_json_atomic(path, {"vm": {"machine": "vm"}, "version": 1})
        return path

    monkeypatch.setattr(asvtool, "machine_file", machine_file)
    return tmp_path


def _every_json_parses(root):
    found = [p for p in glob.glob(os.path.join(root, "**", "*.json"), recursive=True)]
    for path in found:
        with open(path) as f:
            json.load(f)  # raises on interleaved or half-written text
    assert not glob.glob(os.path.join(root, "**", "*.tmp"), recursive=True)  # no temporary left
    return found


@pytest.mark.parametrize("jobs", [2, 4, 8])
def test_many_shards_side_by_side_leave_every_json_parsable(monkeypatch, user, jobs):
    """Each shard writes benchmarks.json and the machine file while the others do: with shared
    folders their pieces interleave (the report lost to a JSONDecodeError); here none is shared."""
    names = [f"backend-{i}" for i in range(jobs)]
    monkeypatch.setenv("ATTNSPEC_BENCH_JOBS", str(jobs))
    for _ in range(3):  # a shorter form of "ten quick runs in a row"
        dirs, rc, skipped = benchrun.run_benchmarks([(n, n) for n in names], "quick", COMMIT)
        assert rc == 0 and skipped == [] and len(dirs) == jobs + 1
        assert _every_json_parses(str(user / ".attnspec"))
    merged = _json(user / ".attnspec" / "asv" / "quick" / "results" / "vm" / ENV_FILE)
    backends = merged["results"]["bench_attention.TimeAttention.time_attention"][1][0]
    assert sorted(backends) == sorted(repr(n) for n in names)  # every shard's backends in the one database file
    assert _json(user / ".attnspec" / "asv" / "quick" / "results" / "attnspec.json") == {"grid": "quick"}
    declared = _json(user / ".attnspec" / "asv" / "quick" / "results" / "benchmarks.json")
    # asv show / compare list the values benchmarks.json declares: every shard's backends (seen: one shard's only)
    backends_declared = declared["bench_attention.TimeAttention.time_attention"]["params"][0]
    assert sorted(backends_declared) == sorted(repr(n) for n in names)


def test_a_quick_run_after_a_full_one_keeps_the_full_sweep(monkeypatch, user):
    names = ["numpy-naive", "torch-math"]
    monkeypatch.setenv("ATTNSPEC_BENCH_JOBS", "2")
    benchrun.run_benchmarks([(n, n) for n in names], "full", COMMIT)
    full = (user / ".attnspec" / "asv" / "full" / "results" / "vm" / ENV_FILE).read_text()
    benchrun.run_benchmarks([(n, n) for n in names], "quick", COMMIT)
    assert (user / ".attnspec" / "asv" / "full" / "results" / "vm" / ENV_FILE).read_text() == full
    assert (user / ".attnspec" / "asv" / "quick" / "results" / "vm" / ENV_FILE).is_file()
    benchrun.run_benchmarks([(n, n) for n in names], "full", COMMIT)  # a full run after the quick one: full again
    after = (user / ".attnspec" / "asv" / "full" / "results" / "vm" / ENV_FILE).read_text()
    assert json.loads(after) == json.loads(full)


def test_a_run_of_one_backend_keeps_the_others_results_at_that_commit(tmp_path):
    db, one = tmp_path / "db", tmp_path / "one"
    for folder, backends, base in ((db, ["a", "b", "c"], 1.0), (one, ["b"], 100.0)):
        (folder / "vm").mkdir(parents=True)
        (folder / "vm" / "machine.json").write_text("{}")
        (folder / "vm" / ENV_FILE).write_text(json.dumps(_result_file(backends, base=base)))
    assert asv_merge.merge_into(str(db), [str(one)]) == []
    entry = _json(db / "vm" / ENV_FILE)["results"]["bench_attention.TimeAttention.time_attention"]
    row = dict(zip(COLUMNS, entry, strict=True))
    assert row["params"] == [["'a'", "'b'", "'c'"], ["64", "256"]]
    assert row["result"] == [1.0, 2.0, 100.0, 200.0, 5.0, 6.0]  # b's new block between a's and c's old ones
    assert row["stats_number"] == [10] * 6


def test_a_grid_of_other_sizes_replaces_the_entry_whole(tmp_path):
    old = _result_file(["a", "b"])["results"]["bench_attention.TimeAttention.time_attention"]
    new = _result_file(["b"], ts=("64",))["results"]["bench_attention.TimeAttention.time_attention"]
    assert asv_merge.merge_entry(old, new, COLUMNS) == new


def test_an_unreadable_shard_result_is_named_and_the_database_keeps_its_file(tmp_path):
    db, bad = tmp_path / "db", tmp_path / "bad"
    for folder in (db, bad):
        (folder / "vm").mkdir(parents=True)
        (folder / "vm" / "machine.json").write_text("{}")
    (db / "vm" / ENV_FILE).write_text(json.dumps(_result_file(["a"])))
    text = json.dumps(_result_file(["a"], base=7.0))
    (bad / "vm" / ENV_FILE).write_text(text[: len(text) // 2])  # a process killed mid-write
    (skip,) = asv_merge.merge_into(str(db), [str(bad)])
    assert skip.startswith(str(bad / "vm" / ENV_FILE) + " — ")
    assert _json(db / "vm" / ENV_FILE) == _result_file(["a"])


def test_an_unreadable_database_file_is_named_and_set_aside_never_overwritten_unread(tmp_path):
    """The grid's own results file or benchmarks.json cut short (a disk full, an editor): the merge says so
    and keeps the unreadable file beside it (.bad), then writes this run's results."""
    db, one = tmp_path / "db", tmp_path / "one"
    for folder in (db, one):
        (folder / "vm").mkdir(parents=True)
        (folder / "vm" / "machine.json").write_text("{}")
    text = json.dumps(_result_file(["a", "b"]))
    (db / "vm" / ENV_FILE).write_text(text[: len(text) // 2])
    (db / "benchmarks.json").write_text('{"bench_attention.TimeAttention.time_attention": {"par')
    (one / "vm" / ENV_FILE).write_text(json.dumps(_result_file(["b"], base=3.0)))
    (one / "benchmarks.json").write_text(json.dumps({"x": {"params": [["'b'"]]}}))
    skipped = asv_merge.merge_into(str(db), [str(one)])
    assert sorted(s.split(" — ")[0] for s in skipped) == sorted([str(db / "benchmarks.json"), str(db / "vm" / ENV_FILE)])
    assert (db / "vm" / (ENV_FILE + ".bad")).read_text() == text[: len(text) // 2]
    assert (db / "benchmarks.json.bad").is_file() and _json(db / "benchmarks.json") == {"x": {"params": [["'b'"]]}}
    assert _json(db / "vm" / ENV_FILE) == _result_file(["b"], base=3.0)


def test_backend_seconds_are_read_from_the_newest_results(tmp_path):
    (tmp_path / "vm").mkdir()
    (tmp_path / "vm" / "machine.json").write_text("{}")
    (tmp_path / "vm" / ENV_FILE).write_text(json.dumps(_result_file(["a", "b"])))
    seconds = asv_merge.backend_seconds(str(tmp_path))
    assert seconds == pytest.approx({"a": (1 + 2) * 30, "b": (3 + 4) * 30})  # time x number x repeat
    assert asv_merge.backend_seconds(str(tmp_path / "nothing")) == {}


def test_an_interrupted_write_leaves_the_previous_file(tmp_path):
    path = tmp_path / "results.json"
    files.write_json_atomic(str(path), {"kept": True})

    class Boom:
        def __str__(self):
            raise KeyboardInterrupt  # Ctrl-C half-way through the serialisation

    with pytest.raises(KeyboardInterrupt):
        files.write_atomic(str(path), "x" * 10 + str(Boom()))
    with pytest.raises(KeyboardInterrupt):
        files.write_json_atomic(str(path), {"a": 1, "b": Boom()})
    assert _json(path) == {"kept": True} and os.listdir(tmp_path) == ["results.json"]


@pytest.mark.slow
def test_a_killed_writer_leaves_the_previous_file(tmp_path):
    """SIGKILL (the OOM killer) in the middle of writing: the reader still finds the old file whole."""
    path = tmp_path / "results.json"
    files.write_json_atomic(str(path), {"kept": True})
    code = ("import os, signal\nfrom attnspec import files\n"
            "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # killed with the text half on disk\n"
            f"files.write_atomic({str(path)!r}, 'x' * 100000)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert done.returncode == -9
    assert _json(path) == {"kept": True}


@pytest.mark.slow
def test_a_second_run_in_the_same_folder_refuses_and_a_killed_runs_lock_is_free(tmp_path):
    """The run lock is the kernel's: a second holder in this process or another is refused with the
    holder's pid; a holder killed with SIGKILL (no cleanup) leaves the lock free; of runs starting
    together exactly one holds it (a pid-file lock let two hold it: an empty file read as stale)."""
    lock = str(tmp_path / ".attnspec" / "run.lock")
    with files.run_lock(lock):
        with pytest.raises(files.RunLocked, match=f"pid {os.getpid()}.*is running in this folder"), \
                files.run_lock(lock):
            pass
        holder = subprocess.run([sys.executable, "-c", f"from attnspec import files\nwith files.run_lock({lock!r}):\n"
                                 "    pass"], capture_output=True, text=True)
        assert holder.returncode == 1 and "RunLocked" in holder.stderr  # another process is refused too
    with files.run_lock(lock):  # released
        assert _json(lock)["pid"] == os.getpid()
    held = subprocess.Popen([sys.executable, "-c", f"import time\nfrom attnspec import files\n"
                             f"with files.run_lock({lock!r}):\n    print('held', flush=True)\n    time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    assert held.stdout.readline().strip() == "held"
    with pytest.raises(files.RunLocked, match=f"pid {held.pid}"), files.run_lock(lock):
        pass
    held.kill()  # SIGKILL: no finally runs
    held.wait()
    with files.run_lock(lock):
        assert _json(lock)["pid"] == os.getpid()
    racers = [subprocess.Popen([sys.executable, "-c", f"import sys, time\nfrom attnspec import files\n"
                                f"try:\n    with files.run_lock({lock!r}):\n        time.sleep(2)\n"
                                f"except files.RunLocked:\n    sys.exit(3)"]) for _ in range(6)]
    codes = sorted(r.wait() for r in racers)
    assert codes == [0] + [3] * 5, codes


def test_an_interrupted_benchmark_phase_kills_asv_and_merges_nothing(monkeypatch, user):
    """Ctrl-C or SIGTERM in the middle of the shards: every asv process is ended, and the grid's
    database keeps what it had (nothing half merged)."""
    monkeypatch.setenv("ATTNSPEC_BENCH_JOBS", "2")
    benchrun.run_benchmarks([("a", "a"), ("b", "b")], "default", COMMIT)
    database = user / ".attnspec" / "asv" / "default" / "results"
    before = {p: p.read_bytes() for p in database.rglob("*.json")}
    killed = []
    monkeypatch.setattr(procs, "kill_all", lambda: killed.append(True))

    def interrupted(cmd, env=None, prefix="", **kw):
        if "^bench_machine" not in cmd and "a" in env["ATTNSPEC_BACKENDS"].split(","):
            raise KeyboardInterrupt
        return _fake_asv(cmd, env=env)

    monkeypatch.setattr(procs, "stream", interrupted)
    with pytest.raises(KeyboardInterrupt):
        benchrun.run_benchmarks([("a", "a"), ("b", "b")], "default", COMMIT)
    assert killed and {p: p.read_bytes() for p in database.rglob("*.json")} == before
