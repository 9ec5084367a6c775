"""MLX and OpenVINO take attention sinks (issue 31), as their installed versions do (measured: MLX 0.32.4,
OpenVINO 2026.4; backends/mlx_backends.py and backends/openvino_backends.py say how): the adapters declare
them and pass them, the output meets the reference with them, and the library facts the adapters work
around stay true - a test here fails the day a library changes them.  The sinks family itself runs on
them in `pytest properties --backend mlx-sdpa` (and the openvino ones)."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from attnspec.backends import registry
from attnspec.specs import error_budget
from tests._helpers import judged_dtype
from tests.plugins.cases import available

_BACKENDS = {name: registry.resolve(name) for name in ("mlx-sdpa", "openvino-sdpa-f32", "openvino-sdpa")}


def _problem():
    """(q, k, v (B, H, L, E) on a grid exact in float16, a mask hiding every key from query 1, sinks)."""
    rng = np.random.default_rng(31)
    q, k, v = (np.round(rng.standard_normal((2, 3, L, 8)) * 8) / 8 for L in (4, 6, 6))  # (B, H, L, E)
    mask = np.ones((4, 6), dtype=bool)  # (Lq, Lk)
    mask[1] = False
    return q, k, v, mask, np.array([0.5, 2.0, -1.0])  # sinks (Hq,)


@pytest.mark.parametrize("name", list(_BACKENDS))
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_the_sinks_reach_the_library_and_meet_the_reference(name, dtype):
    backend = available(_BACKENDS, name)
    assert "sinks" in backend.capabilities.features
    q, k, v, mask, sinks = _problem()
    out = backend.forward(q, k, v, mask=mask, dtype=dtype, sinks=sinks)  # (B, H, Lq, Ev)
    rows = np.ones(out.shape[:-1], dtype=bool)  # (B, H, Lq)
    rows[..., 1] = False  # the empty row: below, exactly
    # judged at the precision the backend computes in: openvino-sdpa's is the plugin's default, bfloat16 on
    # a CPU with bfloat16 kernels (declared as its effective_precision at load)
    judged = judged_dtype(backend, dtype)
    verdict = error_budget.check_forward(out, q, k, v, mask, False, None, judged, rows=rows, sinks=sinks)
    assert verdict, verdict.message
    assert np.all(out[..., 1, :] == 0)  # a row that sees nothing with a finite sink: 0 (the sink's value)
    plain = backend.forward(q, k, v, mask=mask, dtype=dtype)  # without sinks: not the answer with them
    assert not error_budget.check_forward(plain, q, k, v, mask, False, None, judged, rows=rows, sinks=sinks)


def test_mlx_refuses_sinks_wider_than_its_16_bit_inputs():
    """Why the adapter rounds the sinks to the input dtype: MLX 0.32 refuses float32 sinks with float16 q."""
    available(_BACKENDS, "mlx-sdpa")
    import mlx.core as mx
    q = mx.zeros((1, 2, 3, 8), dtype=mx.float16)
    with pytest.raises(ValueError, match="sinks must promote to output type"):
        mx.fast.scaled_dot_product_attention(q, q, q, scale=0.5, sinks=mx.zeros((2,), dtype=mx.float32))


def test_openvinos_python_helper_has_no_sink_input_and_the_op_takes_rank_four():
    """Why the adapter builds the op through NodeFactory with a (1, Hq, 1, 1) sink: opset13's helper stops
    at `scale`, and a rank-1 (Hq,) sink is refused by the op's shape inference."""
    available(_BACKENDS, "openvino-sdpa-f32")
    import openvino as ov
    from openvino import opset13
    from openvino.utils.node_factory import NodeFactory
    assert "sink" not in inspect.signature(opset13.scaled_dot_product_attention).parameters
    q = opset13.parameter([1, 2, 3, 8], ov.Type.f32)
    args = [q.output(0)] * 3 + [opset13.constant(np.float32(0)).output(0), opset13.constant(np.float32(0.5)).output(0)]
    with pytest.raises(RuntimeError, match="sink_rank_correctness"):
        NodeFactory("opset13").create("ScaledDotProductAttention", args + [opset13.constant(np.zeros(2, np.float32))
                                                                           .output(0)], {"causal": False})
