"""Suite processes side by side each keep CPUs of their own (properties/cores.py): xdist workers
and `attnspec run`'s children; a bad ATTNSPEC_CPUS is a usage error that names it."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time

import pytest

from attnspec.properties import cores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
linux_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")


def test_parse_reads_ids_and_all():
    assert cores.parse("1, 0,1") == [0, 1]
    assert cores.parse("all") is None and cores.parse("") is None


@pytest.mark.parametrize("bad", ["x", "0;1", "-1", ","])
def test_parse_names_the_variable_and_the_value(bad):
    with pytest.raises(ValueError, match="ATTNSPEC_CPUS") as e:
        cores.parse(bad)
    assert repr(bad) in str(e.value)


def test_worker_slices_share_the_cpus_without_overlap():
    cpus = [0, 1, 2, 3]
    assert [cores.worker_slice(i, 2, cpus) for i in range(2)] == [[0, 1], [2, 3]]
    assert [cores.worker_slice(i, 4, cpus) for i in range(4)] == [[0], [1], [2], [3]]
    assert [cores.worker_slice(i, 3, [0, 1]) for i in range(3)] == [[0], [1], [0]]  # more workers than CPUs
    assert cores.worker_slice(0, 1, cpus) == cpus
    assert cores.shares(1) == [""]  # one process alone: left as it is
    two = cores.shares(2)
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
        assert all(two) and not set(two[0].split(",")) & set(two[1].split(","))


def test_the_variable_wins_and_a_lone_process_is_left_alone():
    assert cores.chosen({"workerid": "gw1", "workercount": 2}, {"ATTNSPEC_CPUS": "3"}) == [3]
    assert cores.chosen({"workerid": "gw1", "workercount": 2}, {"ATTNSPEC_CPUS": "4,5,6,7"}) == [6, 7]  # its slice
    assert cores.chosen(None, {"ATTNSPEC_CPUS": "4,5"}) == [4, 5]
    assert cores.chosen(None, {}) is None  # one process alone: the machine as it is
    assert cores.chosen({"workerid": "gw0", "workercount": 1}, {}) is None
    two = [cores.chosen({"workerid": f"gw{i}", "workercount": 2}, {}) for i in range(2)]
    if len(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else [0]) >= 2:
        assert not set(two[0]) & set(two[1])


@linux_affinity
def test_pin_restricts_affinity_and_every_pool():
    code = ("import os, numpy\nfrom properties import cores\ncores.pin([0])\n"
            "from threadpoolctl import threadpool_info\n"
            "print(sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'], os.environ['ATTNSPEC_CPUS'],"
            " max(p['num_threads'] for p in threadpool_info()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[0]", "1", "0", "1"]


def test_a_bad_value_is_a_usage_error_of_the_suite():
    env = dict(os.environ, ATTNSPEC_CPUS="first")
    out = subprocess.run([sys.executable, "-m", "pytest", "properties", "--backend", "numpy-naive", "--collect-only",
                          "-q", "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 4, out.stdout + out.stderr
    assert "ATTNSPEC_CPUS must be CPU ids" in out.stdout + out.stderr and "'first'" in out.stdout + out.stderr


def test_workers_wanted_one_per_cpu_at_most_one_per_backend():
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    assert cores.workers_wanted(12, {}) == (min(cpus, 12) if cpus >= 2 else 0)
    assert cores.workers_wanted(1, {}) == 0  # one backend: its tests share one worker anyway
    assert cores.workers_wanted(12, {"ATTNSPEC_CPUS": "0"}) == 0  # kept to one CPU: one process
    assert cores.workers_wanted(12, {"ATTNSPEC_CPUS": "0,1,2"}) == 3
    assert cores.workers_wanted(12, {"ATTNSPEC_WORKERS": "3"}) == 3
    assert cores.workers_wanted(2, {"ATTNSPEC_WORKERS": "8"}) == 2
    assert cores.workers_wanted(12, {"ATTNSPEC_WORKERS": "1"}) == 0 == cores.workers_wanted(12, {"ATTNSPEC_WORKERS": "0"})
    for bad in ("two", "-2"):
        with pytest.raises(ValueError, match="ATTNSPEC_WORKERS") as e:
            cores.workers_wanted(12, {"ATTNSPEC_WORKERS": bad})
        assert repr(bad) in str(e.value)


def _suite(args, **env):
    env = dict({k: v for k, v in os.environ.items() if not k.startswith(("ATTNSPEC_", "PYTEST_XDIST"))}, **env)
    return subprocess.run([sys.executable, "-m", "pytest", "properties", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed")
def test_the_suite_over_several_backends_spreads_over_workers_unless_told_not_to():
    two = ["--backend", "numpy-naive", "--backend", "numpy-tiled", "-k", "rows_sum_to_one"]
    spread = _suite(two, ATTNSPEC_WORKERS="2")
    assert spread.returncode == 0, spread.stdout + spread.stderr
    assert "spread over 2 pytest-xdist workers" in spread.stdout and "created: 2/2 workers" in spread.stdout
    assert "numpy-naive    3 passed" in spread.stdout and "numpy-tiled    3 passed" in spread.stdout
    for args, env in ((two + ["-n", "0"], {"ATTNSPEC_WORKERS": "2"}), (two, {"ATTNSPEC_WORKERS": "1"}),
                      (two[:2] + two[4:], {"ATTNSPEC_WORKERS": "2"})):  # the user's -n, the variable, one backend
        alone = _suite(args, **env)
        assert alone.returncode == 0 and "workers" not in alone.stdout, alone.stdout + alone.stderr
    bad = _suite(two + ["--collect-only"], ATTNSPEC_WORKERS="many")
    assert bad.returncode == 0, "--collect-only starts no worker, so the variable is not read"
    bad = _suite(two, ATTNSPEC_WORKERS="many")
    assert bad.returncode == 4 and "ATTNSPEC_WORKERS must be a number of workers" in bad.stdout + bad.stderr


def test_attnspec_run_gives_side_by_side_suites_cpus_of_their_own(monkeypatch, tmp_path):
    from attnspec.commands import run_cmd
    from attnspec.reports import suites

    running, seen, shared, lock = {}, [], [], threading.Lock()
    enough = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2  # (an xdist worker has one)

    def fake_suite(name, path, limit, shown=None, progress=None, cpus=""):
        with lock:
            if cpus in running.values():
                shared.append((name, cpus, dict(running)))
            running[name] = cpus
            seen.append((name, cpus))
        time.sleep(0.05)
        with lock:
            del running[name]
        return {"conformance": [{"backend": name}], "semantics": []}

    monkeypatch.setattr(suites, "run_suite", fake_suite)
    chosen = [(n, n) for n in ("numpy-naive", "torch-math", "jax-naive", "numpy-tiled", "jax-dpa")]
    parts = run_cmd.run_suites(chosen, 60, str(tmp_path), 2)
    assert [r["backend"] for r in parts["conformance"]] == [n for n, _ in chosen]  # rows in the order asked
    assert {n for n, _ in seen[:2]} == {"jax-dpa", "jax-naive"}  # the longest start first
    if enough:  # two CPUs for two jobs: never one for two running children
        assert not shared, shared
        assert all(c for _, c in seen) and len({c for _, c in seen}) == 2
    one = []
    monkeypatch.setattr(suites, "run_suite", lambda name, *a, cpus="", **k: one.append(cpus) or
                        {"conformance": [], "semantics": []})
    run_cmd.run_suites(chosen[:2], 60, str(tmp_path), 1)
    assert one == ["", ""]  # one at a time: the machine as it is


def test_xdist_hands_out_the_longest_suites_first():
    """`-n N --dist loadgroup`: the plugin's scheduler pops the groups (a backend in a dtype) of the known
    long suites first (jax-dpa, jax-naive, ...), then the rest by test count - not xdist's own order by
    test count alone."""
    pytest.importorskip("xdist")
    from types import SimpleNamespace

    from attnspec.properties import plugin

    option = SimpleNamespace(tx=["2*popen"], dist="loadgroup", loadscopereorder=True)
    config = SimpleNamespace(option=option, _attnspec_suite=True, getvalue=lambda name: getattr(option, name),
                             getoption=lambda name, default=None: getattr(option, name, default))
    scheduler = plugin.pytest_xdist_make_scheduler(config, None)
    assert type(scheduler).__name__ == "LongestFirst"
    for name, tests in (("numpy-naive-float32", 33), ("jax-naive-float16", 44), ("torch-math-float32", 44),
                        ("jax-dpa-float32", 33), ("jax-dpa-bfloat16", 33), ("onnxruntime-attention-float32", 31)):
        scheduler.workqueue[name] = dict.fromkeys(f"t{i}@{name}" for i in range(tests))  # groups: backend, dtype
    order = [scheduler.workqueue.popitem(last=False)[0] for _ in range(6)]
    assert order == ["jax-dpa-float32", "jax-dpa-bfloat16", "jax-naive-float16", "torch-math-float32",
                     "numpy-naive-float32", "onnxruntime-attention-float32"]
    with pytest.raises(KeyError):
        scheduler.workqueue.popitem(last=False)
    config._attnspec_suite = False  # someone else's run: xdist's own scheduler
    assert plugin.pytest_xdist_make_scheduler(config, None) is None
