"""PyTorch (CPU): torch.bmm in bfloat16 lets a NaN in one row of its left operand reach the row before.

Batch 3, (31 x 7) @ (7 x 7), NaN in row 16: row 15 of the product is NaN too, row 14 is not.  Each
output row depends only on its own input row; the controls are the same product in float32 and
the same bfloat16 product at an inner size of 16 (7 -> 16), where row 15 stays finite (float16, a
batch of 1 or 2, or 24 rows: no leak either; inner sizes 7, 31, 33 leak, 16, 32, 48, 64 do not).  It depends on the
CPU's kernels (oneDNN's bfloat16 path): it reproduces on CPUs with AMX/AVX-512 bfloat16 and not on
every CPU; a "NOT REPRODUCED" here may mean this CPU takes another path, not that it was fixed.
"""
from _common import need, verdict

torch = need("torch")


def leaks(dtype, inner: int = 7) -> tuple:
    """Whether rows 15 and 14 of the product are NaN, with NaN in row 16 of the left operand."""
    q = torch.ones(3, 31, inner, dtype=dtype)
    q[:, 16] = float("nan")
    out = torch.bmm(q, torch.ones(3, inner, 7, dtype=dtype))
    return bool(torch.isnan(out[:, 15]).any()), bool(torch.isnan(out[:, 14]).any())


bf16, f32, whole = leaks(torch.bfloat16), leaks(torch.float32), leaks(torch.bfloat16, inner=16)
verdict(bf16 == (True, False) and f32 == whole == (False, False), f"torch {torch.__version__}: bfloat16 row 15 NaN: "
        f"{bf16[0]}, row 14 NaN: {bf16[1]}; float32 row 15 NaN: {f32[0]}; bfloat16 at inner size 16, row 15 NaN: {whole[0]}")
