"""Importing `backends` loads no framework; a backend loads its own framework only.

Each check runs in a fresh interpreter (the test process has torch and jax loaded already).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts a python/pytest process: the fast loop (-m "not slow") leaves the module out

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("torch", "jax", "jaxlib", "pandas", "matplotlib")


def _loaded_after(code: str) -> set:
    script = code + f"\nimport json, sys; print(json.dumps(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_listing_and_resolving_every_builtin_loads_no_framework():
    code = ("import backends, backends.base, backends.registry as r\n"
            "names = r.builtin_names()\n"
            "assert 'torch-math' in names and 'jax-dpa' in names\n"
            "backends_ = [r.resolve(n) for n in names]\n"
            "rows = [(b.name, b.capabilities, b.semantics) for b in backends_]\n")
    assert _loaded_after(code) == set()


def test_torch_backend_loads_torch_only():
    pytest.importorskip("torch")
    code = ("import numpy as np, backends.registry as r\n"
            "b = r.resolve('torch-math')\n"
            "assert b.availability()[0]\n"
            "b.forward(np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 2)))\n")
    assert _loaded_after(code) == {"torch"}


def test_jax_backend_loads_jax_only():
    pytest.importorskip("jax")
    code = ("import numpy as np, backends.registry as r\n"
            "b = r.resolve('jax-dpa')\n"
            "b.forward(np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 3)), dtype='float32')\n")
    assert _loaded_after(code) == {"jax", "jaxlib"}


def test_numpy_backends_and_cli_listing_import_nothing_more():
    code = ("import numpy as np, backends.registry as r\n"
            "for n in ('numpy-naive', 'numpy-tiled'):\n"
            "    r.resolve(n).backward(np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 2)), np.ones((2, 2)))\n"
            "import attnspec.commands.backends_cmd\n")
    assert _loaded_after(code) == set()


def test_reports_and_the_command_load_no_framework_on_import():
    assert _loaded_after("import reports, reports.build, reports.inputs, reports.writer, attnspec.cli") == set()


def test_optimized_code_never_loads_the_reference():
    """A backend validates its inputs with specs.problem; the measuring stick stays out of it."""
    code = ("import sys, numpy as np\n"
            "from backends.registry import resolve\n"
            "b = resolve('numpy-tiled'); q = np.ones((2, 3, 4))\n"
            "b.forward(q, q, q); b.backward(q, q, q, q)\n"
            "assert 'attnspec.specs.reference' not in sys.modules, sorted(m for m in sys.modules if 'specs' in m)\n")
    assert _loaded_after(code) == set()
