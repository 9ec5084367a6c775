"""The pytest plugin of attnspec's conformance suite: backends, profiles, verdicts, JSON, output.

Registered as the pytest plugin ``attnspec`` (a ``pytest11`` entry point), so with attnspec
installed ``pytest --pyargs properties --backend mypkg.attn:sdpa`` runs the suite from any
folder; `properties.install` runs it inside a project's own tests; attnspec's checkout loads
it from its root conftest.py when the entry point did not.  Options:

  --backend NAME, --attnspec-backend NAME
                          built-in, entry point or package.module:attr; repeatable or comma-
                          separated.  Default: $ATTNSPEC_BACKENDS, else every built-in.
                          (--backend only where no other plugin or conftest of the run defines it.)
  --attnspec-json PATH    write the results as JSON (also $ATTNSPEC_JSON).
  --attnspec-tb block|long  one block per failure (default) or pytest's traceback (-v: long).
  --attnspec-repro DIR    where reproducers go (default: beside the JSON, else .attnspec/repro).

Inert in other test suites: importing it loads no framework and no Hypothesis profile; it
parametrizes only attnspec's own property tests (never a user's fixture that happens to be
called ``target``); profiles load only for runs of the suite (properties/profiles.py).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import pytest

from attnspec.properties import cores, heap, output, profiles

ENTRY_POINT = "attnspec"              # the pytest11 name: -p no:attnspec turns the plugin off
INSTALLED = "__attnspec_backends__"   # set by properties.install in a user's test module
PACKAGE = __package__ or "properties"
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
JAX_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "attnspec", "jax")
JAX_PROGRAMS = os.path.join(os.path.expanduser("~"), ".cache", "attnspec", "jax-programs")
PROFILES = tuple(profiles.EXAMPLES)

_ROWS: dict = {"conformance": [], "semantics": []}


# ---- options ------------------------------------------------------------------------------

def pytest_addoption(parser, pluginmanager):
    g = parser.getgroup("attnspec", "attnspec conformance suite")
    g.addoption("--attnspec-backend", action="append", dest="attnspec_backend", default=None, metavar="NAME",
                help="backend to check: built-in name, entry point or package.module:attr (repeatable, or "
                     "comma-separated); default $ATTNSPEC_BACKENDS, else every built-in")
    g.addoption("--attnspec-json", dest="attnspec_json", default=None, metavar="PATH",
                help="write per backend x property x dtype results as JSON (also $ATTNSPEC_JSON)")
    g.addoption("--attnspec-tb", dest="attnspec_tb", default=None, choices=("block", "long"),
                help="a failure as one block with its reproducer's path (default), or pytest's traceback "
                     "(long; also with -v)")
    g.addoption("--attnspec-repro", dest="attnspec_repro", default=None, metavar="DIR",
                help="folder for reproducer files (default: <json>-repro/ beside the JSON, else .attnspec/repro)")
    if pluginmanager.get_plugin(ENTRY_POINT) is not sys.modules[__name__]:
        _add_backend_alias(parser)  # loaded on request (-p, a conftest): not in someone else's suite


@pytest.hookimpl(hookwrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Loaded by the entry point (in every pytest run): --backend after the run's conftests, if free."""
    yield
    _add_backend_alias(parser)


def _add_backend_alias(parser) -> None:
    """--backend, unless a plugin or conftest of this run already defines it (--attnspec-backend always works)."""
    try:
        options = list(parser._anonymous.options) + [o for g in parser._groups for o in g.options]
        taken = {name for o in options for name in o.names()}
    except AttributeError:  # another pytest's parser: assume it is free
        taken = set()
    if "--backend" not in taken:
        parser.getgroup("attnspec").addoption(
            "--backend", action="append", dest="attnspec_backend", default=None, metavar="NAME",
            help="same as --attnspec-backend")


def _names(config) -> list[str]:
    from attnspec.backends import registry

    names = [n.strip() for raw in (config.getoption("attnspec_backend") or []) for n in raw.split(",") if n.strip()]
    return names or registry.names_from_env() or registry.suite_names()


def _reaches_suite(config, arg, inside: bool = False) -> bool:
    """Whether a path or --pyargs name reaches properties/ (inside: lies within it)."""
    arg = str(arg).split("::")[0]
    if config.option.pyargs and (arg == PACKAGE or arg.startswith(PACKAGE + ".")):
        return True
    path = os.path.abspath(os.path.join(str(config.invocation_params.dir), arg))
    within = path == PACKAGE_DIR or path.startswith(PACKAGE_DIR + os.sep)
    return within or (not inside and PACKAGE_DIR.startswith(path + os.sep))


def runs_suite(config) -> bool:
    """Whether this run is the suite's: backends named, or a path or --pyargs name inside properties/."""
    if config.getoption("attnspec_backend", None) or os.environ.get("ATTNSPEC_BACKENDS", "").strip():
        return True
    return any(_reaches_suite(config, arg) for arg in config.args)


@pytest.hookimpl(hookwrapper=True)
def pytest_cmdline_main(config):
    """The suite over several backends uses the machine's cores by itself (pytest-xdist installed)."""
    try:
        _spread_over_workers(config)
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    yield


def _spread_over_workers(config) -> None:
    """`pytest properties` with several backends and no choice of the user's (-n, --dist, a
    debugger, --collect-only...): `-n W --dist loadgroup`, W from properties.cores.workers_wanted
    (a worker a CPU, a backend's tests in a dtype on one worker, the longest suites first)."""
    opt = config.option
    chose = [getattr(opt, name, None) for name in ("tx", "usepdb", "trace", "stepwise", "collectonly",
                                                   "setupplan", "setuponly")]
    if (hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist") or any(chose)
            or getattr(opt, "numprocesses", None) is not None or getattr(opt, "dist", "no") != "no"
            or not config.args or not all(_reaches_suite(config, arg, inside=True) for arg in config.args)):
        return
    workers = cores.workers_wanted(len(_names(config)))
    if workers:
        opt.numprocesses, opt.dist = workers, "loadgroup"
        config._attnspec_workers = workers


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_gradients: the test calls Backend.backward (skipped without)")
    config.addinivalue_line("markers", "xdist_group(name): pytest-xdist's --dist loadgroup runs a group on one worker")
    _ROWS["conformance"].clear()  # pytest.main() may run twice in one process
    _ROWS["semantics"].clear()
    config._attnspec_tb = config.getoption("attnspec_tb", None) or ("long" if config.getoption("verbose") > 0 else "block")
    json_path = config.getoption("attnspec_json", None) or os.environ.get("ATTNSPEC_JSON")
    config._attnspec_repro = os.path.abspath(config.getoption("attnspec_repro", None) or
                                             output.repro_dir(json_path, str(config.rootpath)))
    config._attnspec_suite = runs_suite(config)
    try:
        config._attnspec_profile = profiles.choose()
    except ValueError as e:
        if config._attnspec_suite:
            raise pytest.UsageError(str(e)) from None
        config._attnspec_profile = "dev"  # not this run's business; install() says so if it runs
    if not config._attnspec_suite:
        return
    try:  # side by side with other suite processes: a core of its own (properties/cores.py)
        cores.pin(cores.chosen(getattr(config, "workerinput", None)))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    if not config.getoption("hypothesis_profile", None):  # an explicit --hypothesis-profile wins
        profiles.load(config._attnspec_profile)
    config._attnspec_seed = None
    if config._attnspec_profile == "ci" and config.getoption("hypothesis_seed", None) is None:
        try:
            config._attnspec_seed = profiles.ci_seed(str(config.rootpath))
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
        from hypothesis import core  # what --hypothesis-seed sets

        core.global_force_seed = config._attnspec_seed[0]
    if config.getoption("attnspec_backend") or os.environ.get("ATTNSPEC_BACKENDS", "").strip():
        _targets(config, _names(config))  # a bad name is a usage error now, not a collection error per module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`-n N --dist loadgroup` on the suite: the longest backends' suites start first (properties/cores.py)."""
    if getattr(config, "_attnspec_suite", False) and config.getoption("dist", None) == "loadgroup":
        return cores.longest_first_scheduler(config, log)
    return None


def pytest_report_header(config):
    if getattr(config, "_attnspec_suite", False):
        name = getattr(config, "_attnspec_profile", "dev")
        seed = getattr(config, "_attnspec_seed", None)
        seeded = f"; seed {seed[0]} ({seed[1]}; again: --hypothesis-seed={seed[0]})" if seed else ""
        lines = [f"attnspec: profile {name} ({profiles.EXAMPLES[name]} drawn examples a test{seeded}); "
                 f"reproducers in {output.shown_path(config._attnspec_repro)}"]
        workers = getattr(config, "_attnspec_workers", 0)
        if workers:
            lines.append(f"attnspec: the backends spread over {workers} pytest-xdist workers, a CPU each "
                         f"({cores.WORKERS_ENV}=1 or -n 0: one process)")
        return lines
    return None


# ---- targets ------------------------------------------------------------------------------

def import_paths(spec: str) -> tuple:
    """Folders a fresh interpreter needs on sys.path to resolve `spec` (a package.module:attr
    outside site-packages: the folder holding its top package), and attnspec's own root when
    attnspec is not installed."""
    import site
    import sysconfig
    from importlib import metadata

    paths = []
    module_name = spec.partition(":")[0] if ":" in spec else ""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if file:
        root = os.path.dirname(os.path.abspath(file))
        if os.path.basename(file).startswith("__init__."):
            root = os.path.dirname(root)
        for _ in range(module_name.count(".")):
            root = os.path.dirname(root)
        installed = {os.path.abspath(p) for p in [*site.getsitepackages(), site.getusersitepackages(),
                                                   *sysconfig.get_paths().values()] if p}
        if root not in installed:
            paths.append(root)
    try:
        metadata.distribution("attnspec")
    except metadata.PackageNotFoundError:
        paths.append(os.path.dirname(PACKAGE_DIR))  # the checkout, run without installing
    return tuple(paths)


def make_targets(spec: str) -> list:
    """One Target per dtype the backend declares and the error budget covers."""
    from attnspec.backends import registry
    from attnspec.specs.error_budget import BUDGETS
    from attnspec.specs.problem import FLOAT_DTYPE_NAMES

    from attnspec.properties.targets import Target

    backend = registry.resolve(spec)
    paths = import_paths(spec)
    targets = []
    for d in FLOAT_DTYPE_NAMES:
        if d in backend.capabilities.dtypes and d in BUDGETS:
            t = Target(backend, d, import_paths=paths)
            t.spec = spec  # what `resolve` takes, for the reproducer
            targets.append(t)
    return targets


def _targets(config, names) -> list:
    """Per backend, its Targets; resolved once per run."""
    from attnspec.backends import registry

    cache = config.__dict__.setdefault("_attnspec_targets", {})
    key = tuple(dict.fromkeys(names))
    if key not in cache:
        out = []
        for name in key:
            try:
                out.append(make_targets(name))
            except registry.BackendSelectionError as e:
                raise pytest.UsageError(f"--backend: {e}") from None
        cache[key] = out
    return cache[key]


def is_property(fn) -> bool:
    """attnspec's own property tests (also where `install` put them), never a user's."""
    code = getattr(fn, "__code__", None)
    return code is not None and os.path.dirname(os.path.abspath(code.co_filename)) == PACKAGE_DIR


def _enable_jax_cache(per_backend) -> None:
    """JAX's persistent compilation cache, and the JAX backends' compiled programs kept whole
    (backends/jax_programs.py): later runs skip the per-shape compiles, traces and lowerings."""
    from attnspec.properties.targets import is_compiled

    if not any(is_compiled(t[0].backend) for t in per_backend if t):
        return
    from attnspec.backends import jax_programs

    try:
        jax_programs.enable(JAX_PROGRAMS)
    except OSError:  # no room or no home: plain jit, as before
        pass
    try:
        import jax
        os.makedirs(JAX_CACHE, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", JAX_CACHE)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    except Exception:  # noqa: BLE001 - no JAX, or an older one: the backend will say so itself
        pass


def pytest_generate_tests(metafunc):
    if "target" not in metafunc.fixturenames or not is_property(metafunc.function):
        return
    installed = getattr(metafunc.module, INSTALLED, None)
    if installed:
        try:
            per_backend = _targets(metafunc.config, installed)
        except pytest.UsageError as e:
            pytest.fail(f"attnspec.properties.install: {e}".replace("--backend: ", ""), pytrace=False)
    else:
        per_backend = _targets(metafunc.config, _names(metafunc.config))
    if not getattr(metafunc.config, "_attnspec_jax_cache", False):
        _enable_jax_cache(per_backend)
        metafunc.config._attnspec_jax_cache = True
    flat = [t for ts in per_backend for t in ts]
    # xdist_group: with `-n N --dist loadgroup` a backend's tests in one dtype share one worker, and
    # with them the programs compiled for that dtype (JAX, flex: a program per shape and dtype) -
    # split further, each worker would compile them again; split less, the longest backend's four
    # dtypes would run one after another on one worker (jax-dpa: 250 s of a 400 s run)
    metafunc.parametrize("target", [pytest.param(t, id=t.id, marks=pytest.mark.xdist_group(t.id))
                                    for t in flat])


def _target_of(item):
    targets = sys.modules.get(PACKAGE + ".targets")
    if targets is None:  # the suite's targets were never made: not an attnspec test
        return None
    params = getattr(getattr(item, "callspec", None), "params", {})
    found = params.get("target")
    return found if isinstance(found, targets.Target) else None  # pytest's NOTSET placeholder, or a user's own


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    target = _target_of(item)
    if target is None:
        return
    target.examples, target.unsupported, target.declined = 0, "", 0
    target.in_hypothesis = hasattr(getattr(item, "obj", None), "hypothesis")
    target.current_property = item.originalname.removeprefix("test_")
    reason = target.skip_reason("forward_backward" if item.get_closest_marker("needs_gradients") else "forward")
    if reason:
        pytest.skip(reason)


# A declared deviation's counterexample is known (the declaration says what it is): it is not
# shrunk (each shrinking step of a compiling backend is a new shape, a new compile: 2-5 s a test)
DEVIATION_SHRINK_SECONDS = 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    target = _target_of(item)
    if target is None:
        yield
        return
    semantics = target.backend.semantics
    declared = hasattr(semantics, "deviation") and semantics.deviation(target.current_property, target.dtype)
    if getattr(item.config, "_attnspec_profile", None) == "thorough":
        outcome = yield
    else:
        with profiles.bounded_shrinking(DEVIATION_SHRINK_SECONDS if declared else profiles.SHRINK_SECONDS):
            outcome = yield
    exc = outcome.exception
    if (declared and exc is not None and (_conformance_failures(exc) or _assertions_only(exc))
            and declared.matches(_failure_text(exc))):
        # the declared deviation, seen: makereport records it from here.  Not raised on, so pytest
        # does not format a traceback it would throw away (it parses the source of every frame:
        # ~0.2 s a test through torch's or JAX's files)
        item._attnspec_deviation_seen = exc
        outcome.force_result(None)


@pytest.fixture
def record_semantics(request):
    """record_semantics(question, observed, declared, agrees): one row of the semantics profile."""
    target = _target_of(request.node)
    prop = getattr(request.node, "originalname", request.node.name).removeprefix("test_")
    deviations = getattr(getattr(target.backend, "semantics", None), "deviations", ()) or ()

    def record(question, observed, declared, agrees):
        if agrees is False and any(d.covers(prop, target.dtype) for d in deviations):
            agrees = None  # a departure declared at this dtype (its `deviation` row says so): no contradiction
        request.node.user_properties.append(("attnspec_semantics", dict(
            backend=target.name, question=question, dtype=target.dtype, observed=observed, declared=declared,
            agrees=agrees)))
    return record


# ---- verdicts -----------------------------------------------------------------------------

def _leaves(exc) -> list:
    return list(getattr(exc, "exceptions", ())) or [exc]


def _assertions_only(exc) -> bool:
    return all(isinstance(e, AssertionError) for e in _leaves(exc))


def _conformance_failures(exc) -> list:
    from attnspec.properties.judge import ConformanceFailure

    found, todo = [], _leaves(exc)
    while todo:
        e = todo.pop(0)
        if isinstance(e, ConformanceFailure):
            found.append(e)
        elif getattr(e, "exceptions", None):  # nested groups (Hypothesis' flaky and multiple-bug reports)
            todo += list(e.exceptions)
    return found


class _Crash:
    """What pytest's -ra and --tb=line show of a failure: where, and its first line."""

    def __init__(self, path: str, lineno: int, message: str):
        self.path, self.lineno, self.message = path, lineno, message

    def __str__(self) -> str:
        return f"{self.path}:{self.lineno}: {self.message}"


class _Block:
    """A failure as pytest prints it: our block instead of the traceback."""

    def __init__(self, text: str, first: str, item):
        self.text = text
        self.reprcrash = _Crash(str(item.path), (item.location[1] or 0) + 1, first)

    def toterminal(self, tw) -> None:
        for line in self.text.splitlines():
            tw.line(line)

    def __str__(self) -> str:
        return self.text


def _status(report, item, exc, failures) -> str:
    if report.passed:
        rows = [v for k, v in item.user_properties if k == "attnspec_semantics"]
        return "recorded" if rows and all(r["agrees"] is None for r in rows) else "passed"
    if report.skipped:
        return "skipped"
    if failures or (report.when == "call" and _assertions_only(exc)):
        return "failed"
    return "error"  # a fault of the test itself (the harness), or a setup error


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    target = _target_of(item)
    if target is None or not (report.when == "call" or (report.when == "setup" and not report.passed)):
        return
    from hypothesis.errors import Unsatisfiable

    exc = call.excinfo.value if call.excinfo else None
    seen = getattr(item, "_attnspec_deviation_seen", None) if report.when == "call" else None
    if report.failed and isinstance(exc, Unsatisfiable) and target.unsupported:  # every problem declined
        report.outcome, report.longrepr = "skipped", (str(item.path), item.location[1] or 0,
                                                      f"Skipped: every drawn problem was declined: {target.unsupported}")
    if seen is not None:  # a declared deviation, failed as declared (pytest_runtest_call)
        exc, failures, status = seen, _conformance_failures(seen), "failed"
    else:
        failures = _conformance_failures(exc) if report.failed else []
        status = _status(report, item, exc, failures)
    prop = item.originalname.removeprefix("test_")
    folder = item.config._attnspec_repro
    counterexample = message = path = None
    if failures:
        paths = []
        for n, f in enumerate(failures):
            try:
                paths.append(output.write_reproducer(folder, f, n))
            except OSError:  # a read-only folder: the JSON still holds the snippet
                paths.append(None)
        counterexample, message, path = failures[0].snippet, failures[0].headline, paths[0]
        if item.config._attnspec_tb == "block":
            text = "\n\n".join(output.failure_block(f, p) for f, p in zip(failures, paths))
            report.longrepr = _Block(f"{text}\n{output.LONG_HINT}", failures[0].headline.splitlines()[0], item)
    elif report.failed or seen is not None:
        leaf = _leaves(exc)[0]
        message = f"{type(leaf).__name__}: {leaf}"[:4000]
    elif report.skipped:
        longrepr = report.longrepr
        message = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    status, message = _declared_deviation(report, target, prop, status, message)
    if status in ("passed", "recorded"):
        output.forget_reproducers(folder, target.name, target.dtype, prop)
    row = dict(backend=target.name, property=prop, dtype=target.dtype, status=status, examples=target.examples,
               seconds=round(report.duration, 4), counterexample=counterexample, message=message, reproducer=path)
    report.user_properties.append(("attnspec_conformance", row))


def _failure_text(exc) -> str:
    """What a declared deviation's `when` is matched against: the failure's message and problem,
    as the row's message has it (pytest_runtest_makereport)."""
    failures = _conformance_failures(exc)
    if failures:
        return failures[0].headline
    leaf = _leaves(exc)[0]
    return f"{type(leaf).__name__}: {leaf}"[:4000]


def _declared_deviation(report, target, prop: str, status: str, message):
    """A failure the backend declares as a known deviation is `deviation`, not a failure (and not a pass)."""
    declared = target.backend.semantics.deviation(prop, target.dtype) if hasattr(
        target.backend.semantics, "deviation") else None
    if declared is None:
        return status, message
    if status == "failed" and not declared.matches(message):
        return status, f"{message} | not the declared deviation ({declared.why}; when: {declared.when!r})"
    if status == "failed":
        report.outcome, report.longrepr = "passed", None  # the session does not fail on it
        return "deviation", f"declared deviation: {declared.why} | observed: {message}"
    if status == "passed":
        return status, f"declared deviation not seen in this run: {declared.why}"
    return status, message


def _row_of(report):
    return next((v for k, v in getattr(report, "user_properties", ()) if k == "attnspec_conformance"), None)


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report, config):
    """pytest counts as the suite does: 'recorded' is its own word; a harness fault is an error."""
    row = _row_of(report)
    if row is None or report.when != "call":
        return None
    if row["status"] == "recorded":
        return "recorded", "r", "RECORDED"
    if row["status"] == "deviation":
        return "deviation", "d", "DEVIATION"
    if row["status"] == "error" and report.failed:
        return "error", "E", "ERROR"
    return None


def pytest_runtest_logreport(report):
    for key, row in report.user_properties:
        if key == "attnspec_conformance":
            _ROWS["conformance"].append(row)
        elif key == "attnspec_semantics" and report.when == "call":
            _ROWS["semantics"].append(row)


# ---- the progress channel -----------------------------------------------------------------
# JSON lines appended to $ATTNSPEC_PROGRESS while the suite runs, so that `attnspec run`
# (reports/suites.py) knows what ran, what finished with which rows, and when a backend hung
# (then it ends this process and records the rest as not attempted).
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
    from attnspec.properties.targets import _HUNG  # id(backend) -> the call that did not return within the per-call limit

    key = _progress_key(item, target)
    _progress(dict(key, event="started"))
    n_conf, n_sem = len(_ROWS["conformance"]), len(_ROWS["semantics"])
    yield
    for row in _ROWS["conformance"][n_conf:]:  # one row per test; none when it was interrupted
        _progress(dict(row, test=item.nodeid, event="finished", semantics=_ROWS["semantics"][n_sem:],
                       hung=_HUNG.get(id(target.backend))))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    target = _target_of(item)
    if target is not None and getattr(item.config, "_attnspec_suite", False):
        heap.after_first_test_of(target.name)


def pytest_unconfigure(config):
    if getattr(config, "_attnspec_suite", False):
        heap.at_exit()


# ---- the end of the run -------------------------------------------------------------------

def pytest_terminal_summary(terminalreporter, config):
    rows = _ROWS["conformance"]
    if not rows:
        return
    tr = terminalreporter
    tr.section("attnspec: per backend")
    for line in output.backend_lines(rows):
        tr.write_line(line)
    if _ROWS["semantics"]:
        from attnspec.specs.problem import FLOAT_DTYPE_NAMES
        tr.section("attnspec: semantics profile (observed per dtype; 'ok' = as declared, blank = nothing declared)")
        for line in output.semantics_lines(_ROWS["semantics"], list(reversed(FLOAT_DTYPE_NAMES))):
            tr.write_line(line)
    if any(r["reproducer"] for r in rows):
        tr.write_line(f"reproducers: {output.shown_path(config._attnspec_repro)}/ (python <file>)")


def pytest_sessionfinish(session):
    config = session.config
    if hasattr(config, "workerinput"):  # an xdist worker: the controller writes the file
        return
    path = config.getoption("attnspec_json", None)
    if not path and (getattr(config, "_attnspec_suite", False) or _ROWS["conformance"]):
        path = os.environ.get("ATTNSPEC_JSON")  # the variable only where the suite ran
    if not path:
        return
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".attnspec-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(_ROWS, f, indent=1, default=str)
    os.replace(tmp, path)  # atomic: a reader never sees half a file
