"""layout_independence has teeth: a kernel that reads strided inputs as contiguous is rejected."""
from __future__ import annotations

from attnspec.properties.runner import run_suite


def test_a_kernel_that_ignores_strides_is_rejected_and_numpy_views_pass():
    result = run_suite(["tests.plugins.strided:AssumesContiguous", "numpy-naive"], extra_args=["-k", "layout"],
                       timeout=600)
    status = {(r["backend"], r["dtype"]): r["status"] for r in result.conformance}
    assert {status[("assumes-contiguous", d)] for d in ("float32", "float64")} == {"failed"}, result.output[-2000:]
    assert {s for (b, _), s in status.items() if b == "numpy-naive"} == {"passed"}, result.output[-2000:]
