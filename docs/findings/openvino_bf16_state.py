"""OpenVINO (CPU plugin): a dynamic-shape SDPA model computing in bfloat16 answers wrongly after a
call with head size 1 (intermittent: NaN or wrong rows in some runs).

One compiled model serves every shape, as a deployment keeps it; after an E = 1 call, a later
E = 16 call on the same infer request is compared with a float64 reference (bfloat16 tolerance).
The float32 kernel (INFERENCE_PRECISION_HINT f32) is not affected.  Tried 20 times.
"""
from _common import attention, need, verdict

ov = need("openvino")
import numpy as np  # noqa: E402
from openvino import opset13 as ops  # noqa: E402

TRIES = 20


def wrong_after_e1(hint: str, rng) -> bool:
    params = [ops.parameter(ov.PartialShape([-1] * 4), ov.Type.f32, name=n) for n in ("q", "k", "v")]
    model = ov.Model([ops.scaled_dot_product_attention(*params, causal=False)], params, "sdpa")
    request = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint}).create_infer_request()
    request.infer([rng.standard_normal((1, 1, L, 1)).astype("float32") for L in (1, 2, 2)])  # E = 1
    q, k, v = (rng.standard_normal((1, 1, L, 16)).astype("float32") for L in (1, 2, 2))
    request.infer([q, k, v])
    out = request.get_output_tensor(0).data.copy()
    return not np.allclose(out, attention(q, k, v), atol=0.05)  # bfloat16's tolerance


core = ov.Core()
if "bf16" not in str(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")).lower():
    print("SKIPPED: this CPU has no bfloat16 kernel for OpenVINO")
    raise SystemExit(77)
rng = np.random.default_rng(8)
bf16 = sum(wrong_after_e1("bf16", rng) for _ in range(TRIES))
f32 = sum(wrong_after_e1("f32", rng) for _ in range(TRIES))
verdict(bf16 > 0 and f32 == 0, f"openvino {ov.__version__}: after an E = 1 call, {bf16}/{TRIES} bfloat16 answers "
        f"wrong, {f32}/{TRIES} float32 answers wrong")
