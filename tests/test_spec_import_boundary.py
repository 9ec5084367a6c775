"""Importing specs must load no framework (the reference must stay NumPy-only)."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # starts a python/pytest process: the fast loop (-m "not slow") leaves the module out

FRAMEWORKS = ("torch", "jax", "pandas", "tensorflow", "matplotlib")


def test_import_specs_loads_no_framework():
    code = ("import sys, specs, specs.problem, specs.reference, specs.invariants, specs.error_budget, "
            "specs.cost, specs.worked_examples; specs.worked_examples.check(); "
            f"print([m for m in {FRAMEWORKS!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"frameworks loaded by specs: {out.stdout}"
