"""attnspec run's asv phase (run_cmd.run_benchmarks): the machine alone, then the backends split
over asv processes side by side, each its own asv environment (asv itself is stubbed here;
tests/test_asv_workflow.py and tests/test_asv_results.py run the real one)."""
from __future__ import annotations

import os
import sys

import pytest

from attnspec.commands import run_cmd
from attnspec.reports import runner

NAMES = ["numpy-naive", "numpy-tiled", "torch-math", "torch-sdpa-cpu", "jax-naive", "jax-dpa", "onnxruntime-attention"]


@pytest.fixture
def calls(monkeypatch):
    seen = []

    def stream(cmd, env=None, prefix=""):
        seen.append((cmd, env))
        return 0

    monkeypatch.setattr(runner, "stream", stream)
    monkeypatch.setattr(runner, "ensure_asv_machine", lambda: None)
    return seen


def _run(monkeypatch, jobs, rcs=None):
    monkeypatch.setenv("ATTNSPEC_BENCH_JOBS", str(jobs))
    return run_cmd.run_benchmarks([(n, n) for n in NAMES], "default", "c0ffee" * 6 + "c0ff")


def test_machine_first_then_disjoint_shards(monkeypatch, calls):
    results_dir, rc = _run(monkeypatch, 2)
    assert rc == 0 and results_dir.endswith(os.path.join(".asv", "results"))
    machine_cmd, machine_env = calls[0]
    assert machine_cmd[-2:] == ["--bench", "^bench_machine"] and f"existing:{sys.executable}" in machine_cmd
    shards = calls[1:]
    assert len(shards) == 2
    backends = [env["ATTNSPEC_BACKENDS"].split(",") for _, env in shards]
    assert sorted(sum(backends, [])) == sorted(NAMES) and not set(backends[0]) & set(backends[1])
    envs = {cmd[cmd.index("--environment") + 1] for cmd, _ in shards}
    assert len(envs) == 2  # one asv environment (results file) per shard
    assert all(env["ATTNSPEC_BENCH_GRID"] == "default" and env["ATTNSPEC_BENCH_SAMPLES"] == "3" for _, env in shards)
    assert all(cmd[-2:] == ["--bench", "^(?!bench_machine)"] for cmd, _ in shards)


def test_a_backend_keeps_its_shard_across_runs(monkeypatch, calls):
    _run(monkeypatch, 2)
    first = {cmd[cmd.index("--environment") + 1]: env["ATTNSPEC_BACKENDS"] for cmd, env in calls[1:]}
    calls.clear()
    _run(monkeypatch, 2)
    assert {cmd[cmd.index("--environment") + 1]: env["ATTNSPEC_BACKENDS"] for cmd, env in calls[1:]} == first
    link = [e for e in first if e != f"existing:{sys.executable}"][0].split(":", 1)[1]
    assert os.path.realpath(link) == os.path.realpath(sys.executable)


def test_one_job_runs_one_process_and_a_failure_is_reported(monkeypatch, calls):
    monkeypatch.setattr(runner, "stream", lambda cmd, env=None, prefix="": calls.append((cmd, env)) or (3 if len(calls) == 2 else 0))
    _, rc = _run(monkeypatch, 1)
    assert len(calls) == 2 and calls[1][1]["ATTNSPEC_BACKENDS"] == ",".join(NAMES) and rc == 3


def test_a_shard_of_a_virtual_environment_runs_with_its_packages(tmp_path):
    """Shard > 0 runs this interpreter from another path; in a venv that path must still be the
    venv (a bare link starts the base interpreter, without the packages: seen on a GPU machine)."""
    import subprocess
    import textwrap

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "only_in_the_venv.py"), "w") as f:
        f.write("MARK = 1\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {runner.ROOT!r})
        from attnspec.commands import run_cmd
        run_cmd.ROOT = {str(tmp_path)!r}
        print(run_cmd._shard_python(1))
    """)
    shard = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert shard.startswith(str(tmp_path / ".asv" / "shards" / "1")) and shard != str(python)
    seen = subprocess.run([shard, "-c", "import only_in_the_venv, sys; print(sys.prefix != sys.base_prefix)"],
                          capture_output=True, text=True)
    assert seen.returncode == 0 and seen.stdout.strip() == "True", seen.stderr[-500:]


def test_shards_are_balanced_on_measured_times_and_fixed_by_name():
    """The CPU built-ins split into shards of about equal benchmark time (by name's hash alone:
    115 and 181 s); a built-in's shard is the same whichever others run; a plug-in by its hash."""
    full = run_cmd.bench_shards(list(run_cmd.BENCH_SECONDS), 2)
    times = [sum(run_cmd.BENCH_SECONDS[n] for n in shard) for shard in full]
    assert max(times) <= 1.1 * min(times), times
    home = {n: i for i, shard in enumerate(full) for n in shard}
    few = run_cmd.bench_shards(["jax-dpa", "numpy-naive", "my.pkg:attn"], 2)
    assert all(home[n] == i for i, shard in enumerate(few) for n in shard if n in home)
    import zlib

    assert "my.pkg:attn" in run_cmd.bench_shards(["my.pkg:attn", "torch-math"], 2)[zlib.crc32(b"my.pkg:attn") % 2]
