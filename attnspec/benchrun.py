"""attnspec run's benchmarks: asv over the chosen backends, the machine's roofs first, then shards side by side.

Each asv process writes into a folder of its own (attnspec/asvtool.py: its configuration, results
folder and machine file), so processes side by side share no file they write; their results are
merged into the grid's database (./.attnspec/asv/<grid>/results) once, after all of them end
(attnspec/asv_merge.py), and the report reads the processes' own folders - this run's results.
The benchmarks and the commit are attnspec's.  Plug-ins import in asv's processes as in the
user's shell (ASV_PYTHONPATH: `procs.child_env`).
"""
from __future__ import annotations

import os
import sys
import time

from attnspec import asv_merge, asvtool, files, procs
from attnspec.reports.inputs import GRID_FILE  # beside a results folder's machines: which grid its rows come from

# Benchmark grid per mode: benchmarks/_grid.py defines each (ATTNSPEC_BENCH_GRID), so `asv run`
# by hand measures what `attnspec run` does.  Three samples per combination make the report's
# medians; asv run by hand takes 6, what asv continuous needs to call a change significant.
MODES = {"quick": {"ATTNSPEC_BENCH_GRID": "quick"},
         "default": {"ATTNSPEC_BENCH_GRID": "default", "ATTNSPEC_BENCH_SAMPLES": "3"},
         "full": {"ATTNSPEC_BENCH_GRID": "full", "ATTNSPEC_BENCH_SAMPLES": "3"}}


def bench_shards(names: list[str], jobs: int, seconds: dict | None = None) -> list[list[str]]:
    """`names` split into `jobs` shards of about equal benchmark time, longest first, each to the
    least loaded shard.  `seconds`: each backend's time in the previous run of this grid
    (asv_merge.backend_seconds); a backend it lacks counts as the mean of those it has, and with
    none recorded every backend counts the same - no figure of any machine steers the split."""
    seconds = {n: s for n, s in (seconds or {}).items() if n in names and s > 0}
    fallback = sum(seconds.values()) / len(seconds) if seconds else 1.0
    weight = {n: seconds.get(n, fallback) for n in names}
    load, home = [0.0] * jobs, {}
    for name in sorted(names, key=lambda n: (-weight[n], n)):
        i = min(range(jobs), key=lambda j: (load[j], j))
        home[name], load[i] = i, load[i] + weight[name]
    return [[n for n in names if home[n] == i] for i in range(jobs)]


def run_benchmarks(chosen: list[tuple], mode: str, commit: str) -> tuple[list[str], int, list[str]]:
    """asv over the available backends at `commit`: (this run's results folders, asv's status,
    what could not be merged as "path — why").

    The machine's benchmarks (matmul peaks, bandwidth, fidelity) run first, alone; then the
    attention benchmarks in one asv process per core (ATTNSPEC_BENCH_JOBS), each with its own
    share of the backends.  Every benchmark is single-threaded and times CPU time, so two side by
    side on two cores use the machine as one would not: half the wall time.  All of them are one
    asv environment (this interpreter), so a backend's results land in the same results file
    whichever process measured it, and `asv compare` over two commits matches them."""
    from concurrent.futures import ThreadPoolExecutor

    grid_dir = asvtool.grid_folder(mode)
    _, database = asvtool.write_config(grid_dir)  # the configuration `asv compare` by hand takes
    machine = asvtool.machine_file(grid_dir)
    names = [n for n, _ in chosen]
    jobs = max(1, min(int(os.environ.get("ATTNSPEC_BENCH_JOBS") or os.cpu_count() or 1), len(names)))
    shards = [s for s in bench_shards(names, jobs, asv_merge.backend_seconds(database)) if s] or [names]
    print(f"[bench] asv run at commit {commit[:8]} (grid: {mode}; {len(shards)} process(es) side by side; "
          f"results: {os.path.relpath(database)}; benchmarks/README.md)", flush=True)
    start = time.monotonic()

    def asv(name: str, backends: list, bench: str, prefix: str) -> tuple[int, str]:
        config, results, home = asvtool.process_folder(grid_dir, name, machine)
        files.write_json_atomic(os.path.join(results, GRID_FILE), {"grid": mode})
        cmd = asvtool.command("run", "--config", config, "--set-commit-hash", commit, "--show-stderr",
                              "--environment", f"existing:{sys.executable}", "--bench", bench,
                              *(["--quick"] if mode == "quick" else []))  # --show-stderr: stream says why one failed
        env = asvtool.process_env(home, ATTNSPEC_BACKENDS=",".join(backends), **MODES[mode])
        return procs.stream(cmd, env=env, prefix=prefix), results

    done = [asv("roofs", names, "^bench_machine", "  ")]  # the machine's roofs for every chosen backend
    pool = ThreadPoolExecutor(max_workers=len(shards))
    try:
        done += list(pool.map(lambda i: asv(str(i + 1), shards[i], "^(?!bench_machine)",
                                            f"  [{i + 1}/{len(shards)}] " if len(shards) > 1 else "  "),
                              range(len(shards))))
    except BaseException:  # Ctrl-C or SIGTERM reach only this thread; asv runs in sessions of its own
        procs.kill_all()  # the other shards' asv ends, so their threads do: wait for them
        pool.shutdown(wait=True, cancel_futures=True)
        raise  # nothing merged: the database keeps what it had
    pool.shutdown()
    rc = next((r for r, _ in done if r), 0)
    skipped = asv_merge.merge_into(database, [d for _, d in done])
    state = "done" if rc == 0 else f"asv exited with status {rc}; the report keeps what it recorded"
    print(f"[bench] {state} in {time.monotonic() - start:.0f} s; merged into {os.path.relpath(database)}", flush=True)
    return [d for _, d in done if os.path.isdir(d)], rc, skipped
