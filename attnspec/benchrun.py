"""attnspec run's benchmarks: asv over the chosen backends, the machine's roofs first, then shards side by side.

Results and asv's configuration go under the current folder (./.attnspec/asv, `procs.asv_config`);
the benchmarks and the commit are attnspec's.  Plug-ins import in asv's processes as in the user's
shell (ASV_PYTHONPATH: `procs.child_env`).
"""
from __future__ import annotations

import os
import sys
import threading
import time

from attnspec import procs

# Benchmark grid per mode: benchmarks/_grid.py defines each (ATTNSPEC_BENCH_GRID), so `asv run`
# by hand measures what `attnspec run` does.  Three samples per combination make the report's
# medians; asv run by hand takes 6, what asv continuous needs to call a change significant.
MODES = {"quick": {"ATTNSPEC_BENCH_GRID": "quick"},
         "default": {"ATTNSPEC_BENCH_GRID": "default", "ATTNSPEC_BENCH_SAMPLES": "3"},
         "full": {"ATTNSPEC_BENCH_GRID": "full", "ATTNSPEC_BENCH_SAMPLES": "3"}}


# Each CPU built-in's share of a default benchmark run (seconds, this 2-core VM, at 81bfed8; the
# compiled flex's estimated for the 60 s budget): the shards are balanced on these over *every*
# built-in, so a backend's shard never depends on which others run (its results stay in one asv
# environment from run to run); a plug-in, or a GPU built-in, goes by its name's hash.  By name's
# hash alone the two shards took 115 and 181 s.
BENCH_SECONDS = {"torch-flex-compiled": 74, "torch-flex": 45, "torch-math": 32, "jax-naive": 27, "jax-dpa": 21,
                 "openvino-sdpa": 20, "openvino-sdpa-f32": 20, "numpy-naive": 16, "numpy-tiled": 16,
                 "torch-sdpa-cpu-math": 12, "torch-sdpa-cpu": 11, "torch-sdpa-cpu-flash": 11,
                 "onnxruntime-attention": 10}


def bench_shards(names: list[str], jobs: int) -> list[list[str]]:
    """`names` split into `jobs` shards: the built-ins by BENCH_SECONDS, longest first, each to the
    least loaded shard; any other backend by its name's hash."""
    import zlib

    load, home = [0.0] * jobs, {}
    for name in sorted(BENCH_SECONDS, key=lambda n: (-BENCH_SECONDS[n], n)):
        i = min(range(jobs), key=lambda j: (load[j], j))
        home[name], load[i] = i, load[i] + BENCH_SECONDS[name]
    return [[n for n in names if home.get(n, zlib.crc32(n.encode()) % jobs) == i] for i in range(jobs)]


def run_benchmarks(chosen: list[tuple], mode: str, commit: str) -> tuple[str, int]:
    """asv over the available backends at `commit`; returns asv's results folder and status.

    The machine's benchmarks (matmul peaks, bandwidth, fidelity) run first, alone; then the
    attention benchmarks in one asv process per core (ATTNSPEC_BENCH_JOBS), each with its own
    share of the backends.  Every benchmark is single-threaded and times CPU time, so two side by
    side on two cores use the machine as one would not: half the wall time.  Each shard is an
    asv "existing" environment of its own interpreter path (a link under ./.attnspec/asv/shards/), so its
    results file never overwrites another's; a backend's shard is fixed by its name (`bench_shards`),
    so its results of two runs share an environment and `asv compare` matches them."""
    from concurrent.futures import ThreadPoolExecutor

    procs.ensure_asv_machine()
    names = [n for n, _ in chosen]
    jobs = max(1, min(int(os.environ.get("ATTNSPEC_BENCH_JOBS") or os.cpu_count() or 1), len(names)))
    shards = [s for s in bench_shards(names, jobs) if s] or [names]
    config, results_dir = procs.asv_config()
    base = ["asv", "run", "--config", config, "--set-commit-hash", commit, "--show-stderr"] + (
        ["--quick"] if mode == "quick" else [])  # --show-stderr: procs.stream says why a benchmark failed
    print(f"[bench] asv run at commit {commit[:8]} (grid: {mode}; {len(shards)} process(es) side by side; "
          "benchmarks/README.md)", flush=True)
    start = time.monotonic()
    machine_env = procs.child_env(ATTNSPEC_BACKENDS=",".join(names), **MODES[mode])
    rcs = [procs.stream(base + ["--environment", f"existing:{sys.executable}", "--bench", "^bench_machine"],
                         env=machine_env, prefix="  ")]

    # asv rewrites ~/.asv-machine.json as it starts (Machine.load saves it): two starting together
    # can read it half written ("Error parsing JSON"), so a shard starts once the one before it has
    # printed its first line, which asv prints after that
    printed = [threading.Event() for _ in shards]

    def shard(i: int) -> int:
        if i:
            printed[i - 1].wait()
        env = procs.child_env(ATTNSPEC_BACKENDS=",".join(shards[i]), **MODES[mode])
        cmd = base + ["--environment", f"existing:{_shard_python(i)}", "--bench", "^(?!bench_machine)"]
        return procs.stream(cmd, env=env, prefix=f"  [{i + 1}/{len(shards)}] " if len(shards) > 1 else "  ",
                            started=printed[i])

    with ThreadPoolExecutor(max_workers=len(shards)) as pool:
        rcs += list(pool.map(shard, range(len(shards))))
    rc = next((r for r in rcs if r), 0)
    state = "done" if rc == 0 else f"asv exited with status {rc}; the report keeps what it recorded"
    print(f"[bench] {state} in {time.monotonic() - start:.0f} s", flush=True)
    return results_dir, rc


def _shard_python(i: int) -> str:
    """This interpreter, under a path of its own for shard i > 0 (asv names environments by path).

    In a virtual environment the path is a view of it (its pyvenv.cfg and lib/ linked beside
    bin/python): Python finds its venv from a pyvenv.cfg beside or above the path it was started
    by, so a bare link would start the base interpreter without the venv's packages (seen on the
    GPU machine, whose python3 is a venv: asv could not import the benchmarks in shard 2)."""
    if i == 0:
        return sys.executable
    folder = os.path.abspath(os.path.join(procs.ASV_DIR, "shards", str(i)))
    in_venv = sys.prefix != sys.base_prefix
    links = {os.path.join("bin", "python") if in_venv else "python": sys.executable}
    if in_venv:
        links.update({name: os.path.join(sys.prefix, name) for name in ("pyvenv.cfg", "lib", "lib64")
                      if os.path.lexists(os.path.join(sys.prefix, name))})
    for rel, target in links.items():
        link = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if os.path.realpath(link) != os.path.realpath(target):
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(target, link)
    return os.path.join(folder, next(iter(links)))
