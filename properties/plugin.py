"""The pytest plugin of attnspec's conformance suite: the hooks that wire its parts together.

Registered as the pytest plugin ``attnspec`` (a ``pytest11`` entry point), so with attnspec
installed ``pytest --pyargs attnspec.properties --backend mypkg.attn:sdpa`` runs the suite from
any folder; `attnspec.properties.install` runs it inside a project's own tests.  Exploration and
what a run explores: properties/options.py; outcomes: properties/outcomes.py; rows, summary and
JSON: properties/results.py, taken from the reports by properties/rows.py; side by side over the
cores: properties/cores.py; what the run keeps in pytest's ``config.stash``: properties/stash.py.

Inert in other test suites: importing it loads no framework and no Hypothesis profile; it
parametrizes only attnspec's own property tests (never a user's fixture that happens to be
called ``target``).  Public APIs of pytest and Hypothesis only.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys

import pytest

from attnspec.properties import cores, options, profiles, results, rows
from attnspec.properties.stash import IN_SUITE, ROW_STREAM, ROWS, RUN, TARGETS, WORKERS  # noqa: F401 - the keys

INSTALLED = "__attnspec_backends__"   # set by attnspec.properties.install in a user's test module


def pytest_addoption(parser, pluginmanager):
    options.addoption(parser)


@pytest.hookimpl(hookwrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """--backend once the run's conftests are loaded, if none of them defines it."""
    yield
    options.add_backend_alias(parser)


@pytest.hookimpl(hookwrapper=True)
def pytest_cmdline_main(config):
    """Before pytest-xdist reads its options: the suite over several backends uses the machine's cores
    unless the user laid the run out (properties/cores.py)."""
    try:
        suite = bool(config.args) and options.runs_suite(config) and all(
            options.reaches_suite(config, a, inside=True) for a in config.args)
        workers = config.stash[WORKERS] = cores.spread(config, len(options.backend_names(config)) if suite else 0)
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    saved = {var: os.environ.get(var) for var in (*cores.THREAD_VARS, cores.CPU_ENV)}
    if workers:  # one CPU a worker: the workers inherit the variables, each pins itself (pytest_configure)
        os.environ.update(cores.one_cpu_each(os.environ, slot="xdist"))
    try:
        yield
    finally:  # this process's environment as it was (a run inside a test session: pytester)
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_gradients: the test calls Backend.backward (skipped without)")
    config.addinivalue_line("markers", "xdist_group(name): pytest-xdist's --dist loadgroup runs a group on one worker")
    config.stash[ROWS] = {"conformance": [], "semantics": [], "declarations": []}
    config.stash[ROW_STREAM] = None
    config.stash[TARGETS] = {}
    config.pluginmanager.register(rows.RowRecorder(config), "attnspec-rows")
    in_suite = config.stash[IN_SUITE] = options.runs_suite(config)
    if in_suite:  # a process the suite laid out over the cores: its own CPU (properties/cores.py)
        cores.pin(worker=getattr(config, "workerinput", {}).get("workerid"))
    try:
        config.stash[RUN] = options.configure(config)
    except ValueError as e:
        if in_suite:
            raise pytest.UsageError(str(e)) from None
        config.stash[RUN] = None  # not this run's business; install() says so if it runs
        return
    rows_path = config.getoption("attnspec_rows", None)
    if rows_path and not hasattr(config, "workerinput"):  # an xdist worker's reports reach the controller
        path = os.path.join(str(config.invocation_params.dir), rows_path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        config.stash[ROW_STREAM] = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed at unconfigure
    if not in_suite:
        return
    _load_profile(config)
    if options.named(config):
        _targets(config, options.backend_names(config))  # a bad name is a usage error now, not per module


def pytest_unconfigure(config):
    recorder = config.pluginmanager.get_plugin("attnspec-rows")
    if recorder is not None:
        config.pluginmanager.unregister(recorder)
    stream = config.stash.get(ROW_STREAM, None)
    if stream is not None:
        stream.close()
        config.stash[ROW_STREAM] = None


def _load_profile(config) -> None:
    """Our profile, unless Hypothesis was given one (then its example count is the run's, unless
    --attnspec-examples says)."""
    import dataclasses

    if config.getoption("hypothesis_profile", None) and not config.getoption("attnspec_examples", None):
        from hypothesis import settings
        run = config.stash[RUN]
        config.stash[RUN] = dataclasses.replace(
            run, options=dataclasses.replace(run.options, examples=settings.default.max_examples))
    else:
        profiles.load(config.stash[RUN].profile)


def pytest_report_header(config):
    run = config.stash.get(RUN, None)
    if not config.stash.get(IN_SUITE, False) or run is None:
        return None
    o = run.options
    workers = config.stash.get(WORKERS, 0)
    spread = [f"attnspec: the backends spread over {workers} pytest-xdist workers, a CPU each "
              f"({cores.WORKERS_ENV}=1 or -n 0: one process)"] if workers else []
    return [f"attnspec: profile {run.profile} ({o.examples} drawn problems a property); seed {o.seed} "
            f"({run.seed_from}; again: --hypothesis-seed={o.seed}); reproducers in {results.shown_path(run.repro_dir)}",
            *spread]


# ---- targets ------------------------------------------------------------------------------------

def import_paths(spec: str) -> tuple:
    """Folders a fresh interpreter needs on sys.path to resolve `spec`: for a package.module:attr
    outside site-packages, the folder holding its top package."""
    import site
    import sysconfig

    module_name = spec.partition(":")[0] if ":" in spec else ""
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if not file:
        return ()
    root = os.path.dirname(os.path.abspath(file))
    if os.path.basename(file).startswith("__init__."):
        root = os.path.dirname(root)
    for _ in range(module_name.count(".")):
        root = os.path.dirname(root)
    installed = {os.path.abspath(p) for p in [*site.getsitepackages(), site.getusersitepackages(),
                                               *sysconfig.get_paths().values()] if p}
    return () if root in installed else (root,)


def make_targets(spec: str, rule: str = "attnspec") -> list:
    """One Target per dtype the backend declares and the error budget covers."""
    from attnspec.backends import registry
    from attnspec.properties.target import Session, Target
    from attnspec.specs.problem import DTYPE_NAMES

    backend = registry.resolve(spec)
    session = Session(backend, spec, import_paths(spec))
    return [Target(session, d, rule=rule) for d in DTYPE_NAMES if d in backend.capabilities.dtypes]


def _targets(config, names) -> list:
    """Per backend, its Targets; resolved once per run."""
    from attnspec.backends import registry

    cache = config.stash[TARGETS]
    key = tuple(dict.fromkeys(names))
    if key not in cache:
        out = []
        for name in key:
            try:
                out.append(make_targets(name, config.stash[RUN].options.rule))
            except registry.BackendSelectionError as e:
                raise pytest.UsageError(f"--backend: {e}") from None
        cache[key] = out
    return cache[key]


def is_property(fn) -> bool:
    """attnspec's own property tests (also where `install` put them), never a user's."""
    code = getattr(fn, "__code__", None)
    return code is not None and os.path.dirname(os.path.abspath(code.co_filename)) == options.PACKAGE_DIR


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
        per_backend = _targets(metafunc.config, options.backend_names(metafunc.config))
    flat = [t for ts in per_backend for t in ts]
    # xdist_group: under `--dist loadgroup` a backend's tests in one dtype share a worker, and with them
    # the programs compiled for that dtype (JAX, flex: a program per shape and dtype)
    metafunc.parametrize("target", [pytest.param(t, id=t.id, marks=pytest.mark.xdist_group(t.id)) for t in flat])


def _target_of(item):
    from attnspec.properties.target import Target

    found = getattr(getattr(item, "callspec", None), "params", {}).get("target")
    return found if isinstance(found, Target) else None  # pytest's NOTSET placeholder, or a user's own


def pytest_collection_modifyitems(session, config, items):
    """Each suite test names its backend, property and dtype in its reports; under pytest-xdist's
    loadgroup the longest backends (as the last run recorded them) first."""
    for item in items:
        target = _target_of(item)
        if target is not None:
            item.user_properties.append((results.TEST_KEY, dict(
                backend=target.name, property=item.originalname.removeprefix("test_"), dtype=target.dtype)))
    if config.getoption("dist", "no") == "loadgroup":  # the suite's spread, or the user's own
        cores.longest_first(items, _target_of, cores.recorded_seconds(str(config.invocation_params.dir)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    target = _target_of(item)
    if target is None:
        return
    if not target.session.declared:  # the report's conventions table: what it declares, once per process
        target.session.declared = True
        item.user_properties.append((results.DECLARED_KEY, target.backend.conventions()))
    ok, why = target.backend.availability()
    if not ok:
        pytest.skip(f"{target.name} unavailable: {why}")
    from attnspec.backends.base import Unsupported
    try:
        target.backend.check_supported(target.dtype, "forward_backward" if item.get_closest_marker("needs_gradients")
                                       else "forward")
    except Unsupported as e:
        pytest.skip(str(e))


@pytest.fixture
def attnspec_run(request):
    """Runs a property on the test's target (properties/outcomes.py), inside this test:
    ``attnspec_run(prop, target)``."""
    return functools.partial(run_in_test, request)


def run_in_test(request, prop, target) -> None:
    from attnspec.properties.outcomes import run_property

    reason = skip_reason(prop, target)
    if reason:
        pytest.skip(reason)
    config = request.config
    run, active = config.stash[RUN], contextlib.nullcontext()
    installed = getattr(request.module, INSTALLED, None)
    if installed and not config.stash[IN_SUITE]:  # in a user's own suite (install)
        run = options.for_installed(config, run, len(installed))
        active = profiles.active(run.profile)  # the suite's settings around its tests only
    try:
        with active:
            run_property(request.node, run, prop, target)
    finally:  # a contradicted or declared answer is a row too
        for row in target.answers:
            request.node.user_properties.append((results.SEMANTICS_KEY, row))


def skip_reason(prop, target) -> str:
    from attnspec.specs.fields import FEATURE_TEXT

    if "masks" in prop.needs and not target.caps.masks:
        return f"{target.name} takes no boolean mask"
    if "causal" in prop.needs and not target.caps.causal:
        return f"{target.name} has no causal mode"
    if "layouts" in prop.needs and not set(target.caps.layouts) - {"contiguous"}:
        return f"{target.name} declares no layout but contiguous (Capabilities.layouts)"
    missing = [f for f in prop.requires if not target.supports(f)]
    if missing:
        return f"{target.name} does not support {', '.join(FEATURE_TEXT[f] for f in missing)} natively"
    if prop.grid is None:
        from attnspec.properties.draws import drawable_kinds

        drawn = prop.constraints(target)
        if not drawable_kinds(target, drawn.kinds, drawn.allow_empty_rows, drawn.avoid):
            return f"{target.name} takes none of the mask kinds it draws ({', '.join(drawn.kinds)})"
    return ""
