"""attnspec run's asv phase (attnspec/benchrun.py, asvtool.py): the machine alone, then the backends
split over asv processes side by side, each with a configuration, results folder and HOME of its
own, merged afterwards into the grid's database (./.attnspec/asv/<grid>); asv started through this
interpreter.  asv itself is stubbed here; tests/test_asv_merge.py checks the merge,
tests/test_asv_workflow.py, tests/test_asv_results.py and tests/test_cli_run.py run the real one."""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from attnspec import asvtool, benchrun, procs

NAMES = ["numpy-naive", "numpy-tiled", "torch-math", "torch-sdpa-cpu", "jax-naive", "jax-dpa", "onnxruntime-attention"]
COMMIT = "c0ffee" * 6 + "c0ff"
needs_asv = pytest.mark.skipif(importlib.util.find_spec("asv") is None, reason="needs asv")


def _arg(cmd, flag):
    return cmd[cmd.index(flag) + 1]


def _json(path):
    with open(path) as f:
        return json.load(f)


@pytest.fixture
def calls(monkeypatch, tmp_path):
    """asv stubbed; the run starts in tmp_path (a user's folder), never in attnspec's own."""
    seen = []

    def stream(cmd, env=None, prefix="", **kw):
        seen.append((cmd, env))
        return 0

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(procs, "stream", stream)
    monkeypatch.setattr(asvtool, "machine_file", _stub_machine_file)
    return seen


def _stub_machine_file(folder):
    path = os.path.join(folder, "home", asvtool.MACHINE_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"vm": {"machine": "vm"}, "version": 1}, f)
    return path


def _run(monkeypatch, jobs, mode="default", names=NAMES):
    monkeypatch.setenv("ATTNSPEC_BENCH_JOBS", str(jobs))
    return benchrun.run_benchmarks([(n, n) for n in names], mode, COMMIT)


def test_machine_first_then_disjoint_shards_each_in_a_folder_of_its_own(monkeypatch, calls, tmp_path):
    dirs, rc, skipped = _run(monkeypatch, 2)
    assert rc == 0 and skipped == []
    grid = tmp_path / ".attnspec" / "asv" / "default"
    machine_cmd, machine_env = calls[0]
    assert machine_cmd[:3] == [sys.executable, "-m", "asv"]  # asv of this interpreter: no venv activation needed
    assert _arg(machine_cmd, "--bench") == "^bench_machine"
    assert _arg(machine_cmd, "--environment") == f"existing:{sys.executable}"
    assert machine_env["ATTNSPEC_BACKENDS"] == ",".join(NAMES)  # the machine's roofs for every chosen backend
    shards = calls[1:]
    assert len(shards) == 2
    backends = [env["ATTNSPEC_BACKENDS"].split(",") for _, env in shards]
    assert sorted(sum(backends, [])) == sorted(NAMES) and not set(backends[0]) & set(backends[1])
    assert {_arg(cmd, "--environment") for cmd, _ in shards} == {f"existing:{sys.executable}"}  # one asv environment
    assert all(env["ATTNSPEC_BENCH_GRID"] == "default" and env["ATTNSPEC_BENCH_SAMPLES"] == "3" for _, env in shards)
    assert all(_arg(cmd, "--bench") == "^(?!bench_machine)" for cmd, _ in shards)
    configs = [_arg(cmd, "--config") for cmd, _ in calls]
    homes = [env["HOME"] for _, env in calls]
    results = [_json(c)["results_dir"] for c in configs]
    for many in (configs, homes, results):  # nothing any two asv processes write is shared
        assert len(set(many)) == len(calls), many
    for cmd, env in calls:
        assert _arg(cmd, "--config").startswith(str(grid / "processes") + os.sep)
        assert os.path.isfile(os.path.join(env["HOME"], asvtool.MACHINE_FILE))  # its own copy
        assert _arg(cmd, "--set-commit-hash") == COMMIT and "--quick" not in cmd
        user_home = os.path.expanduser("~")  # the user's packages, caches and settings stay theirs
        assert env["PYTHONUSERBASE"] and env["XDG_CACHE_HOME"] == os.environ.get(
            "XDG_CACHE_HOME", os.path.join(user_home, ".cache")) and env["KERAS_HOME"].startswith(user_home)
    assert sorted(dirs) == sorted(results)  # the report reads this run's own results
    assert _json(grid / "asv.conf.json")["results_dir"] == str(grid / "results")  # asv compare's config


def test_quick_mode_runs_asv_quick_on_the_quick_grid_in_its_own_database(monkeypatch, calls, tmp_path):
    monkeypatch.delenv("ATTNSPEC_BENCH_SAMPLES", raising=False)
    dirs, _, _ = _run(monkeypatch, 1, mode="quick")
    assert len(calls) == 2
    assert all("--quick" in cmd and env["ATTNSPEC_BENCH_GRID"] == "quick" for cmd, env in calls)
    assert not any("ATTNSPEC_BENCH_SAMPLES" in env for _, env in calls)  # the quick grid's own single sample
    quick = tmp_path / ".attnspec" / "asv" / "quick"
    assert all(d.startswith(str(quick) + os.sep) for d in dirs)
    assert all(_json(os.path.join(d, "attnspec.json")) == {"grid": "quick"} for d in dirs)  # the report's grid column


def test_plugins_import_in_asvs_processes_from_the_current_folder(monkeypatch, calls, tmp_path):
    """asv clears PYTHONPATH for its benchmark processes and passes ASV_PYTHONPATH on: both carry
    the current folder (a plug-in such as mypkg.attn:sdpa), then the user's own PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    _run(monkeypatch, 2)
    for _, env in calls:
        for var in ("ASV_PYTHONPATH", "PYTHONPATH"):
            assert env[var].split(os.pathsep) == [str(tmp_path), "/somewhere/else"], (var, env[var])
        assert env["PYTHONUNBUFFERED"] == "1"
    monkeypatch.delenv("PYTHONPATH")
    assert procs.child_env(X="1")["ASV_PYTHONPATH"] == str(tmp_path) and procs.child_env(X="1")["X"] == "1"


def test_asv_config_points_at_attnspec_and_writes_under_the_given_folder(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    folder = asvtool.grid_folder("default")
    assert folder == str(tmp_path / ".attnspec" / "asv" / "default")
    path, results = asvtool.write_config(folder)
    assert path == os.path.join(folder, "asv.conf.json") and os.path.isfile(path)
    conf = _json(path)
    assert conf["repo"] == procs.ROOT and conf["benchmark_dir"] == os.path.join(procs.ROOT, "benchmarks")
    assert os.path.isfile(os.path.join(conf["benchmark_dir"], "bench_attention.py"))
    for key, sub in (("results_dir", "results"), ("env_dir", "env"), ("html_dir", "html")):
        assert conf[key] == os.path.join(folder, sub), key
    assert results == conf["results_dir"]
    assert conf["project"] == "attnspec" and conf["launch_method"] == "forkserver"  # the rest is attnspec's own
    assert sorted(os.listdir(folder)) == ["asv.conf.json"]  # written whole: no temporary left beside it


@needs_asv
def test_the_machine_entry_is_made_from_any_folder_without_touching_the_users_file(monkeypatch, tmp_path):
    """A first `attnspec run` on a host, started in the user's folder (no asv.conf.json there):
    `asv machine --yes` must still find attnspec's configuration; its machine file is the run's own."""
    import platform

    home, user = tmp_path / "home", tmp_path / "user"
    home.mkdir()
    user.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(user)
    path = asvtool.machine_file(asvtool.grid_folder("quick"))
    assert platform.uname().node in _json(path)
    assert not (home / ".asv-machine.json").exists() and not (user / "asv.conf.json").exists()
    (home / ".asv-machine.json").write_text(json.dumps({platform.uname().node: {"machine": "mine"}, "version": 1}))
    again = asvtool.machine_file(asvtool.grid_folder("full"))  # the user's own entry is taken when there is one
    assert _json(again)[platform.uname().node] == {"machine": "mine"}


def test_asv_is_found_through_this_interpreter_not_the_path(monkeypatch):
    """A venv's attnspec called by its path (not activated: its bin/ not on PATH) runs the venv's asv;
    without asv the message names the interpreter that lacks it."""
    monkeypatch.setenv("PATH", "")
    assert asvtool.command("run")[:3] == [sys.executable, "-m", "asv"]
    if importlib.util.find_spec("asv") is not None:
        assert asvtool.missing() is None  # found although no `asv` is on PATH
    monkeypatch.setattr(procs, "importable", lambda module: module != "asv")
    why = asvtool.missing()
    assert f"asv is not installed for {sys.executable}" in why and "--no-bench" in why


def test_one_job_runs_one_process_and_a_failure_is_reported(monkeypatch, calls):
    monkeypatch.setattr(procs, "stream", lambda cmd, env=None, prefix="", **kw:
                        calls.append((cmd, env)) or (3 if len(calls) == 2 else 0))
    _, rc, _ = _run(monkeypatch, 1)
    assert len(calls) == 2 and calls[1][1]["ATTNSPEC_BACKENDS"] == ",".join(NAMES) and rc == 3


def test_shards_are_balanced_on_the_previous_runs_durations():
    """Weights come from the grid's last recorded results (asv_merge.backend_seconds); a backend not
    recorded counts as the mean of those that are; with nothing recorded all count the same."""
    seconds = {"torch-math": 9.0, "jax-naive": 4.0, "numpy-naive": 3.0, "jax-dpa": 1.0}
    shards = benchrun.bench_shards(list(seconds), 2, seconds)
    assert sorted(map(sorted, shards)) == [["jax-dpa", "jax-naive", "numpy-naive"], ["torch-math"]]
    even = benchrun.bench_shards(NAMES, 2)
    assert sorted(map(len, even)) == [3, 4] and sorted(sum(even, [])) == sorted(NAMES)
    new = benchrun.bench_shards(["my.pkg:attn", "torch-math", "jax-dpa"], 2, {"torch-math": 8.0, "jax-dpa": 2.0})
    assert ["torch-math"] in new  # my.pkg:attn weighs the mean, 5: beside jax-dpa, not torch-math


def test_each_mode_runs_the_benchmark_grid_of_its_name():
    """The grids themselves are benchmarks/_grid.py's (tests/test_bench_grid.py checks them)."""
    assert {mode: env["ATTNSPEC_BENCH_GRID"] for mode, env in benchrun.MODES.items()} == {
        "quick": "quick", "default": "default", "full": "full"}


@pytest.mark.slow
def test_the_stream_says_once_why_benchmarks_failed(capsys):
    """asv --show-stderr prints each failed benchmark's stderr indented; the stream keeps asv's
    headlines and echoes each distinct reason once (a plug-in that cannot load fails every one)."""
    lines = ["· Running 2 total benchmarks", "[50%] ··· bench_attention.TimeAttention.time_call   failed",
             "   attnspec: cannot load backend mypkg.attn:sdpa: BackendSelectionError: No module named 'mypkg'",
             "   Traceback (most recent call last):", "     raise ModuleNotFoundError(...)",
             "   ModuleNotFoundError: No module named 'mypkg'",
             "[100%] ··· bench_memory.PeakMemory.peakmem_call   failed",
             "   attnspec: cannot load backend mypkg.attn:sdpa: BackendSelectionError: No module named 'mypkg'",
             "   RuntimeWarning: os.fork() was called"]
    script = "import sys\nfor line in sys.argv[1:]: print(line)\nsys.exit(2)"
    rc = procs.stream([sys.executable, "-c", script, *lines], prefix="  ")
    out = capsys.readouterr().out.splitlines()
    assert rc == 2
    assert out.count("      why: attnspec: cannot load backend mypkg.attn:sdpa: BackendSelectionError: No module "
                     "named 'mypkg'") == 1
    assert out.count("      why: ModuleNotFoundError: No module named 'mypkg'") == 1
    assert "  [50%] ··· bench_attention.TimeAttention.time_call   failed" in out
    assert not [x for x in out if "RuntimeWarning" in x or "Traceback" in x]


def test_the_benchmarks_jax_cache_is_the_users_under_an_asv_process_of_its_own_home(tmp_path):
    """Each asv process gets a HOME of its own (its machine file); JAX's compiled programs still go to the
    user's cache, shared with the suite and the other processes, not one cache per process folder."""
    import subprocess

    env = asvtool.process_env(str(tmp_path / "home"))
    code = "from attnspec.benchmarks import _threads; print(_threads.JAX_CACHE)"
    seen = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    user_cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    assert seen.strip() == os.path.join(user_cache, "attnspec", "jax")
