"""OpenVINO (CPU plugin): a dynamic-shape SDPA model computing in bfloat16 answers wrongly after a
call with head size 1 (intermittent: NaN or wrong rows in some runs).

One compiled model serves every shape, as a deployment keeps it; after an E = 1 call, a later
E = 16 call on the same infer request is compared with a float64 reference (bfloat16 tolerance).
Two controls that must come out right: the same E = 16 call on a new bfloat16 model with no
E = 1 call before it, and the float32 kernel (INFERENCE_PRECISION_HINT f32) after an E = 1 call.
Each tried 20 times.
"""
from _common import attention, need, verdict

ov = need("openvino")
import numpy as np  # noqa: E402
from openvino import opset13 as ops  # noqa: E402

TRIES = 20


def wrong(hint: str, rng, head_size_1_first: bool = True) -> bool:
    params = [ops.parameter(ov.PartialShape([-1] * 4), ov.Type.f32, name=n) for n in ("q", "k", "v")]
    model = ov.Model([ops.scaled_dot_product_attention(*params, causal=False)], params, "sdpa")
    request = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint}).create_infer_request()
    e1 = [rng.standard_normal((1, 1, L, 1)).astype("float32") for L in (1, 2, 2)]
    if head_size_1_first:
        request.infer(e1)
    q, k, v = (rng.standard_normal((1, 1, L, 16)).astype("float32") for L in (1, 2, 2))
    request.infer([q, k, v])
    out = request.get_output_tensor(0).data.copy()
    return not np.allclose(out, attention(q, k, v), atol=0.05)  # bfloat16's tolerance


core = ov.Core()
if "bf16" not in str(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")).lower():
    print("SKIPPED: this CPU has no bfloat16 kernel for OpenVINO")
    raise SystemExit(77)
rng = np.random.default_rng(8)
bf16 = sum(wrong("bf16", rng) for _ in range(TRIES))
alone = sum(wrong("bf16", rng, head_size_1_first=False) for _ in range(TRIES))
f32 = sum(wrong("f32", rng) for _ in range(TRIES))
verdict(bf16 > 0 and alone == 0 and f32 == 0, f"openvino {ov.__version__}: after an E = 1 call, {bf16}/{TRIES} "
        f"bfloat16 answers wrong; with no E = 1 call before, {alone}/{TRIES}; float32 after an E = 1 call, "
        f"{f32}/{TRIES}")
