"""The suite in a kernel author's own repository and CI, run from folders outside the checkout.

attnspec is installed (its pytest11 entry point ``attnspec = attnspec.properties.plugin``); a
user's project - a plain-function plug-in with declarations, NOT installed - lives in a temporary
folder.  Checked: ``pytest --pyargs attnspec.properties --backend mypkg.attn:sdpa`` works there,
with ``python -m pytest`` and with the plain ``pytest`` command, even beside the user's own
``properties`` and ``benchmarks`` packages; `install` runs the suite inside the user's own tests;
the plugin stays inert in an unrelated suite (its own --backend option, its own ``target``
fixture, its own Hypothesis profile); the user's -n, --dist, -p and --hypothesis-seed are never
rewritten; a failure prints one block with a runnable reproducer; the suite's counts agree with
pytest's closing line; a few named backends get the deep profile unless a profile is asked for.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import tomllib

pytest_plugins = ["pytester"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTEST = os.path.join(os.path.dirname(sys.executable), "pytest")
if not os.path.exists(PYTEST):
    PYTEST = shutil.which("pytest") or PYTEST

ATTN = '''
"""A user's attention: a correct plain function with declarations, and two others."""
import numpy as np
from attnspec.backends import declare


@declare(dtypes=("float64", "float32"), fully_masked="zeros", causal_alignment="top_left")
def sdpa(query, key, value, attn_mask=None, is_causal=False, scale=None):
    scale = 1.0 / np.sqrt(query.shape[-1]) if scale is None else scale
    s = (query @ np.swapaxes(key, -1, -2)) * query.dtype.type(scale)  # (..., Lq, Lk)
    vis = np.ones(s.shape[-2:], dtype=bool) if attn_mask is None else attn_mask  # (..., Lq, Lk)
    if is_causal:
        vis = vis & np.tri(*s.shape[-2:], dtype=bool)  # (..., Lq, Lk)
    s = np.where(vis, s, -np.inf)  # (..., Lq, Lk)
    e = np.exp(s - np.nan_to_num(s.max(-1, keepdims=True, initial=-np.inf), neginf=0))  # (..., Lq, Lk)
    total = e.sum(-1, keepdims=True)  # (..., Lq, 1)
    return (e / np.where(total == 0, 1, total)) @ value  # (..., Lq, Ev)


def declines_masks(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """A library without masks says so: a skip with its reason, never a failure."""
    from attnspec.backends.base import Unsupported
    if attn_mask is not None:
        raise Unsupported("this library takes no attn_mask")
    return sdpa(query, key, value, attn_mask, is_causal, scale)


@declare(dtypes=("float64",))
def off_by_one(query, key, value, attn_mask=None, is_causal=False, scale=None):
    return sdpa(query, key, value, attn_mask, is_causal, scale) + 1  # (..., Lq, Ev)


@declare(dtypes=("float64",))
def off_by_one_when_large(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """Off by one from 12 query-key pairs on: which drawn problem fails first depends on the draws."""
    out = sdpa(query, key, value, attn_mask, is_causal, scale)  # (..., Lq, Ev)
    return out + 1 if query.shape[-2] * key.shape[-2] >= 12 else out
'''

SLOW = '''
import time
from attnspec.backends import declare
from mypkg.attn import sdpa


@declare(dtypes=("float64",), fully_masked="zeros", causal_alignment="top_left")
def slow(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """A quarter of a second a call: slower than Hypothesis' default deadline (200 ms)."""
    time.sleep(0.25)
    return sdpa(query, key, value, attn_mask, is_causal, scale)
'''

UNRELATED_CONFTEST = '''
import pytest
from hypothesis import settings

settings.register_profile("ci", max_examples=7)
settings.load_profile("ci")


def pytest_addoption(parser):
    parser.addoption("--backend", default="cpu")


@pytest.fixture
def target():
    return "mine"
'''

UNRELATED_TESTS = '''
from hypothesis import given, settings, strategies as st


def test_option_and_fixture_are_mine(request, target):
    assert request.config.getoption("backend") == "gpu"
    assert target == "mine"
    assert request.config.pluginmanager.has_plugin("attnspec")  # loaded, and inert


@given(st.integers())
def test_hypothesis_settings_are_mine(x):
    assert settings.default.max_examples == 7
'''

INSTALLED_TESTS = '''
from {source} import install

install(globals(), "mypkg.attn:sdpa", families=("output", "semantics"))


def test_my_own():
    assert True
'''

USER_HYPOTHESIS_TEST = '''
import datetime

from hypothesis import given, settings, strategies as st


@given(st.integers())
def test_hypothesis_keeps_its_defaults(x):  # beside an installed suite: attnspec's profile did not leak
    # Hypothesis' own profile: "default", or "ci" where it detects a CI (CI=true: no deadline there)
    assert settings.get_current_profile_name() in ("default", "ci")
    assert settings.default.max_examples == 100
    assert settings.default.deadline in (datetime.timedelta(milliseconds=200), None)
'''

OPTION_PROBE_CONFTEST = '''
import json

import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """What the run's options are once every plugin has configured it."""
    if hasattr(config, "workerinput"):
        return
    o = config.option
    seen = dict(numprocesses=getattr(o, "numprocesses", None), dist=getattr(o, "dist", None),
                plugins=list(getattr(o, "plugins", None) or []), hypothesis_seed=getattr(o, "hypothesis_seed", None))
    with open("options.json", "w") as f:
        json.dump(seen, f, default=str)
'''

USER_PLUGIN = '''
def pytest_configure(config):
    config.addinivalue_line("markers", "mine: a marker of the user's own plugin")
'''


def _project(tmp_path, files: dict, name="project"):
    root = tmp_path / name
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _user_project(tmp_path, extra=None, name="project"):
    return _project(tmp_path, {"mypkg/__init__.py": "", "mypkg/attn.py": ATTN, **(extra or {})}, name)


def _env(**extra) -> dict:
    """The user's shell: no PYTHONPATH (the plug-in is not installed; nothing of the checkout's)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ATTNSPEC_", "HYPOTHESIS_", "PYTEST_")) and k != "PYTHONPATH"}
    return dict(env, **extra)


def _pytest(args, cwd, env, command=None) -> subprocess.CompletedProcess:
    command = command or [sys.executable, "-m", "pytest"]
    return subprocess.run([*command, "-p", "no:cacheprovider", *args], cwd=str(cwd), env=env, capture_output=True,
                          text=True, timeout=600)


WORDS = r"(passed|failed|skipped|errors?|recorded|xfailed|deviation)"


def _closing_counts(output: str) -> dict:
    """pytest's closing line, e.g. '1 failed, 3 passed, 2 recorded in 1.2s' -> {status: n}."""
    line = [x for x in output.strip().splitlines() if re.search(r"\d+ " + WORDS, x)][-1]
    counts = {w: int(n) for n, w in re.findall(r"(\d+) " + WORDS, line.split(" in ")[0])}
    if "errors" in counts:
        counts["error"] = counts.pop("errors")
    if "xfailed" in counts:
        counts["deviation"] = counts.pop("xfailed")
    return counts


def _suite_counts(output: str) -> dict:
    """The suite's own total: the 'all ...' line of its per-backend summary."""
    line = next(x for x in output.splitlines() if re.match(r"all +\d", x))
    return {w: int(n) for n, w in re.findall(r"(\d+) " + WORDS, line)}


def test_pyproject_registers_the_pytest_plugin():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        entry_points = tomllib.load(f)["project"]["entry-points"]
    assert entry_points["pytest11"] == {"attnspec": "attnspec.properties.plugin"}
    from importlib.metadata import entry_points as installed
    assert [e.value for e in installed(group="pytest11") if e.name == "attnspec"] == ["attnspec.properties.plugin"]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["python -m pytest", "pytest"])
def test_the_suite_runs_from_any_folder_with_a_plugin_not_installed_and_counts_as_pytest_does(tmp_path, command):
    project = _user_project(tmp_path)
    runner = [sys.executable, "-m", "pytest"] if command == "python -m pytest" else [PYTEST]
    proc = _pytest(["--pyargs", "attnspec.properties", "--backend", "mypkg.attn:sdpa,mypkg.attn:declines_masks",
                    "--attnspec-json", "out.json", "-k",
                    "test_matches_reference or fully_masked or nan_in_unmasked or output_dtype"],
                   project, _env(ATTNSPEC_PROFILE="dev"), runner)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "attnspec: profile dev (6 drawn problems a property)" in proc.stdout
    rows = json.loads((project / "out.json").read_text())["conformance"]
    status = {(r["backend"].split(":")[1], r["property"], r["dtype"]): r["status"] for r in rows}
    assert status[("sdpa", "fully_masked_rows", "float32")] == "passed"       # declared zeros: judged
    assert status[("sdpa", "nan_in_unmasked_query", "float32")] == "recorded"  # nothing to declare: recorded
    assert status[("sdpa", "matches_reference", "float64")] == "passed"
    # the decline: drawn problems with a mask are redrawn; a question asked with a mask is answered "declined"
    assert status[("declines_masks", "matches_reference", "float64")] == "passed"
    assert status[("declines_masks", "fully_masked_rows", "float64")] == "recorded"
    answers = json.loads((project / "out.json").read_text())["semantics"]
    assert {(a["dtype"], a["observed"]) for a in answers if a["backend"].endswith("declines_masks")
            and a["question"] == "fully_masked"} == {("float64", "declined"), ("float32", "declined")}
    assert _closing_counts(proc.stdout) == _suite_counts(proc.stdout)
    assert _closing_counts(proc.stdout)["recorded"] == 6  # nan_in_unmasked_query x 4, the declines x 2
    assert len(rows) == sum(_closing_counts(proc.stdout).values())


@pytest.mark.slow
def test_a_failure_is_one_block_with_a_reproducer_that_runs_in_a_fresh_process(tmp_path):
    project = _user_project(tmp_path)
    args = ["--pyargs", "attnspec.properties", "--backend", "mypkg.attn:off_by_one", "-k", "test_matches_reference"]
    proc = _pytest(args, project, _env(ATTNSPEC_PROFILE="dev"))
    assert proc.returncode == 1, proc.stdout[-3000:]
    failures = proc.stdout.split("= FAILURES =")[1].split("attnspec: per backend")[0]
    assert "matches_reference failed on backend 'mypkg.attn:off_by_one' at float64" in failures
    for part in ("where: ", "how much: ", "problem: Case(", "reproducer: python .attnspec/repro/"):
        assert part in failures, part
    assert "Traceback" not in failures and "\nE " not in failures and "def test_" not in failures
    assert len(failures.splitlines()) < 20, failures
    assert _closing_counts(proc.stdout) == _suite_counts(proc.stdout) == {"failed": 1}
    rel = re.search(r"reproducer: python (\S+)", failures).group(1)
    path = project / rel
    assert path.is_file() and str(path).startswith(str(project / ".attnspec" / "repro"))  # where pytest started
    run = subprocess.run([sys.executable, str(path)], cwd=str(tmp_path), env=_env(), capture_output=True,
                         text=True, timeout=120)  # from another folder: the file sets up its import path
    assert run.returncode == 1, run.stdout + run.stderr
    lines = failures.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("matches_reference failed on backend"))
    verdict = lines[start + 1:next(i for i, x in enumerate(lines) if x.startswith("  problem: ")) + 1]
    assert run.stdout.splitlines()[0] == ("matches_reference FAILED on backend 'mypkg.attn:off_by_one' at float64 "
                                          "(the problem alone, in a fresh process)")
    assert run.stdout.splitlines()[1:1 + len(verdict)] == verdict and "how much: 1 " in "\n".join(verdict)
    long = _pytest(args + ["--attnspec-tb=long"], project, _env(ATTNSPEC_PROFILE="dev"))
    assert "\nE " in long.stdout.split("= FAILURES =")[1]  # pytest's own traceback, on request


@pytest.mark.slow
def test_a_user_folder_with_its_own_properties_and_benchmarks_packages(tmp_path):
    own = '"""The user\'s own package of this name."""\nMINE = True\n'
    project = _user_project(tmp_path, {
        "properties/__init__.py": own, "benchmarks/__init__.py": own,
        "tests/test_own.py": "import benchmarks\nimport properties\n\n\ndef test_my_packages_are_mine():\n"
                             "    assert properties.MINE and benchmarks.MINE\n",
        "tests/test_conformance.py": INSTALLED_TESTS.format(source="attnspec.properties")})
    suite = _pytest(["--pyargs", "attnspec.properties", "--backend", "mypkg.attn:sdpa", "-k",
                     "test_matches_reference or fully_masked_rows", "--attnspec-json", "out.json"], project,
                    _env(ATTNSPEC_PROFILE="dev"))
    assert suite.returncode == 0, suite.stdout[-3000:] + suite.stderr[-2000:]
    rows = json.loads((project / "out.json").read_text())["conformance"]
    assert {(r["property"], r["status"]) for r in rows} == {("matches_reference", "passed"),
                                                             ("fully_masked_rows", "passed")} and len(rows) == 4
    own_tests = _pytest(["tests", "-k", "mine or matches_reference"], project, _env(ATTNSPEC_PROFILE="dev"))
    assert own_tests.returncode == 0, own_tests.stdout[-3000:] + own_tests.stderr[-2000:]
    assert _closing_counts(own_tests.stdout)["passed"] == 3  # their own test; the installed suite's two dtypes


def test_the_plugin_is_inert_in_an_unrelated_suite(pytester, monkeypatch):
    """In this process (pytester): the plugin loaded by its entry point beside a suite that has its
    own --backend option, its own `target` fixture and its own Hypothesis profile touches none of them."""
    from hypothesis import settings

    pytester.makeconftest(UNRELATED_CONFTEST)
    pytester.makepyfile(test_mine=UNRELATED_TESTS)
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "ci")
    monkeypatch.setenv("ATTNSPEC_JSON", "attnspec.json")
    previous = settings.get_current_profile_name()
    try:
        # in this process attnspec is imported already: pytest's warning that it cannot rewrite its
        # asserts names it, and is not the plugin speaking
        result = pytester.runpytest_inprocess("--backend", "gpu", "-p", "no:cacheprovider",
                                              "-W", "ignore::pytest.PytestAssertRewriteWarning")
    finally:  # the user's conftest loads its profile in this process: ours comes back
        settings.load_profile(previous)
    result.assert_outcomes(passed=2)
    spoken = [line for line in result.outlines if "attnspec" in line and not line.startswith("plugins:")]
    assert not spoken, spoken  # no header line, summary or file of ours (pytest's plugin list names it)
    assert not (pytester.path / ".attnspec").exists() and not (pytester.path / "attnspec.json").exists()


def test_an_empty_backend_name_is_a_usage_error_not_the_default_backends(pytester):
    """`--backend "$UNSET"` names no backend: the run stops and says so, rather than checking every built-in."""
    result = pytester.runpytest_inprocess("--pyargs", "attnspec.properties", "--backend", "", "--co",
                                          "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.outlines[-20:]
    assert "--backend: empty backend name ''" in "\n".join(result.errlines), result.errlines
    named = pytester.runpytest_inprocess("--pyargs", "attnspec.properties", "--backend", "", "--backend",
                                         "numpy-naive", "--co", "-q", "-p", "no:cacheprovider",
                                         "-W", "ignore::pytest.PytestAssertRewriteWarning")
    assert named.ret == pytest.ExitCode.OK and "numpy-naive" in "\n".join(named.outlines)  # an empty beside a name


def test_attnspec_seed_seeds_a_run_in_any_profile_and_a_bad_one_stops_it(pytester, monkeypatch):
    """ATTNSPEC_SEED was read by the ci profile only: a deep run said "seed 0 (the default seed)" and drew
    the default problems.  --hypothesis-seed still wins over it."""
    args = ("--pyargs", "attnspec.properties", "--backend", "numpy-naive", "--co", "-p", "no:cacheprovider",
            "-W", "ignore::pytest.PytestAssertRewriteWarning")
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    monkeypatch.setenv("ATTNSPEC_PROFILE", "deep")
    monkeypatch.setenv("ATTNSPEC_SEED", "77")
    seeded = "\n".join(pytester.runpytest_inprocess(*args).outlines)
    assert "profile deep" in seeded and "seed 77 (ATTNSPEC_SEED" in seeded, seeded[:2000]
    given = "\n".join(pytester.runpytest_inprocess(*args, "--hypothesis-seed=5").outlines)
    assert "seed 5 (--hypothesis-seed" in given, given[:2000]
    monkeypatch.setenv("ATTNSPEC_SEED", "x")
    bad = pytester.runpytest_inprocess(*args)
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "ATTNSPEC_SEED must be an integer; got 'x'" in "\n".join(bad.errlines), bad.errlines


# (properties/__init__.py's docstring shows `from attnspec import install` too: add "attnspec" here once
# attnspec/__init__.py exports it)
@pytest.mark.slow
@pytest.mark.parametrize("source", ["attnspec.properties"])
def test_install_runs_the_suite_inside_a_users_own_tests(tmp_path, source):
    project = _user_project(tmp_path, {"tests/test_attn_conformance.py": INSTALLED_TESTS.format(source=source),
                                       "tests/test_user_hypothesis.py": USER_HYPOTHESIS_TEST})
    proc = _pytest(["tests", "-q", "--attnspec-json", "out.json",
                    "-k", "matches_reference or fully_masked or my_own or keeps_its_defaults"],
                   project, _env(ATTNSPEC_PROFILE="dev"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = json.loads((project / "out.json").read_text())["conformance"]
    assert {(r["backend"], r["property"], r["dtype"], r["status"]) for r in rows} == {
        ("mypkg.attn:sdpa", p, d, "passed") for p in ("matches_reference", "fully_masked_rows")
        for d in ("float64", "float32")}
    assert _closing_counts(proc.stdout) == {"passed": 6}  # four of the suite's, the user's own two


@pytest.mark.slow
def test_an_installed_suite_explores_under_the_suites_settings_not_the_users_profile(tmp_path):
    """A user's Hypothesis profile (the default: a 200 ms deadline, health checks) is theirs; the
    installed suite's tests explore with the suite's own settings (no deadline: a per-call limit
    guards hangs), so a backend slower than 200 ms a call is judged, not failed by Hypothesis."""
    project = _user_project(tmp_path, {
        "mypkg/slow.py": SLOW,
        "tests/test_conformance.py": "from attnspec.properties import install\n\n"
                                     "install(globals(), 'mypkg.slow:slow', families=('output',))\n",
        "tests/test_user_hypothesis.py": USER_HYPOTHESIS_TEST})
    proc = _pytest(["tests", "-q", "--attnspec-json", "out.json", "--attnspec-examples=2", "-k",
                    "default_scale or keeps_its_defaults"], project, _env())
    rows = json.loads((project / "out.json").read_text())["conformance"]
    assert [(r["property"], r["status"]) for r in rows] == [("default_scale", "passed")], proc.stdout[-3000:]
    assert proc.returncode == 0 and "DeadlineExceeded" not in proc.stdout, proc.stdout[-3000:]
    assert _closing_counts(proc.stdout) == {"passed": 2}


def test_install_refuses_what_it_cannot_use():
    from attnspec.properties import install

    with pytest.raises(ValueError, match="globals"):
        install({}, "numpy-naive")
    with pytest.raises(ValueError, match="at least one backend"):
        install({"__name__": "m"})
    with pytest.raises(ValueError, match="families must be"):
        install({"__name__": "m"}, "numpy-naive", families=("no_such_family",))
    with pytest.raises(ValueError, match="families must be"):
        install({"__name__": "m"}, "numpy-naive", families="output")
    with pytest.raises(ValueError, match="already defines test_matches_reference"):
        install({"__name__": "m", "test_matches_reference": lambda: None}, "numpy-naive", families=("output",))
    with pytest.raises(ValueError, match="non-empty"):
        install({"__name__": "m"}, " ")
    namespace = {"__name__": "m"}
    added = install(namespace, "numpy-naive", "tests.plugins.fake_plugin:sdpa", families=("output",))
    assert added == ["test_matches_reference", "test_default_scale", "test_explicit_scale_honoured",
                     "test_convex_combination"]
    assert namespace["__attnspec_backends__"] == ("numpy-naive", "tests.plugins.fake_plugin:sdpa")


def test_install_names_an_object_as_the_reproducer_will_import_it():
    from attnspec.properties import _spec_of
    from tests.plugins import fake_plugin

    assert _spec_of(fake_plugin.sdpa) == "tests.plugins.fake_plugin:sdpa"
    assert _spec_of(fake_plugin.plugin_backend) == "tests.plugins.fake_plugin:plugin_backend"
    assert _spec_of(fake_plugin.PluginBackend) == "tests.plugins.fake_plugin:PluginBackend"
    with pytest.raises(ValueError, match="cannot name"):
        _spec_of(lambda q, k, v: q)


@pytest.mark.slow
def test_a_users_layout_plugins_and_seed_are_never_rewritten(tmp_path):
    project = _user_project(tmp_path, {"conftest.py": OPTION_PROBE_CONFTEST, "userplug.py": USER_PLUGIN})
    two = ["--pyargs", "attnspec.properties", "--backend", "mypkg.attn:sdpa", "--backend", "mypkg.attn:off_by_one",
           "-k", "test_default_scale"]
    env = _env(ATTNSPEC_PROFILE="dev", ATTNSPEC_WORKERS="2")

    def seen(*args):
        proc = _pytest([*two, *args], project, env)
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]  # off_by_one fails
        return json.loads((project / "options.json").read_text()), proc.stdout

    options, _ = seen("-n", "1", "-p", "userplug")
    assert options["numprocesses"] == 1 and "userplug" in options["plugins"]
    options, _ = seen("--dist", "loadfile")
    assert (options["numprocesses"], options["dist"]) == (None, "loadfile")
    # nothing chosen: the suite spreads over the cores, and the seed is still the user's, read as given
    options, out = seen("--hypothesis-seed=12345")
    assert options["hypothesis_seed"] == "12345" and (options["numprocesses"], options["dist"]) == (2, "loadgroup")
    assert "seed 12345 (--hypothesis-seed; again: --hypothesis-seed=12345)" in out


@pytest.mark.slow
def test_the_same_command_gives_the_same_verdicts_and_its_printed_seed_replays_them(tmp_path):
    """No seed given: the run is seeded all the same and says by what (header, JSON); run twice with the
    example database cleared and no cache it gives identical verdicts, and the printed seed given back
    to --hypothesis-seed replays the same failures on the same problems."""
    project = _user_project(tmp_path)
    args = ["--pyargs", "attnspec.properties", "--backend", "mypkg.attn:off_by_one_when_large", "-k",
            "test_default_scale or test_explicit_scale", "--attnspec-no-shrink", "--attnspec-json", "out.json"]

    def run(*extra):
        shutil.rmtree(project / ".hypothesis", ignore_errors=True)
        proc = _pytest([*args, *extra], project, _env(ATTNSPEC_PROFILE="dev"))
        assert proc.returncode == 1, proc.stdout[-3000:]  # off by one on the larger problems
        data = json.loads((project / "out.json").read_text())
        verdicts = {(r["property"], r["dtype"]): (r["status"], r["message"]) for r in data["conformance"]}
        return proc.stdout, data["run"], verdicts

    out, first, verdicts = run()
    assert any(status == "failed" for status, _ in verdicts.values()), verdicts
    assert f"seed {first['seed']} (" in out and f"--hypothesis-seed={first['seed']}" in out
    _, again, same = run()
    assert (again, same) == (first, verdicts)
    _, _, replayed = run(f"--hypothesis-seed={first['seed']}")
    assert replayed == verdicts


@pytest.mark.slow
def test_a_seed_given_to_hypothesis_replays_the_run(tmp_path):
    """Each test seeds from --hypothesis-seed and its id: the same seed, the same (first) failing problem."""
    project = _user_project(tmp_path)
    args = ["--pyargs", "attnspec.properties", "--backend", "mypkg.attn:off_by_one_when_large", "-k",
            "test_default_scale", "--attnspec-no-shrink", "--attnspec-json", "out.json", "-n", "0"]

    def problem(seed):
        shutil.rmtree(project / ".hypothesis", ignore_errors=True)  # no example database to replay from
        proc = _pytest([*args, f"--hypothesis-seed={seed}"], project, _env(ATTNSPEC_PROFILE="dev"))
        assert proc.returncode == 1, proc.stdout[-3000:]
        (row,) = json.loads((project / "out.json").read_text())["conformance"]
        return re.search(r"problem: (Case\(.*\))", row["message"]).group(1)

    first = problem(7)
    assert problem(7) == first
    assert len({first, problem(8), problem(9)}) > 1  # other seeds, other draws


@pytest.mark.slow
def test_a_few_named_backends_get_the_deep_profile_unless_one_is_asked_for(tmp_path):
    project = _user_project(tmp_path)

    def header(*names, **env):
        proc = _pytest(["--pyargs", "attnspec.properties", *[a for n in names for a in ("--backend", n)],
                        "--collect-only", "-n", "0"], project, _env(**env))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return next(x for x in proc.stdout.splitlines() if x.startswith("attnspec: profile"))

    assert header("mypkg.attn:sdpa").startswith("attnspec: profile deep (100 drawn problems a property)")
    assert header("mypkg.attn:sdpa", "numpy-naive", "numpy-tiled").startswith("attnspec: profile deep (100 ")
    assert header("mypkg.attn:sdpa", ATTNSPEC_PROFILE="dev").startswith(
        "attnspec: profile dev (6 drawn problems a property)")
    four = header("mypkg.attn:sdpa", "mypkg.attn:off_by_one", "numpy-naive", "numpy-tiled")
    assert four.startswith("attnspec: profile dev (6 ")
    assert header("mypkg.attn:sdpa", ATTNSPEC_PROFILE="thorough").startswith("attnspec: profile thorough (250 ")


def test_profiles_are_chosen_by_name_and_restored_after_use():
    from hypothesis import settings

    from attnspec.properties import profiles

    assert profiles.EXAMPLES == {"dev": 6, "ci": 6, "deep": 100, "thorough": 250}
    assert profiles.choose(0, {}) == "dev"
    assert profiles.choose(1, {}) == "deep" and profiles.choose(3, {}) == "deep" and profiles.choose(4, {}) == "dev"
    assert profiles.choose(1, {"HYPOTHESIS_PROFILE": "ci"}) == "ci"
    assert profiles.choose(1, {"HYPOTHESIS_PROFILE": "theirs"}) == "deep"  # a user's own profile is not ours
    assert profiles.choose(0, {"ATTNSPEC_PROFILE": "thorough", "HYPOTHESIS_PROFILE": "ci"}) == "thorough"
    with pytest.raises(ValueError, match="ATTNSPEC_PROFILE must be one of dev, ci, deep, thorough; got 'fast'"):
        profiles.choose(0, {"ATTNSPEC_PROFILE": "fast"})
    before = settings.get_current_profile_name()
    with profiles.active("thorough"):
        assert settings.get_current_profile_name() == "attnspec-thorough"
        assert settings.default.max_examples == profiles.EXAMPLES["thorough"] and settings.default.deadline is None
    assert settings.get_current_profile_name() == before
    assert profiles.ci_seed(ROOT, {"ATTNSPEC_SEED": "42"}) == (42, "ATTNSPEC_SEED")
    with pytest.raises(ValueError, match="ATTNSPEC_SEED must be an integer"):
        profiles.ci_seed(ROOT, {"ATTNSPEC_SEED": "x"})


def readme_example() -> str:
    """README's plain-function example, exactly as printed (the first python block under 'A plain function')."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    after = text.split("**A plain function**", 1)[1]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


@pytest.mark.slow
def test_readmes_example_passes_the_default_suite_from_its_own_folder(tmp_path):
    """Copied out of README: `pytest --pyargs attnspec.properties --backend mypkg.attn:sdpa` in the
    folder holding mypkg/ (not installed), the default profile: deep for one named backend (>= 100
    drawn problems a property), and nothing fails - Lk = 0, where its row max raises, is the
    empty-sizes question answered 'error', recorded (nothing declared)."""
    source = readme_example()
    assert "# mypkg/attn.py" in source and "def sdpa(" in source
    project = _project(tmp_path, {"mypkg/__init__.py": "", "mypkg/attn.py": source})
    proc = _pytest(["--pyargs", "attnspec.properties", "--backend", "mypkg.attn:sdpa", "--attnspec-json", "out.json"],
                   project, _env(), [PYTEST])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "attnspec: profile deep (100 drawn problems a property)" in proc.stdout
    assert "attnspec: problems tried per property and dtype" in proc.stdout  # a deep run says how deep
    assert "PytestUnknownMarkWarning" not in proc.stdout  # the checkout's marks stay in the checkout's runs
    data = json.loads((project / "out.json").read_text())
    rows = data["conformance"]
    assert rows and not [r for r in rows if r["status"] in ("failed", "error", "crashed", "timed_out")]
    drawn = [r for r in rows if r["status"] == "passed" and r["property"] in ("matches_reference", "rows_sum_to_one",
                                                                              "convex_combination")]
    assert drawn and all(r["examples"] >= 100 for r in drawn), [(r["property"], r["examples"]) for r in drawn]
    empty = {a["dtype"]: a["observed"] for a in data["semantics"] if a["question"] == "empty_sizes"}
    assert set(empty.values()) == {"error"}, empty
