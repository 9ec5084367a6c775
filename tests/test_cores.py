"""Side by side over the cores (properties/cores.py): the suite over several backends lays itself
over pytest-xdist workers unless the user's own options (as pytest parsed them) lay the run out;
ATTNSPEC_WORKERS steers it; the longest backends - as the previous run recorded them - go first,
each (backend, dtype) group together, and `attnspec run` starts its longest suites first under the
run's profile."""
from __future__ import annotations

import json
import os
import re
import threading
import time
from types import SimpleNamespace

import pytest

from attnspec.properties import cores

pytest_plugins = ["pytester"]

TWO = ["--backend", "numpy-naive", "--backend", "numpy-tiled"]


# ---- the recorded seconds ----------------------------------------------------------------------------

def test_recorded_seconds_add_up_per_backend_and_keep_the_others(tmp_path):
    assert cores.recorded_seconds(str(tmp_path)) == {}  # nothing recorded: no weights
    cores.record_seconds(str(tmp_path), [{"backend": "a", "seconds": 1.5}, {"backend": "a", "seconds": 2.0},
                                         {"backend": "b", "seconds": 0.25}])
    cores.record_seconds(str(tmp_path), [{"backend": "b", "seconds": 4.0}])  # a later run of b alone
    assert cores.recorded_seconds(str(tmp_path)) == {"a": 3.5, "b": 4.0}
    (tmp_path / cores.SECONDS_FILE).write_text("not json")
    assert cores.recorded_seconds(str(tmp_path)) == {}  # a torn file: the fallback order, no error


def test_suite_weight_is_the_recorded_seconds_else_the_test_count():
    recorded = {"numpy-naive": 3.0, "jax-dpa": 40.0}
    ranked = sorted(["numpy-naive", "jax-naive", "torch-math", "jax-dpa"], reverse=True,
                    key=lambda b: cores.suite_weight(b, recorded, {"torch-math": 40, "jax-naive": 7}.get(b, 0)))
    assert ranked == ["jax-dpa", "numpy-naive", "torch-math", "jax-naive"]


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
    cores.longest_first(items, targets.get, {"jax-dpa": 90.0, "jax-naive": 30.0})
    assert sorted(items) == sorted(before)  # reordered, nothing lost
    groups = [(targets[i].name, targets[i].dtype) if targets[i] else None for i in items]
    runs = [g for n, g in enumerate(groups) if n == 0 or groups[n - 1] != g]
    assert len(runs) == len(set(runs)), runs  # each (backend, dtype) group in one piece
    # recorded first, by their seconds; then by test count (torch-math 6 before numpy-naive 5), a user's own last
    assert runs == [("jax-dpa", "float32"), ("jax-dpa", "bfloat16"), ("jax-naive", "float16"), ("jax-naive", "float32"),
                    ("torch-math", "float32"), ("numpy-naive", "float32"), ("numpy-naive", "float64"), None], runs
    assert [i for i in items if groups[items.index(i)] == ("numpy-naive", "float32")] == [
        "t0[numpy-naive-float32]", "t1[numpy-naive-float32]", "t2[numpy-naive-float32]", "t7[numpy-naive-float32]"]


# ---- the plugin in a run (pytester: in this process) -------------------------------------------------

_PROBE = """
import json, os, pytest

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    from attnspec.properties import plugin
    o = config.option
    with open("seen.json", "w") as f:
        json.dump(dict(numprocesses=getattr(o, "numprocesses", None), dist=getattr(o, "dist", None),
                       suite=config.stash.get(plugin.IN_SUITE, None), cpu=os.environ.get("ATTNSPEC_CPU"),
                       threads=os.environ.get("OPENBLAS_NUM_THREADS")), f)
    pytest.exit("probed", returncode=0)
"""


def test_workers_wanted_one_per_cpu_at_most_one_per_backend():
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    assert cores.workers_wanted(12, {}) == (min(cpus, 12) if cpus >= 2 else 0)
    assert cores.workers_wanted(1, {}) == 0  # one backend: its tests share one worker anyway
    assert cores.workers_wanted(12, {"ATTNSPEC_WORKERS": "3"}) == 3
    assert cores.workers_wanted(2, {"ATTNSPEC_WORKERS": "8"}) == 2
    assert cores.workers_wanted(12, {"ATTNSPEC_WORKERS": "1"}) == 0 == cores.workers_wanted(12, {"ATTNSPEC_WORKERS": "0"})
    for bad in ("many", "-1"):
        with pytest.raises(ValueError, match="ATTNSPEC_WORKERS"):
            cores.workers_wanted(12, {"ATTNSPEC_WORKERS": bad})


def test_the_suite_spreads_itself_unless_the_users_parsed_options_lay_the_run_out(pytester, monkeypatch):
    """However the user spelled it (command line, PYTEST_ADDOPTS, the ini's addopts), a layout of theirs
    or a mode that needs one process is left as they said; else two backends get two workers."""
    monkeypatch.setenv("ATTNSPEC_WORKERS", "2")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    pytester.makeconftest(_PROBE)

    monkeypatch.delenv("ATTNSPEC_CPU", raising=False)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)

    def seen(*args):
        pytester.runpytest_inprocess("--pyargs", "attnspec.properties", *TWO, *args)
        found = json.loads((pytester.path / "seen.json").read_text())
        assert found["suite"] is True
        # one CPU a worker when the suite spread itself (the workers inherit the variables), never else
        spread = (found["numprocesses"], found["dist"]) == (2, "loadgroup")
        assert (found["cpu"], found["threads"]) == (("xdist", "1") if spread else (None, None)), found
        assert "ATTNSPEC_CPU" not in os.environ and "OPENBLAS_NUM_THREADS" not in os.environ  # restored after
        return found["numprocesses"], found["dist"]

    assert seen() == (2, "loadgroup")
    assert seen("-n", "1") == (1, "load") and seen("--numprocesses=0") == (0, "no")
    assert seen("--dist", "loadfile") == (None, "loadfile") and seen("--co") == (None, "no")
    assert seen("-p", "no:xdist") == (None, None)
    monkeypatch.setenv("PYTEST_ADDOPTS", "-n1")
    assert seen() == (1, "load")
    monkeypatch.delenv("PYTEST_ADDOPTS")
    pytester.makeini("[pytest]\naddopts = --dist=loadscope\n")
    assert seen() == (None, "loadscope")
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("ATTNSPEC_WORKERS", "many")
    bad = pytester.runpytest_inprocess("--pyargs", "attnspec.properties", *TWO)
    assert bad.ret == 4 and "ATTNSPEC_WORKERS must be a number of workers" in "\n".join(bad.errlines)


@pytest.mark.slow  # runs numpy-tiled's whole suite (every property, one problem each)
def test_a_run_records_its_seconds_and_the_next_loadgroup_run_starts_the_longest_first(pytester, monkeypatch):
    monkeypatch.setenv("ATTNSPEC_PROFILE", "dev")
    result = pytester.runpytest_inprocess("--pyargs", "attnspec.properties", "--backend", "numpy-tiled",
                                          "--attnspec-examples", "1")
    assert result.ret == 0, result.stdout.str()[-2000:]
    recorded = cores.recorded_seconds(str(pytester.path))
    assert set(recorded) == {"numpy-tiled"} and recorded["numpy-tiled"] > 0
    # a filtered run (-k) records nothing: its few tests are not the backend's suite
    (pytester.path / cores.SECONDS_FILE).unlink()
    pytester.runpytest_inprocess("--pyargs", "attnspec.properties", *TWO, "-k", "rows_sum_to_one and not sink")
    assert cores.recorded_seconds(str(pytester.path)) == {}


def test_one_cpu_each_gives_one_thread_keeps_the_users_counts_and_names_the_slot():
    assert cores.one_cpu_each({}) == dict.fromkeys(cores.THREAD_VARS, "1")
    assert cores.one_cpu_each({"OMP_NUM_THREADS": "4"}, slot=3) == {
        "OMP_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "ATTNSPEC_CPU": "3"}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
@pytest.mark.parametrize("asked, worker", [("1", None), ("xdist", "gw1"), ("xdist", None), ("", None), ("x", None)])
def test_pin_takes_the_slot_th_cpu_the_process_may_use(asked, worker):
    import subprocess
    import sys

    code = ("import json, os; from attnspec.properties import cores; before = sorted(os.sched_getaffinity(0)); "
            f"cpu = cores.pin(worker={worker!r}); print(json.dumps([before, cpu, sorted(os.sched_getaffinity(0))]))")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, ATTNSPEC_CPU=asked),
                         capture_output=True, text=True, check=True).stdout
    before, cpu, after = json.loads(out)
    if asked == "1" or worker == "gw1":
        assert cpu == before[1 % len(before)] and after == [cpu]  # slot 1: the second CPU (wrapping around)
    else:  # nothing asked (the controller of an xdist run: no worker id): left as it was
        assert cpu is None and after == before


# ---- attnspec run's children ----------------------------------------------------------------------

def test_attnspec_run_starts_the_longest_recorded_suites_first_under_the_runs_profile(monkeypatch, tmp_path):
    from attnspec import suites

    seen, lock = [], threading.Lock()

    running: set = set()

    def fake_suite(name, path, limit, shown=None, progress=None, profile="", cpu=None):
        with lock:
            seen.append((name, profile))
            assert cpu in (0, 1) and cpu not in running  # side by side: a CPU slot each, never shared
            running.add(cpu)
        time.sleep(0.05)
        with lock:
            running.discard(cpu)
        return {"conformance": [{"backend": name}], "semantics": []}

    monkeypatch.chdir(tmp_path)
    cores.record_seconds(str(tmp_path), [{"backend": "jax-dpa", "seconds": 50}, {"backend": "jax-naive", "seconds": 20},
                                         {"backend": "numpy-naive", "seconds": 1}])
    monkeypatch.setattr(suites, "run_suite_child", fake_suite)
    monkeypatch.setattr(suites, "say", lambda *a, **k: None)
    chosen = [(n, n) for n in ("numpy-naive", "torch-math", "jax-naive", "numpy-tiled", "jax-dpa")]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # two CPUs, whatever the machine
    parts = suites.run_suites(chosen, 60, str(tmp_path), 2, profile="dev")
    assert [r["backend"] for r in parts["conformance"]] == [n for n, _ in chosen]  # rows in the order asked
    assert {n for n, _ in seen[:2]} == {"jax-dpa", "jax-naive"}  # the longest recorded start first
    assert {p for _, p in seen} == {"dev"}


@pytest.mark.slow
def test_the_suite_over_two_backends_spreads_over_workers_and_its_rows_reach_the_stream(pytester, monkeypatch):
    monkeypatch.setenv("ATTNSPEC_WORKERS", "2")
    monkeypatch.setenv("ATTNSPEC_PROFILE", "dev")
    result = pytester.runpytest_subprocess("--pyargs", "attnspec.properties", *TWO, "-k", "rows_sum_to_one and not sink",
                                           "--attnspec-rows", "rows.jsonl", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    assert "the backends spread over 2 pytest-xdist workers" in out and "created: 2/2 workers" in out
    first, *rows = [json.loads(line) for line in (pytester.path / "rows.jsonl").read_text().splitlines()]
    from attnspec.backends.registry import resolve
    n = {name: len(resolve(name).capabilities.dtypes) for name in ("numpy-naive", "numpy-tiled")}  # fp8 too (tiled)
    assert len(first["collected"]) == sum(n.values())  # each declared dtype, as the first worker collected them
    rows = [r for r in rows if "row" in r]  # beside them each backend's declarations, once (Backend.conventions)
    assert sorted((r["row"]["backend"], r["row"]["status"]) for r in rows) == sorted(
        [("numpy-naive", "passed")] * n["numpy-naive"] + [("numpy-tiled", "passed")] * n["numpy-tiled"])


@pytest.mark.slow
def test_under_loadgroup_each_backend_and_dtype_runs_on_one_worker(pytester):
    """README's `-n auto --dist loadgroup` keeps a (backend, dtype) group's tests on one worker (the
    programs it compiled stay there; the proof of teeth's tests share its suite's worker).  pytest-xdist
    marks a group by a suffix of the node id; where a pytest release breaks that, the groups scatter
    silently (pytest-dev/pytest-xdist#1386: pyproject pins pytest below it)."""
    from attnspec.backends.registry import resolve

    result = pytester.runpytest_subprocess("--pyargs", "attnspec.properties", "--backend", "numpy-naive", "-n", "2",
                                           "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
                                           "-k", "weights_nonnegative or rows_sum_to_one or order_preserved")
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    # "[gw1] [ 12%] PASSED properties/test_weights.py::test_rows_sum_to_one[numpy-naive-float32]@numpy-naive-float32"
    ran = re.findall(r"^\[(gw\d+)\] \[ *\d+%\] PASSED (\S+)", out, re.M)
    dtypes = resolve("numpy-naive").capabilities.dtypes
    assert len(ran) >= 3 * len(dtypes), out[-3000:]
    assert all("@" in test for _, test in ran), f"no group on the node ids: loadgroup does not group\n{out[-3000:]}"
    workers: dict[str, set] = {}
    for worker, test in ran:
        workers.setdefault(test.rpartition("@")[2], set()).add(worker)
    assert sorted(workers) == sorted(f"numpy-naive-{d}" for d in dtypes)
    assert all(len(w) == 1 for w in workers.values()), workers


# ---- counting, at the hook level (pytester, in this process: no backend, no subprocess) ---------------

_ROWS_CONFTEST = """
from attnspec.properties import results


def pytest_collection_modifyitems(items):
    for item in items:
        item.user_properties.append((results.TEST_KEY, dict(backend="fake", property=item.name[5:], dtype="float32")))
"""

_ROWS_TESTS = """
import pytest
from attnspec.properties import results


def test_answer(request):  # a semantics answer nothing declared: 'recorded'
    request.node.user_properties.append((results.SEMANTICS_KEY, dict(backend="fake", question="q", dtype="float32",
                                                                     observed="nan", declared=None, agrees=None)))


def test_verdict(request):  # a property's verdict: 'failed'
    request.node.user_properties.append((results.ROW_KEY, dict(examples=2, failed=True, message="off by one")))
    pytest.fail("off by one")


def test_harness(request):  # anything else raised: the harness's fault, 'error'
    raise KeyError("harness")


def test_skipped():
    pytest.skip("not natively")
"""


def test_pytest_counts_as_the_suite_does_and_the_rows_reach_the_json(pytester):
    pytester.makeconftest(_ROWS_CONFTEST)
    pytester.makepyfile(test_rows=_ROWS_TESTS)
    result = pytester.runpytest_inprocess("--attnspec-json", "out.json", "--attnspec-rows", "rows.jsonl")
    # pytest's closing line; in a full run an in-process pytester also counts assert-rewrite warnings
    # (the modules are imported already), which say nothing of the suite's counting
    outcomes = {k: v for k, v in result.parseoutcomes().items() if k not in ("warning", "warnings")}
    assert outcomes == dict(recorded=1, failed=1, errors=1, skipped=1), outcomes
    result.stdout.fnmatch_lines(["all * 1 failed, 1 skipped, 1 error, 1 recorded"])
    data = json.loads((pytester.path / "out.json").read_text())
    assert {r["property"]: r["status"] for r in data["conformance"]} == dict(
        answer="recorded", verdict="failed", harness="error", skipped="skipped")
    streamed = [json.loads(line) for line in (pytester.path / "rows.jsonl").read_text().splitlines()]
    assert len(streamed[0]["collected"]) == 4 and [e["row"]["status"] for e in streamed[1:]] == [
        "recorded", "failed", "error", "skipped"]
