"""A run of the suite over several backends spreads over the cores by itself unless the user chose
a layout (properties/cores.py), its collected tests come longest backends first, each (backend,
dtype) group together, and `attnspec run` starts its longest suites first under the run's profile."""
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
needs_xdist = pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed")


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def test_workers_wanted_one_per_cpu_at_most_one_per_backend():
    cpus = _cpus()
    assert cores.workers_wanted(12, {}) == (min(cpus, 12) if cpus >= 2 else 0)
    assert cores.workers_wanted(1, {}) == 0  # one backend: its tests share one worker anyway
    assert cores.workers_wanted(0, {"ATTNSPEC_WORKERS": "4"}) == 0
    assert cores.workers_wanted(12, {"ATTNSPEC_WORKERS": "3"}) == 3
    assert cores.workers_wanted(12, {"ATTNSPEC_WORKERS": "auto"}) == cores.workers_wanted(12, {})
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


@pytest.mark.slow
@needs_xdist
def test_a_real_run_is_spread_or_left_as_the_user_said(tmp_path):
    spread = _probe(TWO, tmp_path, ATTNSPEC_WORKERS="2")
    assert (spread["numprocesses"], spread["dist"], spread["attnspec_workers"]) == (2, "loadgroup", 2)
    for choice, (n, dist) in ((["-n", "1"], (1, "load")), (["--dist", "loadfile"], (None, "loadfile"))):
        seen = _probe(TWO + choice, tmp_path, ATTNSPEC_WORKERS="2")
        assert (seen["numprocesses"], seen["dist"], seen["attnspec_workers"]) == (n, dist, 0), (choice, seen)
    seen = _probe(TWO + ["-p", "xdist"], tmp_path, ATTNSPEC_WORKERS="2")
    assert seen["numprocesses"] is None and seen["attnspec_workers"] == 0 and "xdist" in seen["plugins"]


@pytest.mark.slow
@needs_xdist
def test_the_suite_over_two_backends_spreads_over_workers_and_says_so():
    env = dict({k: v for k, v in os.environ.items() if not k.startswith(("ATTNSPEC_", "PYTEST_XDIST"))},
               ATTNSPEC_WORKERS="2", ATTNSPEC_PROFILE="dev")
    proc = subprocess.run([sys.executable, "-m", "pytest", "properties", "-p", "no:cacheprovider", *TWO,
                           "-k", "rows_sum_to_one"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "the backends spread over 2 pytest-xdist workers" in proc.stdout and "created: 2/2 workers" in proc.stdout
    per_backend = {line.split()[0]: line for line in proc.stdout.splitlines()
                   if line.startswith(("numpy-naive ", "numpy-tiled ")) and " passed " in line}
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

def test_attnspec_run_starts_the_longest_suites_first_under_the_runs_profile(monkeypatch, tmp_path):
    from attnspec import suites

    seen, lock = [], threading.Lock()

    def fake_suite(name, path, limit, shown=None, progress=None, profile=""):
        with lock:
            seen.append((name, profile))
        time.sleep(0.05)
        return {"conformance": [{"backend": name}], "semantics": []}

    monkeypatch.setattr(suites, "run_suite", fake_suite)
    monkeypatch.setattr(suites, "say", lambda *a, **k: None)
    chosen = [(n, n) for n in ("numpy-naive", "torch-math", "jax-naive", "numpy-tiled", "jax-dpa")]
    parts = suites.run_suites(chosen, 60, str(tmp_path), 2, profile="dev")
    assert [r["backend"] for r in parts["conformance"]] == [n for n, _ in chosen]  # rows in the order asked
    assert {n for n, _ in seen[:2]} == {"jax-dpa", "jax-naive"}  # the longest start first
    assert {p for _, p in seen} == {"dev"}
