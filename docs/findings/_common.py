"""What every reproducer here shares: exit statuses and the reference it compares with (NumPy only).

Exit 0: the finding reproduces (it says what it saw); 1: it does not any more (the library
changed: update docs/findings.md); 77: the library, or the device it needs, is missing here;
2: the script itself failed (an uncaught exception: a traceback, never read as a verdict).
"""
import os
import sys
import traceback

import numpy as np

REPRODUCED, GONE, MISSING, CRASHED = 0, 1, 77, 2


def _crash(kind, value, tb):
    # Python exits 1 after an uncaught exception, which would read as GONE: a crash is no verdict
    traceback.print_exception(kind, value, tb)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(CRASHED)


sys.excepthook = _crash


def need(module: str):
    """Import `module`, or exit 77 when `module` itself (not something it imports) is not installed."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        if e.name not in (module, top):
            raise  # the library is there but broken (a dependency of it is missing): a crash, not a skip
        print(f"SKIPPED: {module} is not installed here ({type(e).__name__}: {e})")
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
