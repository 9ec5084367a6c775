"""The pytest plugin behind `pytest properties`: backends, Hypothesis profiles, skips, JSON.

Loaded from the repository's root conftest.py (``pytest_plugins = ["properties.plugin"]``)
or with ``-p properties.plugin``.  Options:

  --backend NAME          built-in, entry point or package.module:attr; repeatable or
                          comma-separated.  Default: $ATTNSPEC_BACKENDS, else every built-in.
  --attnspec-json PATH    write the results as JSON (also $ATTNSPEC_JSON).

Tests take a ``target`` argument (one backend at one dtype; ids like
``numpy-naive-float32``) or ``backend_target`` (one per backend, for the semantics profile).
"""
from __future__ import annotations

import json
import os
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.errors import Unsatisfiable

from backends import registry
from specs.error_budget import BUDGETS
from specs.problem import FLOAT_DTYPE_NAMES

from .judge import ConformanceFailure
from .targets import Target, is_compiled

_COMMON = dict(deadline=None,  # JAX compiles on first sight of a shape; our own per-call limit guards hangs
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
# report_multiple_bugs off in dev/ci: shrink the first bug only (each distinct bug costs a full shrink)
settings.register_profile("dev", max_examples=6, report_multiple_bugs=False, **_COMMON)
settings.register_profile("ci", max_examples=6, derandomize=True, print_blob=True, database=None,
                          report_multiple_bugs=False, **_COMMON)
settings.register_profile("thorough", max_examples=250, **_COMMON)
PROFILES = ("dev", "ci", "thorough")
SHRINK_SECONDS = 20  # dev and ci: at most this long shrinking each failure
JAX_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "attnspec", "jax")

_ROWS: dict = {"conformance": [], "semantics": []}


def pytest_addoption(parser):
    g = parser.getgroup("attnspec", "attnspec conformance suite")
    g.addoption("--backend", action="append", dest="attnspec_backend", default=None, metavar="NAME",
                help="backend to check: built-in name, entry point or package.module:attr (repeatable, or "
                     "comma-separated); default $ATTNSPEC_BACKENDS, else every built-in")
    g.addoption("--attnspec-json", dest="attnspec_json", default=None, metavar="PATH",
                help="write per backend x property x dtype results as JSON (also $ATTNSPEC_JSON)")


def _names(config) -> list[str]:
    names = [n.strip() for raw in (config.getoption("attnspec_backend") or []) for n in raw.split(",") if n.strip()]
    return names or registry.names_from_env() or registry.builtin_names()


def _targets(config) -> list[list[Target]]:
    """Per backend, its Targets (one per dtype it declares and the error budget covers)."""
    if not hasattr(config, "_attnspec_targets"):
        out = []
        for name in dict.fromkeys(_names(config)):
            try:
                backend = registry.resolve(name)
            except registry.BackendSelectionError as e:
                raise pytest.UsageError(f"--backend: {e}") from None
            dtypes = [d for d in FLOAT_DTYPE_NAMES if d in backend.capabilities.dtypes and d in BUDGETS]
            targets = []
            for d in dtypes:
                t = Target(backend, d)
                t.spec = name  # what `resolve` takes, for the reproducer
                targets.append(t)
            out.append(targets)
        config._attnspec_targets = out
    return config._attnspec_targets


def pytest_configure(config):
    _ROWS["conformance"].clear()  # pytest.main() may run twice in one process
    _ROWS["semantics"].clear()
    config.addinivalue_line("markers", "needs_gradients: the test calls Backend.backward (skipped without)")
    if not config.getoption("hypothesis_profile", None):
        profile = os.environ.get("HYPOTHESIS_PROFILE", "dev")
        if profile not in PROFILES:
            raise pytest.UsageError(f"HYPOTHESIS_PROFILE must be one of {', '.join(PROFILES)}; got {profile!r}")
        settings.load_profile(profile)
        if profile != "thorough":
            _bound_shrinking(SHRINK_SECONDS)
    if config.getoption("attnspec_backend") or registry.names_from_env():
        _targets(config)  # a bad name is a usage error now, not a collection error per module


def _bound_shrinking(seconds: int) -> None:
    """Cap the time Hypothesis spends shrinking one failure (its default is 300 s a test).

    A failing backend shrinks in every test it fails; dev and ci runs should report within
    minutes.  Hypothesis has no setting for this, so its engine constant is lowered; the
    shrunk example is then less minimal, never wrong.
    """
    try:
        from hypothesis.internal.conjecture import engine
        engine.MAX_SHRINKING_SECONDS = min(engine.MAX_SHRINKING_SECONDS, seconds)
    except (ImportError, AttributeError):  # another Hypothesis: its own limit applies
        pass


def _enable_jax_cache(targets) -> None:
    """JAX's persistent compilation cache: later runs skip the per-shape compiles."""
    if not any(is_compiled(t[0].backend) for t in targets if t):
        return
    try:
        import jax
        os.makedirs(JAX_CACHE, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", JAX_CACHE)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    except Exception:  # noqa: BLE001 - no JAX, or an older one: the backend will say so itself
        pass


def pytest_generate_tests(metafunc):
    if "target" in metafunc.fixturenames or "backend_target" in metafunc.fixturenames:
        per_backend = _targets(metafunc.config)
        if not getattr(metafunc.config, "_attnspec_jax_cache", False):
            _enable_jax_cache(per_backend)
            metafunc.config._attnspec_jax_cache = True
    if "target" in metafunc.fixturenames:
        flat = [t for ts in per_backend for t in ts]
        metafunc.parametrize("target", flat, ids=[t.id for t in flat])
    if "backend_target" in metafunc.fixturenames:  # the semantics profile: float64 where offered
        firsts = [max(ts, key=lambda t: FLOAT_DTYPE_NAMES.index(t.dtype)) for ts in per_backend if ts]
        metafunc.parametrize("backend_target", firsts, ids=[t.name for t in firsts])


def _target_of(item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    found = params.get("target") or params.get("backend_target")
    return found if isinstance(found, Target) else None  # no target at all: pytest's NOTSET placeholder


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    target = _target_of(item)
    if target is None:
        return
    target.examples, target.unsupported = 0, ""
    target.in_hypothesis = hasattr(getattr(item, "obj", None), "hypothesis")
    target.current_property = item.originalname.removeprefix("test_")
    reason = target.skip_reason("forward_backward" if item.get_closest_marker("needs_gradients") else "forward")
    if reason:
        pytest.skip(reason)


@pytest.fixture
def record_semantics(request):
    """record_semantics(question, observed, declared, agrees): one row of the semantics profile."""
    target = _target_of(request.node)

    def record(question, observed, declared, agrees):
        request.node.user_properties.append(("attnspec_semantics", dict(
            backend=target.name, question=question, observed=observed, declared=declared, agrees=agrees)))
    return record


def _failure(exc) -> tuple:
    """(counterexample, message) out of what Hypothesis re-raised."""
    leaves = list(getattr(exc, "exceptions", ())) or [exc]
    for e in leaves:
        if isinstance(e, ConformanceFailure):
            return e.snippet, str(e).split("\nReproduce:")[0]
    return None, f"{type(leaves[0]).__name__}: {leaves[0]}"[:4000]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    target = _target_of(item)
    if target is None or not (report.when == "call" or (report.when == "setup" and not report.passed)):
        return
    exc = call.excinfo.value if call.excinfo else None
    if report.failed and isinstance(exc, Unsatisfiable) and target.unsupported:  # every problem declined
        report.outcome, report.longrepr = "skipped", (str(item.path), item.location[1] or 0,
                                                      f"Skipped: every drawn problem was declined: {target.unsupported}")
    counterexample = message = None
    if report.passed:
        status = "passed"
    elif report.skipped:
        status = "skipped"
        longrepr = report.longrepr
        message = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    else:
        leaves = list(getattr(exc, "exceptions", ())) or [exc]
        status = "failed" if report.when == "call" and all(isinstance(e, AssertionError) for e in leaves) else "error"
        counterexample, message = _failure(exc)
    row = dict(backend=target.name, property=item.originalname.removeprefix("test_"),
               dtype=target.dtype, status=status, examples=target.examples, seconds=round(report.duration, 4),
               counterexample=counterexample, message=message)
    report.user_properties.append(("attnspec_conformance", row))


def pytest_runtest_logreport(report):
    for key, row in report.user_properties:
        if key == "attnspec_conformance":
            _ROWS["conformance"].append(row)
        elif key == "attnspec_semantics" and report.when == "call":
            _ROWS["semantics"].append(row)


# The progress channel: JSON lines appended to $ATTNSPEC_PROGRESS while the suite runs, so that
# `attnspec run` (reports/runner.py) knows what ran, what finished with which rows, and when a
# backend hung (then it ends this process and records the rest as not attempted).
PROGRESS_ENV = "ATTNSPEC_PROGRESS"


def _progress(line: dict) -> None:
    with open(os.environ[PROGRESS_ENV], "a", encoding="utf-8") as f:
        f.write(json.dumps(line, default=str) + "\n")


def _progress_key(item, target) -> dict:
    return dict(test=item.nodeid, backend=target.name, property=item.originalname.removeprefix("test_"),
                dtype=target.dtype)


def pytest_collection_finish(session):
    if os.environ.get(PROGRESS_ENV):
        _progress({"event": "collected", "tests": [
            _progress_key(item, t) for item in session.items for t in [_target_of(item)] if t is not None]})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """'started' before a test, 'finished' with its rows after; 'hung' names a call that did not return."""
    target = _target_of(item)
    if target is None or not os.environ.get(PROGRESS_ENV):
        yield
        return
    from .targets import _HUNG  # id(backend) -> the call that did not return within the per-call limit

    key = _progress_key(item, target)
    _progress(dict(key, event="started"))
    n_conf, n_sem = len(_ROWS["conformance"]), len(_ROWS["semantics"])
    yield
    for row in _ROWS["conformance"][n_conf:]:  # one row per test; none when it was interrupted
        _progress(dict(row, test=item.nodeid, event="finished", semantics=_ROWS["semantics"][n_sem:],
                       hung=_HUNG.get(id(target.backend))))


def pytest_terminal_summary(terminalreporter, config):
    rows = _ROWS["conformance"]
    if not rows:
        return
    tr = terminalreporter
    tr.section("attnspec: per backend")
    per: dict = {}
    for r in rows:
        s = per.setdefault(r["backend"], {"passed": 0, "failed": 0, "skipped": 0, "error": 0, "seconds": 0.0})
        s[r["status"]] += 1
        s["seconds"] += r["seconds"]
    for name, s in per.items():
        tr.write_line(f"{name:28s} {s['passed']:4d} passed {s['failed']:3d} failed {s['error']:3d} error "
                      f"{s['skipped']:4d} skipped {s['seconds']:7.1f} s")
    if _ROWS["semantics"]:
        tr.section("attnspec: semantics profile (observed / declared)")
        for r in _ROWS["semantics"]:
            flag = {True: "ok", False: "CONTRADICTS DECLARATION", None: "(nothing declared)"}[r["agrees"]]
            tr.write_line(f"{r['backend']:28s} {r['question']:22s} {str(r['observed']):26s} "
                          f"{str(r['declared']):14s} {flag}")


def pytest_sessionfinish(session):
    config = session.config
    if hasattr(config, "workerinput"):  # an xdist worker: the controller writes the file
        return
    path = config.getoption("attnspec_json", None) or os.environ.get("ATTNSPEC_JSON")
    if not path:
        return
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".attnspec-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(_ROWS, f, indent=1, default=str)
    os.replace(tmp, path)  # atomic: a reader never sees half a file
