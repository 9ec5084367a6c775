"""OpenVINO (CPU plugin): ScaledDotProductAttention with no key (Lk = 0) returns stale memory.

With no key every row sees nothing; the op's softmax over nothing would be NaN (what it gives a
fully masked row).  Instead the output holds finite values left in its buffer by an earlier call.
"""
from _common import need, verdict

ov = need("openvino")
import numpy as np  # noqa: E402
from openvino import opset13 as ops  # noqa: E402

core = ov.Core()
params = [ops.parameter(ov.PartialShape([-1] * 4), ov.Type.f32, name=n) for n in ("q", "k", "v")]
model = ov.Model([ops.scaled_dot_product_attention(*params, causal=False)], params, "sdpa")
request = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
rng = np.random.default_rng(0)
request.infer([rng.standard_normal((1, 2, 3, 4)).astype("float32") for _ in range(3)])  # an earlier call, Lk = 3
q = rng.standard_normal((1, 2, 3, 4)).astype("float32")
empty = np.zeros((1, 2, 0, 4), dtype="float32")
request.infer([q, empty, empty])
out = request.get_output_tensor(0).data.copy()
verdict(out.shape == (1, 2, 3, 4) and np.isfinite(out).any() and not np.all(out == 0),
        f"openvino {ov.__version__}: Lk = 0 gave {out.ravel()[:4].tolist()} ... (finite, not NaN or zeros)")
