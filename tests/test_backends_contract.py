"""The plug-in contract: built-in names, `package.module:attr`, entry points, the env var,
the errors for what cannot be a backend, and `attnspec backends`.

Fixture plug-ins live in tests/plugins/fake_plugin.py.  Entry points are tested for real:
a `*.dist-info` directory written to a tmp dir on sys.path, which importlib.metadata reads.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from attnspec.backends import registry  # noqa: E402
from attnspec.backends.base import Backend, Unsupported  # noqa: E402
from attnspec.backends.registry import BackendSelectionError, FunctionBackend, resolve, select  # noqa: E402
from attnspec.cli import main  # noqa: E402
from attnspec.specs import error_budget  # noqa: E402
from tests.plugins import fake_plugin  # noqa: E402
from tests.plugins.cases import random_cases  # noqa: E402

PLUGIN = "tests.plugins.fake_plugin"


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    """A distribution registering two backends under the `attnspec.backends` group."""
    dist = tmp_path / "fake_attnspec_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-attnspec-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[attnspec.backends]\n"
        f"fake-plain = {PLUGIN}:sdpa\n"
        f"fake-class = {PLUGIN}:PluginBackend\n"
        "fake-broken = tests.plugins.broken_import:anything\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_builtin_names_resolve_to_backends_named_alike():
    names = registry.builtin_names()
    assert names[:2] == ["numpy-naive", "numpy-tiled"] and len(names) == len(set(names))
    for name in ["numpy-naive", "numpy-tiled", "torch-math", "jax-dpa"]:
        backend = resolve(name)
        assert isinstance(backend, Backend) and backend.name == name


def test_plain_function_is_forward_only_and_declares_nothing():
    backend = resolve(f"{PLUGIN}:sdpa")
    assert isinstance(backend, FunctionBackend) and backend.name == f"{PLUGIN}:sdpa"
    assert backend.semantics.fully_masked is None and backend.semantics.causal_alignment is None
    case = random_cases()[2]  # mask AND causal, explicit scale
    fake_plugin.SEEN_DTYPES.clear()
    for dtype in ("float64", "float32"):
        out = backend.forward(*case.args(), dtype=dtype)
        assert error_budget.check_forward(out, *case.args(), dtype=dtype)
    assert fake_plugin.SEEN_DTYPES == ["float64", "float32"]  # it receives both, converted by the adapter
    with pytest.raises(Unsupported, match="no gradients"):
        backend.backward(*case.args()[:3], case.grad_out, dtype="float64")
    with pytest.raises(Unsupported, match="float16"):
        backend.forward(*case.args(), dtype="float16")


def test_backend_class_object_and_other_parameter_names():
    assert resolve(f"{PLUGIN}:PluginBackend").name == "plugin-backend"
    assert resolve(f"{PLUGIN}:plugin_backend") is fake_plugin.plugin_backend
    case = random_cases()[1]
    out = resolve(f"{PLUGIN}:sdpa_positional").forward(*case.args())
    assert error_budget.check_forward(out, *case.args(), dtype="float64")


@pytest.mark.parametrize("name,says", [
    ("no-such-backend", "unknown backend 'no-such-backend'.*numpy-naive.*package.module:attr"),
    ("tests.plugins.nope:fn", "cannot import module 'tests.plugins.nope'"),
    ("tests.plugins.broken_import:fn", "cannot import module.*attnspec_dependency_that_is_not_installed"),
    (f"{PLUGIN}:missing", "has no attribute 'missing'.*sdpa"),
    (f"{PLUGIN}:not_callable", "int object is neither a Backend nor a function"),
    (f"{PLUGIN}:NotABackend", "class NotABackend is not a subclass of backends.base.Backend"),
    (f"{PLUGIN}:NeedsArgs", r"NeedsArgs\(\) raised TypeError"),
    (f"{PLUGIN}:wrong_signature", r"cannot be called as fn\(query, key, value, attn_mask=None"),
    (":sdpa", "expected package.module:attr"),
    ("", "non-empty string"),
])
def test_bad_names_say_what_was_asked_and_what_exists(name, says):
    with pytest.raises(BackendSelectionError, match=says):
        resolve(name)


def test_entry_points_resolve_and_a_broken_one_is_reported(installed_plugin):
    assert {"fake-plain", "fake-class", "fake-broken"} <= set(registry.entry_points())
    plain = resolve("fake-plain")
    assert isinstance(plain, FunctionBackend) and plain.name == "fake-plain"
    assert resolve("fake-class").name == "plugin-backend"
    with pytest.raises(BackendSelectionError, match="entry point 'tests.plugins.broken_import:anything' failed"):
        resolve("fake-broken")
    with pytest.raises(BackendSelectionError, match="entry points: fake-broken, fake-class, fake-plain"):
        resolve("fake-nothing")


def test_select_and_names_from_env(monkeypatch):
    assert [b.name for b in select()] == registry.builtin_names()
    assert [b.name for b in select(["numpy-tiled", "numpy-naive", "numpy-tiled"])] == ["numpy-tiled", "numpy-naive"]
    assert [b.name for b in select("numpy-naive")] == ["numpy-naive"]
    with pytest.raises(BackendSelectionError, match="unknown backend 'nope'"):
        select(["numpy-naive", "nope"])
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    assert registry.names_from_env() is None
    monkeypatch.setenv(registry.ENV_VAR, f" numpy-naive, {PLUGIN}:sdpa ,,")
    assert registry.names_from_env() == ["numpy-naive", f"{PLUGIN}:sdpa"]
    assert registry.names_from_env({registry.ENV_VAR: " , "}) is None


def test_cli_table_lists_every_builtin_with_availability_and_declarations(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header == ["name", "available", "device", "dtypes", "gradients", "masks", "causal",
                      "fully_masked", "causal_alignment"]
    for name in registry.builtin_names():
        assert any(line.startswith(name + " ") for line in out.splitlines()), name
    line = next(li for li in out.splitlines() if li.startswith("jax-dpa "))
    assert "mean_of_values" in line and "top_left" in line
    assert "jax-dpa: effective precision float32" in out


def test_cli_json_with_plugins_and_entry_points(capsys, installed_plugin):
    assert main(["backends", "--json", "--all", "--backend", f"{PLUGIN}:sdpa", "--backend", "numpy-naive"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    plain = rows[f"{PLUGIN}:sdpa"]
    assert plain["available"] and not plain["gradients"] and plain["fully_masked"] is None
    assert rows["fake-class"]["fully_masked"] == "zeros"
    assert not rows["fake-broken"]["available"] and "failed to load" in rows["fake-broken"]["reason"]
    assert rows["numpy-tiled"]["dtypes"] == ["float16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"]
    assert list(rows).count("numpy-naive") == 1


@pytest.mark.parametrize("name", ["nope", f"{PLUGIN}:not_callable", "tests.plugins.broken_import:x"])
def test_cli_bad_backend_exits_2_with_one_line(capsys, name):
    assert main(["backends", "--backend", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnspec backends: ") and name.split(":")[0] in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_function_backend_sees_numpy_arrays():
    seen = []

    def spy(query, key, value, attn_mask=None, is_causal=False, scale=None):
        seen.append((type(query), type(attn_mask), is_causal, scale))
        return np.zeros(query.shape[:-1] + value.shape[-1:], dtype=query.dtype)

    case = random_cases()[1]
    FunctionBackend(spy, "spy").forward(*case.args(), dtype="float32")
    assert seen == [(np.ndarray, np.ndarray, False, None)]


def test_the_suite_checks_every_builtin_by_default_but_the_opt_in_ones_and_the_zoo():
    """torch.compile'd flex compiles every shape (tens of seconds each): checked only when named; the
    libraries people run (the zoo) and eager flex (PyTorch's unfused fallback, the slowest calls) are
    checked when named and by attnspec run, not by a plain `pytest properties` (its time is the suite's
    budget)."""
    builtins = set(registry.builtin_names())
    assert set(registry.SUITE_OPT_IN) | set(registry.ZOO) | set(registry.PYTEST_WHEN_NAMED) <= builtins
    assert registry.suite_names() == [n for n in registry.builtin_names() if n not in registry.SUITE_OPT_IN
                                      and n not in registry.PYTEST_WHEN_NAMED and n not in registry.ZOO]
    assert "torch-flex-compiled" in registry.SUITE_OPT_IN and "torch-flex" in registry.PYTEST_WHEN_NAMED
    assert {"numpy-naive", "torch-math", "torch-sdpa-cpu", "jax-dpa", "openvino-sdpa"} <= set(registry.suite_names())
    assert {"keras-jax", "flax-linen", "transformers-sdpa", "mlx-sdpa"} <= set(registry.ZOO)
    # a reason a user can act on
    assert all(len(why) > 40 for why in (*registry.SUITE_OPT_IN.values(), *registry.PYTEST_WHEN_NAMED.values()))


@pytest.mark.slow
def test_cli_describes_a_named_backend_alone_importing_nothing_else():
    """`attnspec backends --backend numpy-naive`: that row only, and no other framework loaded
    (JAX's import alone warns about fork on stderr); --all lists every built-in beside it."""
    import subprocess
    import sys

    code = ("import json, sys\nfrom attnspec.cli import main\n"
            "rc = main(['backends', '--json', '--backend', 'numpy-naive'])\n"
            "print(json.dumps(sorted(m for m in ('torch', 'jax', 'onnxruntime', 'openvino', 'keras', 'flax', "
            "'transformers', 'mlx') if m in sys.modules)), file=sys.stderr)\nsys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert [r["name"] for r in json.loads(done.stdout)] == ["numpy-naive"]
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []
    assert main(["backends", "--json", "--all", "--backend", "numpy-naive"]) == 0


def test_every_backend_attribute_the_suite_and_the_benchmarks_read_is_declared_on_backend():
    """The contract is whole: each `backend.X` read in properties/, benchmarks/ and attnspec/ is a
    declared attribute of Backend (so it has a default and a doc), read without a getattr fallback;
    nothing sniffs a backend's module or name for what it is."""
    import ast
    import pathlib
    import re

    from attnspec.backends.base import Backend

    root = pathlib.Path(__file__).resolve().parents[1]
    texts = {p: p.read_text() for d in ("properties", "benchmarks", "attnspec") for p in (root / d).rglob("*.py")}

    def reads_of_backend(tree) -> set:  # backend.X and <anything>.backend.X in code (not in text: a module path)
        return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and (
            isinstance(node.value, ast.Name) and node.value.id == "backend"
            or isinstance(node.value, ast.Attribute) and node.value.attr == "backend")}

    read = set().union(*(reads_of_backend(ast.parse(t)) for t in texts.values()))
    assert {"capabilities", "semantics", "compiles_per_shape"} <= read  # what the walk must find
    undeclared = sorted(n for n in read if not hasattr(Backend, n) and not hasattr(str, n))  # a name held as text
    assert not undeclared, f"read but not declared on Backend: {undeclared}"
    fallbacks = [f"{p.name}: {m}" for p, t in texts.items()
                 for m in re.findall(r"getattr\((?:target\.)?(?:backend|caps|semantics)[.\w]*, \"(\w+)\"", t)
                 if not m.startswith("__")]  # a plug-in given as any object: its module and name
    assert not fallbacks, fallbacks
    target_text = (root / "properties" / "target.py").read_text()
    assert '"jax" in' not in target_text and "__module__" not in target_text
