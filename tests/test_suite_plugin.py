"""The suite in a kernel author's own repository and CI, run from folders outside the checkout.

attnspec is "installed" the way a wheel installs it - its packages and a dist-info whose
entry points are read from pyproject.toml - into a temporary site folder; a user's project
(a plain-function plug-in with declarations) lives in another temporary folder.  Checked:
``pytest --pyargs properties --backend ...`` works there; `properties.install` runs the suite
inside the user's own tests; the plugin stays inert in an unrelated suite (its own --backend
option, its own `target` fixture, its own Hypothesis profile); a failure prints one block
with a runnable reproducer; the suite's counts agree with pytest's closing line.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ATTN = '''
"""A user's attention: a correct plain function with declarations, and one with a bug."""
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
    e = np.exp(s - np.nan_to_num(s.max(-1, keepdims=True), neginf=0))  # (..., Lq, Lk)
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
from attnspec.properties import install

install(globals(), "mypkg.attn:sdpa", families=("output", "semantics"))


def test_my_own():
    assert True
'''

USER_HYPOTHESIS_TEST = '''
from hypothesis import given, settings, strategies as st


@given(st.integers())
def test_hypothesis_keeps_its_defaults(x):  # imported after install(): attnspec's profile did not leak
    # Hypothesis' own profile: "default", or "ci" where it detects a CI (CI=true: no deadline there)
    assert settings.get_current_profile_name() in ("default", "ci")
    assert settings.default.max_examples == 100


def test_my_garbage_collector_is_mine():  # runs after the installed suite: it froze nothing of ours
    import gc
    assert gc.get_freeze_count() == 0
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """attnspec as a wheel installs it: its packages, and a dist-info with pyproject's entry points."""
    site = tmp_path_factory.mktemp("site")
    for package in ("specs", "backends", "properties"):
        shutil.copytree(os.path.join(ROOT, package), site / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "test_*.py~"))
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    dist = site / f"attnspec-{project['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: attnspec\nVersion: {project['version']}\n")
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in items.items()) + "\n"
        for group, items in project.get("entry-points", {}).items()))
    return site


def _project(tmp_path, files: dict):
    root = tmp_path / "project"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _env(site, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ATTNSPEC_", "HYPOTHESIS_", "PYTEST_")) and k != "PYTHONPATH"}
    return dict(env, PYTHONPATH=str(site), **extra)


def _pytest(args, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=600)


def _closing_counts(output: str) -> dict:
    """pytest's closing line, e.g. '1 failed, 3 passed, 2 recorded in 1.2s' -> {status: n}."""
    line = [x for x in output.strip().splitlines() if re.search(r"\d+ (passed|failed|skipped|error|recorded)", x)][-1]
    return {w: int(n) for n, w in re.findall(r"(\d+) (passed|failed|skipped|errors?|recorded)", line.split(" in ")[0])}


def _suite_counts(output: str) -> dict:
    """The suite's own total: the 'all ... (as pytest counts them)' line of its summary."""
    line = next(x for x in output.splitlines() if x.startswith("all ") and "as pytest counts them" in x)
    return {w: int(n) for n, w in re.findall(r"(\d+) (passed|failed|skipped|error|recorded)", line)}


def test_pyproject_registers_the_pytest_plugin():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        entry_points = tomllib.load(f)["project"]["entry-points"]
    assert entry_points["pytest11"] == {"attnspec": "attnspec.properties.plugin"}


def test_the_stand_in_install_is_what_python_imports(site, tmp_path):
    code = ("import importlib.metadata as m, properties; print(properties.__file__); "
            "print([e.value for e in m.entry_points(group='pytest11') if e.name == 'attnspec'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=_env(site), capture_output=True,
                         text=True, timeout=120).stdout.splitlines()
    assert out[0].startswith(str(site)) and out[1] == "['attnspec.properties.plugin']", out


def test_the_suite_runs_from_any_folder_and_counts_as_pytest_does(site, tmp_path):
    project = _project(tmp_path, {"mypkg/__init__.py": "", "mypkg/attn.py": ATTN})
    proc = _pytest(["--pyargs", "properties", "--backend", "mypkg.attn:sdpa,mypkg.attn:declines_masks",
                    "--attnspec-json", "out.json", "-k",
                    "test_matches_reference or fully_masked or nan_in_unmasked or output_dtype"],
                   project, _env(site))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "attnspec: profile dev" in proc.stdout
    rows = json.loads((project / "out.json").read_text())["conformance"]
    status = {(r["backend"].split(":")[1], r["property"], r["dtype"]): r["status"] for r in rows}
    assert status[("sdpa", "fully_masked_rows", "float32")] == "passed"       # declared zeros: judged
    assert status[("sdpa", "nan_in_unmasked_query", "float32")] == "recorded"  # nothing to declare: recorded
    assert status[("sdpa", "matches_reference", "float64")] == "passed"
    # the decline: drawn problems with a mask are redrawn; a question that needs one is skipped
    assert status[("declines_masks", "matches_reference", "float64")] == "passed"
    assert status[("declines_masks", "fully_masked_rows", "float64")] == "skipped"
    skip = next(r for r in rows if r["backend"].endswith("declines_masks") and r["property"] == "fully_masked_rows")
    assert "this library takes no attn_mask" in skip["message"]
    assert _closing_counts(proc.stdout) == _suite_counts(proc.stdout)
    assert _closing_counts(proc.stdout)["recorded"] == 4


def test_a_failure_is_one_block_with_a_reproducer_that_runs_in_a_fresh_process(site, tmp_path):
    project = _project(tmp_path, {"mypkg/__init__.py": "", "mypkg/attn.py": ATTN})
    args = ["--pyargs", "properties", "--backend", "mypkg.attn:off_by_one", "-k", "test_matches_reference"]
    proc = _pytest(args, project, _env(site))
    assert proc.returncode == 1, proc.stdout[-3000:]
    failures = proc.stdout.split("= FAILURES =")[1].split("attnspec: per backend")[0]
    assert "matches_reference failed on backend 'mypkg.attn:off_by_one' at float64" in failures
    for part in ("where: ", "how much: ", "problem: Case(", "reproducer: python .attnspec/repro/"):
        assert part in failures, part
    assert "Traceback" not in failures and "\nE " not in failures and "def test_" not in failures
    assert len(failures.splitlines()) < 20, failures
    assert _closing_counts(proc.stdout) == _suite_counts(proc.stdout) == {"failed": 1}
    path = project / re.search(r"reproducer: python (\S+)", failures).group(1)
    run = subprocess.run([sys.executable, str(path)], cwd=str(tmp_path), env=_env(site), capture_output=True,
                         text=True, timeout=120)  # from another folder: the file sets up its import path
    assert run.returncode == 0 and abs(float(run.stdout.split()[-1]) - 1.0) < 1e-9, run.stdout + run.stderr
    long = _pytest(args + ["--attnspec-tb=long"], project, _env(site))
    assert "\nE " in long.stdout.split("= FAILURES =")[1]  # pytest's own traceback, on request


def test_the_plugin_is_inert_in_an_unrelated_suite(site, tmp_path):
    project = _project(tmp_path, {"conftest.py": UNRELATED_CONFTEST, "test_mine.py": UNRELATED_TESTS})
    proc = _pytest(["--backend", "gpu", "-q"], project, _env(site, HYPOTHESIS_PROFILE="ci"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout and "attnspec" not in proc.stdout
    assert not (project / ".attnspec").exists()


def test_install_runs_the_suite_inside_a_users_own_tests(site, tmp_path):
    project = _project(tmp_path, {"mypkg/__init__.py": "", "mypkg/attn.py": ATTN,
                                  "tests/test_attn_conformance.py": INSTALLED_TESTS,
                                  "tests/test_user_hypothesis.py": USER_HYPOTHESIS_TEST})
    proc = _pytest(["tests", "-q", "--attnspec-json", "out.json",
                    "-k", "matches_reference or fully_masked or my_own or keeps_its_defaults or collector_is_mine"],
                   project, _env(site))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = json.loads((project / "out.json").read_text())["conformance"]
    assert {(r["backend"], r["property"], r["dtype"], r["status"]) for r in rows} == {
        ("mypkg.attn:sdpa", p, d, "passed") for p in ("matches_reference", "fully_masked_rows")
        for d in ("float64", "float32")}
    assert "7 passed" in proc.stdout  # four of the suite's, the user's own three


def test_install_refuses_what_it_cannot_use():
    from attnspec.properties import install

    with pytest.raises(ValueError, match="globals"):
        install({}, "numpy-naive")
    with pytest.raises(ValueError, match="at least one backend"):
        install({"__name__": "m"})
    with pytest.raises(ValueError, match="families must be"):
        install({"__name__": "m"}, "numpy-naive", families=("no_such_family",))
    with pytest.raises(ValueError, match="already defines test_matches_reference"):
        install({"__name__": "m", "test_matches_reference": lambda: None}, "numpy-naive", families=("output",))


def test_install_names_an_object_as_the_reproducer_will_import_it():
    from attnspec.properties import _spec_of

    from tests.plugins import fake_plugin
    assert _spec_of(fake_plugin.sdpa) == "tests.plugins.fake_plugin:sdpa"
    assert _spec_of(fake_plugin.plugin_backend) == "tests.plugins.fake_plugin:plugin_backend"
    with pytest.raises(ValueError, match="cannot name"):
        _spec_of(lambda q, k, v: q)


def test_profiles_are_chosen_by_name_and_restored_after_an_install():
    from hypothesis import settings

    from attnspec.properties import profiles
    assert profiles.choose({}) == "dev"
    assert profiles.choose({"HYPOTHESIS_PROFILE": "ci"}) == "ci"
    assert profiles.choose({"HYPOTHESIS_PROFILE": "theirs"}) == "dev"  # a user's own profile is not ours to judge
    assert profiles.choose({"ATTNSPEC_PROFILE": "thorough", "HYPOTHESIS_PROFILE": "ci"}) == "thorough"
    with pytest.raises(ValueError, match="ATTNSPEC_PROFILE must be one of dev, ci, thorough"):
        profiles.choose({"ATTNSPEC_PROFILE": "fast"})
    before = profiles.current()
    with profiles.active("thorough"):
        assert profiles.current() == "attnspec-thorough"
        assert settings.default.max_examples == profiles.EXAMPLES["thorough"]
    assert profiles.current() == before
