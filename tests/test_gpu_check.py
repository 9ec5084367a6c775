"""tools/gpu_check.sh runs only where a GPU is lent, so nothing else would notice its Python going
stale: its benchmark step once called a function that had moved (run_cmd.run_benchmarks, now
benchrun's, returning three values) and the report read a folder `attnspec run` no longer writes."""
import inspect
import os
import subprocess

import pytest

from attnspec import benchrun, procs
from tools import gpu_bench

SCRIPT = os.path.join(procs.ROOT, "tools", "gpu_check.sh")


def test_the_script_is_valid_bash_and_benchmarks_through_gpu_bench():
    subprocess.run(["bash", "-n", SCRIPT], check=True)
    with open(SCRIPT, encoding="utf-8") as f:
        assert "python3 tools/gpu_bench.py" in f.read()


@pytest.mark.parametrize("rc", [0, 2])
def test_the_benchmark_step_calls_run_benchmarks_as_declared_and_lists_its_folders(monkeypatch, tmp_path, rc):
    seen = []

    def fake(chosen, mode, commit):  # the real signature, checked first
        inspect.signature(benchrun.run_benchmarks).bind(chosen, mode, commit)
        seen.append((chosen, mode, commit))
        return [str(tmp_path / "1"), str(tmp_path / "2")], rc, []

    monkeypatch.setattr(benchrun, "run_benchmarks", fake)  # raises if the step's function is gone
    listed = tmp_path / "asv-folders.txt"
    assert gpu_bench.main(["abc123", str(listed), "torch-sdpa-cuda-flash", "jax-dpa-cudnn"]) == rc  # asv's status
    assert seen == [([("torch-sdpa-cuda-flash", "torch-sdpa-cuda-flash"), ("jax-dpa-cudnn", "jax-dpa-cudnn")],
                     "default", "abc123")]
    assert listed.read_text().splitlines() == [str(tmp_path / "1"), str(tmp_path / "2")]
