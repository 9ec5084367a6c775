"""PyTorch (CPU): scaled_dot_product_attention swallows a NaN in a query row.

NaN in query row 0 makes that row's scores NaN, so its output should be NaN (as the math path and
every other implementation give); the CPU default path (the flash kernel) returns a finite row.
"""
from _common import need, verdict

torch = need("torch")
import numpy as np  # noqa: E402

rng = np.random.default_rng(0)
q, k, v = (torch.tensor(rng.standard_normal((1, 2, 3, 4)), dtype=torch.float32) for _ in range(3))
q[0, 0, 0, 0] = float("nan")
out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
verdict(bool(torch.isfinite(out[0, 0, 0]).all()), f"torch {torch.__version__}: output row 0 = "
        f"{out[0, 0, 0].tolist()} for a NaN query row")
