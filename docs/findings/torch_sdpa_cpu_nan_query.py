"""PyTorch (CPU): scaled_dot_product_attention swallows a NaN in a query row: the row comes back zeros.

NaN in query row 0 makes that row's scores NaN, so its output should be NaN, as the math kernel
(the control: the same call under sdpa_kernel(SDPBackend.MATH)) and every other implementation
give; the CPU default path (the flash kernel) returns zeros for that row, the other rows right.
"""
from _common import attention, need, verdict

torch = need("torch")
import numpy as np  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

rng = np.random.default_rng(0)
q, k, v = (torch.tensor(rng.standard_normal((1, 2, 3, 4)), dtype=torch.float32) for _ in range(3))
q[0, 0, 0, 0] = float("nan")
out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
with sdpa_kernel(SDPBackend.MATH):
    math = torch.nn.functional.scaled_dot_product_attention(q, k, v)
zeros = bool((out[0, 0, 0] == 0).all())
math_nan = bool(torch.isnan(math[0, 0, 0]).all())
others = np.allclose(out.numpy().reshape(6, 4)[1:], attention(q, k, v).reshape(6, 4)[1:], atol=1e-5)
verdict(zeros and math_nan and others, f"torch {torch.__version__}: the default CPU path gives output row 0 = "
        f"{out[0, 0, 0].tolist()} for a NaN query row (zeros: {zeros}); the math kernel gives "
        f"{math[0, 0, 0].tolist()} (NaN: {math_nan}); the other rows right: {others}")
