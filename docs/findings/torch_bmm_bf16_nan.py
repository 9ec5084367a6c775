"""PyTorch (CPU): torch.bmm in bfloat16 lets a NaN in one row of its left operand reach the row before.

Batch 3, (31 x 7) @ (7 x 7), NaN in row 16: row 15 of the product is NaN too (float16, float32, a
batch of 1 or 2, or 24 rows: no leak).  Each output row depends only on its own input row.
"""
from _common import need, verdict

torch = need("torch")

q = torch.ones(3, 31, 7, dtype=torch.bfloat16)
q[:, 16] = float("nan")
out = torch.bmm(q, torch.ones(3, 7, 7, dtype=torch.bfloat16))
verdict(bool(torch.isnan(out[:, 15]).any()), f"torch {torch.__version__}: row 15 NaN: "
        f"{bool(torch.isnan(out[:, 15]).any())}, row 14 NaN: {bool(torch.isnan(out[:, 14]).any())}")
