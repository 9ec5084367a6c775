"""OpenVINO (CPU plugin): with a -inf sink, the bfloat16 SDPA kernel carries the NaN of a row that
sees no key into the row before it.

A boolean mask hides one query row whole (Lq = Lk = 100, E = 64); that row's softmax is over
nothing and -inf (the sink), so it is NaN, as the op gives any fully masked row.  Every other row
sees all keys and must be finite.  Each of the 100 rows is hidden in turn on one compiled model
(the sink, a Constant: the CPU plugin takes no other) and the finite rows are counted.  Two
controls that must keep every other row finite: the same calls on the float32 kernel
(INFERENCE_PRECISION_HINT f32), and on the bfloat16 kernel without the sink input.
"""
from _common import need, verdict

ov = need("openvino")
import numpy as np  # noqa: E402
from openvino import opset13 as ops  # noqa: E402
from openvino.utils.node_factory import NodeFactory  # noqa: E402

L, E = 100, 64
core = ov.Core()


def leaks(hint: str, sink: bool) -> dict:
    """{hidden row: the other rows that came back NaN}, hiding each row in turn."""
    params = [ops.parameter(ov.PartialShape([-1] * 4), ov.Type.f32, name=n) for n in ("q", "k", "v")]
    params.append(ops.parameter(ov.PartialShape([-1] * 4), ov.Type.boolean, name="mask"))
    args = [p.output(0) for p in params] + [ops.constant(np.float32(E ** -0.5)).output(0)]
    if sink:  # the op's sixth input, which opset13's Python helper does not take: one logit per head
        args.append(ops.constant(np.full((1, 1, 1, 1), -np.inf, np.float32)).output(0))
    sdpa = NodeFactory("opset13").create("ScaledDotProductAttention", args, {"causal": False})
    request = core.compile_model(ov.Model([sdpa], params, "sdpa"), "CPU",
                                 {"INFERENCE_PRECISION_HINT": hint}).create_infer_request()
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, L, E)).astype("float32") for _ in range(3))
    found = {}
    for hidden in range(L):
        mask = np.ones((1, 1, L, L), dtype=bool)  # (B, H, Lq, Lk): True = visible
        mask[0, 0, hidden] = False
        request.infer([q, k, v, mask])
        nan_rows = np.flatnonzero(np.isnan(request.get_output_tensor(0).data[0, 0]).any(-1))  # (rows,)
        others = [int(r) for r in nan_rows if r != hidden]
        if others:
            found[hidden] = others
    return found


if "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
    print("SKIPPED: this CPU has no bfloat16 kernel for OpenVINO")
    raise SystemExit(77)
bf16, f32, no_sink = leaks("bf16", sink=True), leaks("f32", sink=True), leaks("bf16", sink=False)
before = all(others == [hidden - 1] for hidden, others in bf16.items())  # the row before, and only it
verdict(len(bf16) > 0 and before and not f32 and not no_sink,
        f"openvino {ov.__version__}: with a -inf sink, hiding one of {L} rows made the row before it NaN "
        f"{len(bf16)} times on the bfloat16 kernel (rows hidden: {sorted(bf16)[:3]}...; every leak the row "
        f"before: {before}); another row NaN on the float32 kernel: {len(f32)} times; on the bfloat16 kernel "
        f"without the sink: {len(no_sink)} times")
