"""Side by side over the cores (properties/cores.py): the suite never lays itself out over
pytest-xdist (the user says ``-n auto --dist loadgroup``); the longest backends - as the previous
run recorded them - go first, each (backend, dtype) group together, and `attnspec run` starts its
longest suites first under the run's profile."""
from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

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
import json, pytest

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    from attnspec.properties import plugin
    o = config.option
    with open("seen.json", "w") as f:
        json.dump(dict(numprocesses=getattr(o, "numprocesses", None), dist=getattr(o, "dist", None),
                       suite=config.stash.get(plugin.IN_SUITE, None)), f)
    pytest.exit("probed", returncode=0)
"""


def test_the_suite_over_several_backends_stays_as_the_user_laid_it_out(pytester):
    """No auto-spread: over two backends the run is one process unless -n says otherwise, and -n/--dist
    are the user's as given."""
    pytester.makeconftest(_PROBE)
    for args, expected in (([], (None, "no")), (["-n", "2", "--dist", "loadgroup"], (2, "loadgroup")),
                           (["-p", "no:xdist"], (None, None))):
        pytester.runpytest_inprocess("--pyargs", "attnspec.properties", *TWO, *args)
        seen = json.loads((pytester.path / "seen.json").read_text())
        assert (seen["numprocesses"], seen["dist"]) == expected and seen["suite"] is True, (args, seen)


def test_a_run_records_its_seconds_and_the_next_loadgroup_run_starts_the_longest_first(pytester, monkeypatch):
    monkeypatch.setenv("ATTNSPEC_PROFILE", "dev")
    result = pytester.runpytest_inprocess("--pyargs", "attnspec.properties", *TWO, "--attnspec-examples", "1")
    assert result.ret == 0, result.stdout.str()[-2000:]
    recorded = cores.recorded_seconds(str(pytester.path))
    assert set(recorded) == {"numpy-naive", "numpy-tiled"} and all(s > 0 for s in recorded.values())
    # a filtered run (-k) records nothing: its few tests are not the backend's suite
    (pytester.path / cores.SECONDS_FILE).unlink()
    pytester.runpytest_inprocess("--pyargs", "attnspec.properties", *TWO, "-k", "rows_sum_to_one")
    assert cores.recorded_seconds(str(pytester.path)) == {}


# ---- attnspec run's children ----------------------------------------------------------------------

def test_attnspec_run_starts_the_longest_recorded_suites_first_under_the_runs_profile(monkeypatch, tmp_path):
    from attnspec import suites

    seen, lock = [], threading.Lock()

    def fake_suite(name, path, limit, shown=None, progress=None, profile=""):
        with lock:
            seen.append((name, profile))
        time.sleep(0.05)
        return {"conformance": [{"backend": name}], "semantics": []}

    monkeypatch.chdir(tmp_path)
    cores.record_seconds(str(tmp_path), [{"backend": "jax-dpa", "seconds": 50}, {"backend": "jax-naive", "seconds": 20},
                                         {"backend": "numpy-naive", "seconds": 1}])
    monkeypatch.setattr(suites, "run_suite_child", fake_suite)
    monkeypatch.setattr(suites, "say", lambda *a, **k: None)
    chosen = [(n, n) for n in ("numpy-naive", "torch-math", "jax-naive", "numpy-tiled", "jax-dpa")]
    parts = suites.run_suites(chosen, 60, str(tmp_path), 2, profile="dev")
    assert [r["backend"] for r in parts["conformance"]] == [n for n, _ in chosen]  # rows in the order asked
    assert {n for n, _ in seen[:2]} == {"jax-dpa", "jax-naive"}  # the longest recorded start first
    assert {p for _, p in seen} == {"dev"}
