"""What every reproducer here shares: exit statuses and the reference it compares with (NumPy only).

Exit 0: the finding reproduces (it says what it saw); 1: it does not any more (the library
changed: update docs/findings.md); 77: the library, or the device it needs, is missing here.
"""
import sys

import numpy as np

REPRODUCED, GONE, MISSING = 0, 1, 77


def need(module: str):
    """Import `module` or exit 77 saying it is missing."""
    import importlib
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure means: cannot run here
        print(f"SKIPPED: {module} is not importable here ({type(e).__name__}: {e})")
        sys.exit(MISSING)


def attention(q, k, v, scale=None, mask=None):
    """softmax(scale * q k^T) v in float64, q (..., H, Lq, E), k and v (..., H, Lk, .); mask True = visible."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def verdict(reproduced: bool, what: str) -> None:
    print(("REPRODUCED: " if reproduced else "NOT REPRODUCED (update docs/findings.md): ") + what)
    sys.exit(REPRODUCED if reproduced else GONE)
