"""OpenVINO (CPU plugin): ScaledDotProductAttention with no key (Lk = 0) returns the earlier call's output.

With no key every row sees nothing; the op's softmax over nothing would be NaN (what it gives a
fully masked row).  Instead the output buffer is left as the earlier call on the same infer
request wrote it: bit for bit that call's output.  Two requests, each with a different earlier
call, show it follows the earlier call; the control, a fresh request with no earlier call, gives
whatever was in memory (so the match is not a coincidence of values).
"""
from _common import need, verdict

ov = need("openvino")
import numpy as np  # noqa: E402
from openvino import opset13 as ops  # noqa: E402

core = ov.Core()
params = [ops.parameter(ov.PartialShape([-1] * 4), ov.Type.f32, name=n) for n in ("q", "k", "v")]
model = ov.Model([ops.scaled_dot_product_attention(*params, causal=False)], params, "sdpa")
compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
rng = np.random.default_rng(0)
q = rng.standard_normal((1, 2, 3, 4)).astype("float32")
empty = np.zeros((1, 2, 0, 4), dtype="float32")


def lk0_after(earlier):
    """The Lk = 0 call's output on a new request, after `earlier` (Lk = 3) ran on it, and that call's output."""
    request = compiled.create_infer_request()
    request.infer(earlier)
    before = request.get_output_tensor(0).data.copy()
    request.infer([q, empty, empty])
    return request.get_output_tensor(0).data.copy(), before


runs = [lk0_after([rng.standard_normal((1, 2, 3, 4)).astype("float32") for _ in range(3)]) for _ in range(2)]
stale = [out.shape == before.shape and np.array_equal(out, before) for out, before in runs]
fresh = compiled.create_infer_request()
fresh.infer([q, empty, empty])
control = fresh.get_output_tensor(0).data.copy()
verdict(all(stale) and not np.array_equal(runs[0][0], runs[1][0]),
        f"openvino {ov.__version__}: Lk = 0 gave the earlier call's output bit for bit, after 2 different "
        f"earlier calls ({stale}); {runs[0][0].ravel()[:3].tolist()} ...; a fresh request gave "
        f"{control.ravel()[:3].tolist()} ... (expected NaN)")
