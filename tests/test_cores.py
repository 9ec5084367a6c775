"""Suite processes side by side each keep CPUs of their own (properties/cores.py): xdist workers
and `attnspec run`'s children; a bad ATTNSPEC_CPUS is a usage error that names it; a run of the
suite over several backends spreads over the cores by itself unless the user chose a layout, and
its collected tests come longest backends first, each (backend, dtype) group together."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from attnspec.properties import cores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
linux_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
needs_xdist = pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed")


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def test_parse_reads_ids_and_all():
    assert cores.parse("1, 0,1") == [0, 1]
    assert cores.parse("all") is None and cores.parse("") is None and cores.parse("  ") is None


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
    assert cores.worker_slice(1, 2, [3, 2, 1, 0]) == [2, 3]  # sorted first
    assert cores.shares(1) == [""]  # one process alone: left as it is
    two = cores.shares(2)
    assert len(two) == 2
    if hasattr(os, "sched_setaffinity") and _cpus() >= 2:
        assert all(two) and not set(two[0].split(",")) & set(two[1].split(","))


def test_the_variable_wins_and_a_lone_process_is_left_alone():
    assert cores.chosen({"workerid": "gw1", "workercount": 2}, {"ATTNSPEC_CPUS": "3"}) == [3]
    assert cores.chosen({"workerid": "gw1", "workercount": 2}, {"ATTNSPEC_CPUS": "4,5,6,7"}) == [6, 7]  # its slice
    assert cores.chosen(None, {"ATTNSPEC_CPUS": "4,5"}) == [4, 5]
    assert cores.chosen(None, {}) is None  # one process alone: the machine as it is
    assert cores.chosen(None, {"ATTNSPEC_CPUS": "all"}) is None
    assert cores.chosen({"workerid": "gw0", "workercount": 1}, {}) is None
    two = [cores.chosen({"workerid": f"gw{i}", "workercount": 2}, {}) for i in range(2)]
    if _cpus() >= 2:
        assert not set(two[0]) & set(two[1])


@linux_affinity
def test_pin_restricts_affinity_and_every_pool():
    code = ("import os, numpy\nfrom attnspec.properties import cores\ncores.pin([0])\n"
            "from threadpoolctl import threadpool_info\n"
            "print(sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'], os.environ['ATTNSPEC_CPUS'],"
            " max(p['num_threads'] for p in threadpool_info()))")
    env = {k: v for k, v in os.environ.items() if k != "ATTNSPEC_CPUS"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[0]", "1", "0", "1"]


def test_pin_of_nothing_changes_nothing(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores.pin(None)
    cores.pin([])
    assert "OMP_NUM_THREADS" not in os.environ


def test_a_bad_value_is_a_usage_error_of_the_suite():
    env = dict(os.environ, ATTNSPEC_CPUS="first")
    out = subprocess.run([sys.executable, "-m", "pytest", "properties", "--backend", "numpy-naive", "--collect-only",
                          "-q", "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 4, out.stdout + out.stderr
    assert "ATTNSPEC_CPUS must be CPU ids" in out.stdout + out.stderr and "'first'" in out.stdout + out.stderr


def test_workers_wanted_one_per_cpu_at_most_one_per_backend():
    cpus = _cpus()
    assert cores.workers_wanted(12, {}) == (min(cpus, 12) if cpus >= 2 else 0)
    assert cores.workers_wanted(1, {}) == 0  # one backend: its tests share one worker anyway
    assert cores.workers_wanted(0, {"ATTNSPEC_WORKERS": "4"}) == 0
    assert cores.workers_wanted(12, {"ATTNSPEC_CPUS": "0"}) == 0  # kept to one CPU: one process
    assert cores.workers_wanted(12, {"ATTNSPEC_CPUS": "0,1,2"}) == 3
    assert cores.workers_wanted(12, {"ATTNSPEC_WORKERS": "3"}) == 3
    assert cores.workers_wanted(12, {"ATTNSPEC_WORKERS": "auto", "ATTNSPEC_CPUS": "0,1"}) == 2
    assert cores.workers_wanted(2, {"ATTNSPEC_WORKERS": "8"}) == 2
    assert cores.workers_wanted(12, {"ATTNSPEC_WORKERS": "1"}) == 0 == cores.workers_wanted(12, {"ATTNSPEC_WORKERS": "0"})
    for bad in ("two", "-2"):
        with pytest.raises(ValueError, match="ATTNSPEC_WORKERS") as e:
            cores.workers_wanted(12, {"ATTNSPEC_WORKERS": bad})
        assert repr(bad) in str(e.value)


# ---- spread: the user's layout is theirs -------------------------------------------------------------

def _config(argv: list, args: list, addopts=(), pyargs=False, xdist=True, worker=False):
    """A stand-in for pytest's Config as `cores.spread` reads it: the command line as typed (argv),
    the positional arguments pytest parsed from it (args), the ini's addopts."""
    option = SimpleNamespace(pyargs=pyargs, numprocesses=None, dist="no", loadscopereorder=True)
    config = SimpleNamespace(option=option, args=list(args),
                             invocation_params=SimpleNamespace(args=tuple(argv), dir=ROOT),
                             pluginmanager=SimpleNamespace(hasplugin=lambda name: xdist and name == "xdist"),
                             getini=lambda name: list(addopts) if name == "addopts" else [])
    if worker:
        config.workerinput = {"workerid": "gw0", "workercount": 2}
    return config


def _spread(config, backends=2, **env):
    with pytest.MonkeyPatch.context() as m:
        m.delenv("PYTEST_ADDOPTS", raising=False)
        m.setenv("ATTNSPEC_WORKERS", env.get("workers", "2"))
        m.delenv("ATTNSPEC_CPUS", raising=False)
        for k, v in env.get("extra", {}).items():
            m.setenv(k, v)
        cores.spread(config, backends)
    o = config.option
    return (o.numprocesses, o.dist, o.loadscopereorder, getattr(config, "_attnspec_workers", 0))


TWO = ["--backend", "numpy-naive", "--backend", "numpy-tiled"]
UNTOUCHED = (None, "no", True, 0)


def test_spread_lays_the_suite_out_over_two_backends_as_loadgroup():
    assert _spread(_config(["properties", *TWO], ["properties"])) == (2, "loadgroup", False, 2)
    assert _spread(_config(["properties/test_output.py", *TWO], ["properties/test_output.py"])) == (
        2, "loadgroup", False, 2)
    assert _spread(_config(["--pyargs", "attnspec.properties", *TWO], ["attnspec.properties"], pyargs=True)) == (
        2, "loadgroup", False, 2)


@pytest.mark.parametrize("choice", [["-n", "0"], ["-n3"], ["-n=2"], ["--numprocesses", "4"], ["--dist", "load"],
                                    ["--dist=no"], ["-p", "xdist"], ["--maxprocesses", "1"], ["--tx", "popen"],
                                    ["--collect-only"], ["--pdb"], ["--sw"], ["-f"]])
def test_spread_leaves_a_run_alone_when_the_user_chose_its_layout(choice):
    assert _spread(_config(["properties", *TWO, *choice], ["properties"])) == UNTOUCHED


def test_spread_reads_the_users_choice_in_addopts_and_pytest_addopts_too():
    assert _spread(_config(["properties", *TWO], ["properties"], addopts=["-n", "1"])) == UNTOUCHED
    assert _spread(_config(["properties", *TWO], ["properties"]),
                   extra={"PYTEST_ADDOPTS": "--dist=loadfile"}) == UNTOUCHED


def test_spread_keeps_out_of_runs_that_are_not_the_suite_alone():
    assert _spread(_config(["properties", *TWO], ["properties"]), backends=1) == UNTOUCHED  # one backend
    assert _spread(_config(["properties", *TWO], ["properties"]), backends=0) == UNTOUCHED
    assert _spread(_config(["properties", "tests", *TWO], ["properties", "tests"])) == UNTOUCHED  # tests/ too
    assert _spread(_config([*TWO], [])) == UNTOUCHED  # no path: the ini's testpaths (tests/ among them)
    assert _spread(_config(["properties", *TWO], ["properties"], xdist=False)) == UNTOUCHED  # no xdist
    assert _spread(_config(["properties", *TWO], ["properties"], worker=True)) == UNTOUCHED  # an xdist worker
    assert _spread(_config(["properties", *TWO], ["properties"]), workers="1") == UNTOUCHED  # ATTNSPEC_WORKERS=1


def _probe(args, tmp_path, **env):
    """The options a real run of the suite ended with (tests/plugins/option_probe.py), ended before any test."""
    out = tmp_path / "probe.json"
    env = dict({k: v for k, v in os.environ.items() if not k.startswith(("ATTNSPEC_", "PYTEST_"))},
               PYTHONPATH=ROOT, OPTION_PROBE_TO=str(out), OPTION_PROBE_EXIT="1", **env)
    proc = subprocess.run([sys.executable, "-m", "pytest", "properties", "-p", "no:cacheprovider",
                           "-p", "tests.plugins.option_probe", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


@needs_xdist
def test_a_real_run_is_spread_or_left_as_the_user_said(tmp_path):
    spread = _probe(TWO, tmp_path, ATTNSPEC_WORKERS="2")
    assert (spread["numprocesses"], spread["dist"], spread["attnspec_workers"]) == (2, "loadgroup", 2)
    for choice, (n, dist) in ((["-n", "1"], (1, "load")), (["--dist", "loadfile"], (None, "loadfile"))):
        seen = _probe(TWO + choice, tmp_path, ATTNSPEC_WORKERS="2")
        assert (seen["numprocesses"], seen["dist"], seen["attnspec_workers"]) == (n, dist, 0), (choice, seen)
    seen = _probe(TWO + ["-p", "xdist"], tmp_path, ATTNSPEC_WORKERS="2")
    assert seen["numprocesses"] is None and seen["attnspec_workers"] == 0 and "xdist" in seen["plugins"]


@needs_xdist
def test_the_suite_over_two_backends_spreads_over_workers_and_says_so():
    env = dict({k: v for k, v in os.environ.items() if not k.startswith(("ATTNSPEC_", "PYTEST_XDIST"))},
               ATTNSPEC_WORKERS="2", ATTNSPEC_PROFILE="dev")
    proc = subprocess.run([sys.executable, "-m", "pytest", "properties", "-p", "no:cacheprovider", *TWO,
                           "-k", "rows_sum_to_one"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "the backends spread over 2 pytest-xdist workers" in proc.stdout and "created: 2/2 workers" in proc.stdout
    per_backend = {line.split()[0]: line for line in proc.stdout.splitlines()
                   if line.startswith(("numpy-naive ", "numpy-tiled "))}
    assert set(per_backend) == {"numpy-naive", "numpy-tiled"}, proc.stdout[-2000:]
    assert all(" 3 passed " in line for line in per_backend.values()), per_backend  # float16, 32, 64 each
    bad = subprocess.run([sys.executable, "-m", "pytest", "properties", "-p", "no:cacheprovider", *TWO,
                          "-k", "rows_sum_to_one"], cwd=ROOT, env=dict(env, ATTNSPEC_WORKERS="many"),
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 4 and "ATTNSPEC_WORKERS must be a number of workers" in bad.stdout + bad.stderr


# ---- longest_first ------------------------------------------------------------------------------------

def test_longest_first_keeps_each_backend_and_dtype_together_longest_backends_first():
    targets = {}

    def item(backend, dtype, i):
        name = f"t{i}[{backend}-{dtype}]"
        targets[name] = None if backend is None else SimpleNamespace(name=backend, dtype=dtype)
        return name

    items = [item("numpy-naive", "float32", i) for i in range(3)] + [item(None, None, 0)]
    items += [item("jax-naive", "float16", i) for i in range(2)] + [item("numpy-naive", "float64", 9)]
    items += [item("torch-math", "float32", i) for i in range(6)] + [item("jax-dpa", "float32", i) for i in range(2)]
    items += [item("numpy-naive", "float32", 7), item("jax-naive", "float32", 0), item("jax-dpa", "bfloat16", 0)]
    before = list(items)
    cores.longest_first(items, targets.get)
    assert sorted(items) == sorted(before)  # reordered, nothing lost
    groups = [(targets[i].name, targets[i].dtype) if targets[i] else None for i in items]
    runs = [g for n, g in enumerate(groups) if n == 0 or groups[n - 1] != g]
    assert len(runs) == len(set(runs)), runs  # each (backend, dtype) group in one piece
    # the known long suites first (jax-dpa, then jax-naive: LONG_SUITES' order), then by test count
    # (torch-math 6 before numpy-naive 5, its two dtypes together), items of no target (a user's own) last
    assert runs == [("jax-dpa", "float32"), ("jax-dpa", "bfloat16"), ("jax-naive", "float16"), ("jax-naive", "float32"),
                    ("torch-math", "float32"), ("numpy-naive", "float32"), ("numpy-naive", "float64"), None], runs
    # within a group, the collected order is kept
    assert [i for i in items if groups[items.index(i)] == ("numpy-naive", "float32")] == [
        "t0[numpy-naive-float32]", "t1[numpy-naive-float32]", "t2[numpy-naive-float32]", "t7[numpy-naive-float32]"]


def test_suite_weight_puts_the_known_long_suites_first_then_test_count():
    ranked = sorted(["numpy-naive", "jax-naive", "torch-math", "jax-dpa"],
                    key=lambda b: cores.suite_weight(b, {"numpy-naive": 10, "torch-math": 40}.get(b, 0)), reverse=True)
    assert ranked == ["jax-dpa", "jax-naive", "torch-math", "numpy-naive"]


# ---- attnspec run's children ----------------------------------------------------------------------

def test_attnspec_run_gives_side_by_side_suites_cpus_of_their_own(monkeypatch, tmp_path):
    from attnspec import suites

    running, seen, shared, lock = {}, [], [], threading.Lock()
    enough = hasattr(os, "sched_getaffinity") and _cpus() >= 2  # (an xdist worker has one)

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
    monkeypatch.setattr(suites, "say", lambda *a, **k: None)
    chosen = [(n, n) for n in ("numpy-naive", "torch-math", "jax-naive", "numpy-tiled", "jax-dpa")]
    parts = suites.run_suites(chosen, 60, str(tmp_path), 2)
    assert [r["backend"] for r in parts["conformance"]] == [n for n, _ in chosen]  # rows in the order asked
    assert {n for n, _ in seen[:2]} == {"jax-dpa", "jax-naive"}  # the longest start first
    if enough:  # two CPUs for two jobs: never one for two running children
        assert not shared, shared
        assert all(c for _, c in seen) and len({c for _, c in seen}) == 2
    one = []
    monkeypatch.setattr(suites, "run_suite", lambda name, *a, cpus="", **k: one.append(cpus) or
                        {"conformance": [], "semantics": []})
    suites.run_suites(chosen[:2], 60, str(tmp_path), 1)
    assert one == ["", ""]  # one at a time: the machine as it is
