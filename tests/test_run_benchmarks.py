"""attnspec run's asv phase (attnspec/benchrun.py): the machine alone, then the backends split
over asv processes side by side, each its own asv environment; asv's configuration and results
under the current folder (./.attnspec/asv), the benchmarks and the commit attnspec's.  asv itself
is stubbed here; tests/test_asv_workflow.py, tests/test_asv_results.py and tests/test_cli_run.py
run the real one."""
from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time

import pytest

from attnspec import benchrun, procs

NAMES = ["numpy-naive", "numpy-tiled", "torch-math", "torch-sdpa-cpu", "jax-naive", "jax-dpa", "onnxruntime-attention"]


@pytest.fixture
def calls(monkeypatch, tmp_path):
    """asv stubbed; the run starts in tmp_path (a user's folder), never in attnspec's own."""
    seen = []

    def stream(cmd, env=None, prefix="", started=None):
        seen.append((cmd, env))
        if started is not None:
            started.set()
        return 0

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(procs, "stream", stream)
    monkeypatch.setattr(procs, "ensure_asv_machine", lambda: None)
    return seen


def _run(monkeypatch, jobs, mode="default"):
    monkeypatch.setenv("ATTNSPEC_BENCH_JOBS", str(jobs))
    return benchrun.run_benchmarks([(n, n) for n in NAMES], mode, "c0ffee" * 6 + "c0ff")


def test_machine_first_then_disjoint_shards(monkeypatch, calls, tmp_path):
    results_dir, rc = _run(monkeypatch, 2)
    assert rc == 0 and results_dir == str(tmp_path / ".attnspec" / "asv" / "results")
    machine_cmd, machine_env = calls[0]
    assert machine_cmd[-2:] == ["--bench", "^bench_machine"] and f"existing:{sys.executable}" in machine_cmd
    assert machine_env["ATTNSPEC_BACKENDS"] == ",".join(NAMES)  # the machine's roofs for every chosen backend
    shards = calls[1:]
    assert len(shards) == 2
    backends = [env["ATTNSPEC_BACKENDS"].split(",") for _, env in shards]
    assert sorted(sum(backends, [])) == sorted(NAMES) and not set(backends[0]) & set(backends[1])
    envs = {cmd[cmd.index("--environment") + 1] for cmd, _ in shards}
    assert len(envs) == 2  # one asv environment (results file) per shard
    assert all(env["ATTNSPEC_BENCH_GRID"] == "default" and env["ATTNSPEC_BENCH_SAMPLES"] == "3" for _, env in shards)
    assert all(cmd[-2:] == ["--bench", "^(?!bench_machine)"] for cmd, _ in shards)
    for cmd, _ in calls:  # every asv process: attnspec's configuration as written here, the commit given
        assert cmd[cmd.index("--config") + 1] == str(tmp_path / ".attnspec" / "asv" / "asv.conf.json")
        assert cmd[cmd.index("--set-commit-hash") + 1] == "c0ffee" * 6 + "c0ff" and "--quick" not in cmd


def test_quick_mode_runs_asv_quick_on_the_quick_grid(monkeypatch, calls):
    monkeypatch.delenv("ATTNSPEC_BENCH_SAMPLES", raising=False)
    _run(monkeypatch, 1, mode="quick")
    assert len(calls) == 2
    assert all("--quick" in cmd and env["ATTNSPEC_BENCH_GRID"] == "quick" for cmd, env in calls)
    assert not any("ATTNSPEC_BENCH_SAMPLES" in env for _, env in calls)  # the quick grid's own single sample


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


def test_asv_config_points_at_attnspec_and_writes_under_the_current_folder(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    path, results = procs.asv_config()
    assert path == str(tmp_path / ".attnspec" / "asv" / "asv.conf.json") and os.path.isfile(path)
    conf = json.loads((tmp_path / ".attnspec" / "asv" / "asv.conf.json").read_text())
    assert conf["repo"] == procs.ROOT and conf["benchmark_dir"] == os.path.join(procs.ROOT, "benchmarks")
    assert os.path.isfile(os.path.join(conf["benchmark_dir"], "bench_attention.py"))
    for key, sub in (("results_dir", "results"), ("env_dir", "env"), ("html_dir", "html")):
        assert conf[key] == str(tmp_path / ".attnspec" / "asv" / sub), key
    assert results == conf["results_dir"]
    assert conf["project"] == "attnspec" and conf["launch_method"] == "forkserver"  # the rest is attnspec's own
    other, other_results = procs.asv_config(str(tmp_path / "elsewhere"))
    assert other == str(tmp_path / "elsewhere" / "asv.conf.json")
    assert other_results == str(tmp_path / "elsewhere" / "results")
    assert procs.ASV_DIR == os.path.join(".attnspec", "asv")


@pytest.mark.skipif(shutil.which("asv") is None, reason="needs asv")
def test_the_machine_entry_is_made_from_any_folder(monkeypatch, tmp_path):
    """A first `attnspec run` on a host, started in the user's folder (no asv.conf.json there):
    `asv machine --yes` must still find attnspec's configuration and write ~/.asv-machine.json."""
    import platform

    home, user = tmp_path / "home", tmp_path / "user"
    home.mkdir()
    user.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(user)
    procs.ensure_asv_machine()
    machines = json.loads((home / ".asv-machine.json").read_text())
    assert platform.uname().node in machines
    assert not (user / "asv.conf.json").exists()  # nothing asv-shaped left in the user's own folder's top


def test_a_backend_keeps_its_shard_across_runs(monkeypatch, calls, tmp_path):
    _run(monkeypatch, 2)
    first = {cmd[cmd.index("--environment") + 1]: env["ATTNSPEC_BACKENDS"] for cmd, env in calls[1:]}
    calls.clear()
    _run(monkeypatch, 2)
    assert {cmd[cmd.index("--environment") + 1]: env["ATTNSPEC_BACKENDS"] for cmd, env in calls[1:]} == first
    link = [e for e in first if e != f"existing:{sys.executable}"][0].split(":", 1)[1]
    assert os.path.realpath(link) == os.path.realpath(sys.executable)
    assert link.startswith(str(tmp_path / ".attnspec" / "asv" / "shards") + os.sep)  # under the current folder


def test_one_job_runs_one_process_and_a_failure_is_reported(monkeypatch, calls):
    monkeypatch.setattr(procs, "stream", lambda cmd, env=None, prefix="", started=None:
                        calls.append((cmd, env)) or (3 if len(calls) == 2 else 0))
    _, rc = _run(monkeypatch, 1)
    assert len(calls) == 2 and calls[1][1]["ATTNSPEC_BACKENDS"] == ",".join(NAMES) and rc == 3


def test_a_shard_starts_once_the_one_before_it_has_printed(monkeypatch, calls):
    """asv rewrites ~/.asv-machine.json as it starts: two shards started together can read it half
    written (seen: "Error parsing JSON in file '~/.asv-machine.json'", a shard lost)."""
    events = []

    def stream(cmd, env=None, prefix="", started=None):
        events.append(("start", prefix))
        time.sleep(0.1)
        events.append(("printed", prefix))
        if started is not None:  # the machine's run, alone before the shards, has none
            started.set()
        time.sleep(0.3)  # the rest of the shard's run: the next one goes on meanwhile
        events.append(("end", prefix))
        return 0

    monkeypatch.setattr(procs, "stream", stream)
    _run(monkeypatch, 3)
    shards = [f"  [{i}/3] " for i in (1, 2, 3)]
    for before, after in zip(shards, shards[1:]):
        assert events.index(("printed", before)) < events.index(("start", after)), events
    assert events.index(("start", shards[2])) < events.index(("end", shards[0])), events  # still side by side


def test_the_stream_says_when_its_process_has_printed():
    printed = threading.Event()
    assert procs.stream([sys.executable, "-c", "print('· Discovering benchmarks')"], started=printed) == 0
    assert printed.is_set()
    silent = threading.Event()
    assert procs.stream([sys.executable, "-c", "raise SystemExit(3)"], started=silent) == 3
    assert silent.is_set()  # ended without a line: whoever waits on it goes on


def test_a_shard_of_a_virtual_environment_runs_with_its_packages(tmp_path):
    """Shard > 0 runs this interpreter from another path; in a venv that path must still be the
    venv (a bare link starts the base interpreter, without the packages: seen on a GPU machine)."""
    import subprocess

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "only_in_the_venv.py"), "w") as f:
        f.write("MARK = 1\n")
    user = tmp_path / "user"
    user.mkdir()
    code = "from attnspec import benchrun; print(benchrun._shard_python(1))"  # the installed attnspec
    done = subprocess.run([str(python), "-c", code], cwd=user, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-1000:]
    shard = done.stdout.strip()
    assert shard.startswith(str(user / ".attnspec" / "asv" / "shards" / "1")) and shard != str(python)
    seen = subprocess.run([shard, "-c", "import only_in_the_venv, sys; print(sys.prefix != sys.base_prefix)"],
                          capture_output=True, text=True)
    assert seen.returncode == 0 and seen.stdout.strip() == "True", seen.stderr[-500:]


def test_shards_are_balanced_on_measured_times_and_fixed_by_name():
    """The CPU built-ins split into shards of about equal benchmark time (by name's hash alone:
    115 and 181 s); a built-in's shard is the same whichever others run; a plug-in by its hash."""
    full = benchrun.bench_shards(list(benchrun.BENCH_SECONDS), 2)
    times = [sum(benchrun.BENCH_SECONDS[n] for n in shard) for shard in full]
    assert max(times) <= 1.1 * min(times), times
    home = {n: i for i, shard in enumerate(full) for n in shard}
    few = benchrun.bench_shards(["jax-dpa", "numpy-naive", "my.pkg:attn"], 2)
    assert all(home[n] == i for i, shard in enumerate(few) for n in shard if n in home)
    import zlib

    assert "my.pkg:attn" in benchrun.bench_shards(["my.pkg:attn", "torch-math"], 2)[zlib.crc32(b"my.pkg:attn") % 2]


def test_each_mode_runs_the_benchmark_grid_of_its_name():
    """The grids themselves are benchmarks/_grid.py's (tests/test_bench_grid.py checks them)."""
    assert {mode: env["ATTNSPEC_BENCH_GRID"] for mode, env in benchrun.MODES.items()} == {
        "quick": "quick", "default": "default", "full": "full"}


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
