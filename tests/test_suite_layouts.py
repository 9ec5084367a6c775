"""layout_independence has teeth: a kernel that reads strided inputs as contiguous is rejected (with a
reproducer that shows it again), NumPy views pass, a backend that declares no other layout is skipped."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from attnspec.properties.runner import run_suite

pytestmark = pytest.mark.slow  # starts a python/pytest process: the fast loop (-m "not slow") leaves the module out

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRIDED = "tests.plugins.strided:AssumesContiguous"
CONTIGUOUS_ONLY = "tests.plugins.fake_plugin:PluginBackend"


def test_a_kernel_that_ignores_strides_is_rejected_and_numpy_views_pass(tmp_path):
    result = run_suite([STRIDED, "numpy-naive", CONTIGUOUS_ONLY], json_path=str(tmp_path / "out.json"),
                       extra_args=["-k", "layout_independence", "-n", "0"], profile="dev", cwd=ROOT, timeout=600)
    rows = {(r["backend"], r["dtype"]): r for r in result.conformance}
    assert {d for b, d in rows if b == "assumes-contiguous"} == {"float32", "float64"}, result.output[-2000:]
    for dtype in ("float32", "float64"):
        row = rows[("assumes-contiguous", dtype)]
        assert row["status"] == "failed", result.output[-2000:]
        assert "contiguous inputs vs the same values in the" in row["message"] and "layout" in row["message"]
        assert row["reproducer"] and row["reproducer"].startswith(str(tmp_path / "out-repro"))
    assert {r["status"] for (b, _), r in rows.items() if b == "numpy-naive"} == {"passed"}, result.output[-2000:]
    assert len([b for b, _ in rows if b == "numpy-naive"]) == 3  # float16, float32, float64
    skipped = [r for (b, _), r in rows.items() if b == "plugin-backend"]
    assert skipped and {r["status"] for r in skipped} == {"skipped"}
    assert all("declares no layout but contiguous" in r["message"] for r in skipped)
    assert result.returncode == 1
    # the reproducer shows the same failure again, alone, from another folder, without PYTHONPATH
    row = rows[("assumes-contiguous", "float64")]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, row["reproducer"]], cwd=str(tmp_path), env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    verdict = row["message"].splitlines()[1]  # the verdict's first line, as the suite printed it
    assert verdict in run.stdout.splitlines(), (verdict, run.stdout)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_a_head_slice_is_a_fused_projections_view_with_nan_heads_beside_it(framework):
    """relayout's head_slice: the same values, the token stride of a wider heads axis, NaN heads on either
    side (a kernel reading a neighbour shows it); the heads axis of a packed (total, H, E) tensor is -2."""
    import numpy as np

    from attnspec.backends.registry import resolve
    backend = resolve("numpy-naive" if framework == "numpy" else "torch-math")
    backend.load()
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float64).reshape(2, 3, 4, 5)  # (B, H, L, E)
    for native in (x, x[0].transpose(1, 0, 2).copy()):  # padded (B, H, L, E), packed (T, H, E): heads axis 1
        given = native if framework == "numpy" else backend.to_native(native, "float64")
        view = backend.relayout(given, "head_slice")
        host = (lambda a: a) if framework == "numpy" else backend.from_native  # noqa: E731
        assert np.array_equal(np.asarray(host(view)), native)
        stride = view.strides if framework == "numpy" else tuple(s * 8 for s in view.stride())
        assert stride[1] == 8 * int(np.prod(native.shape[2:]))  # the heads stay adjacent
        assert stride[0] == 8 * (native.shape[1] + 2) * int(np.prod(native.shape[2:]))  # two heads wider
        wide = np.asarray(host(view.base if framework == "numpy" else view._base))
        assert np.isnan(wide).sum() == 2 * native.size // native.shape[1]
