"""Which problems are measured: one grid per question, three sizes (ATTNSPEC_BENCH_GRID).

- quick:   a smoke test (`attnspec run --quick`): a few sizes, float32, forward.
- default: what `asv run` and `attnspec run` measure (how long it takes: README, docs/measurements.md).
- full:    every axis at every value (`attnspec run --full`, or ATTNSPEC_BENCH_GRID=full asv run).

asv parameters are a product, so each question has its own class with its own axes (16-bit
dtypes: TimeHalfPrecision, forward at T in {4, 256, 2048} by default; grouped KV heads:
TimeGroupedDecode).  The one corner the default leaves out (16-bit decode with Lq = 4) is
skipped in setup before anything loads (asv shows n/a): one fork of asv's server each.
Single axes can be overridden with comma lists: ATTNSPEC_BENCH_T, _E, _OPS, _DTYPES (float32
sweep), _HALF (16-bit dtypes), _LK, _HKV (decode), _MASKS, _SAMPLES; ATTNSPEC_BENCH_BUDGET sets the
per-backend budget in seconds (0: none).  An axis given explicitly
is measured in full.
"""
from __future__ import annotations

import os

GRIDS = ("quick", "default", "full")
GRID = os.environ.get("ATTNSPEC_BENCH_GRID") or "default"
if GRID not in GRIDS:
    raise ValueError(f"ATTNSPEC_BENCH_GRID={GRID!r}: expected one of {', '.join(GRIDS)}")

BATCH, HEADS = 1, 8  # B x Hq fixed, so sizes are the only axes; recorded as one-value params
E_DEFAULT = 64
SIXTEEN_BIT = ("bfloat16", "float16")
SIXTEEN_BIT_T = (4, 256, 2048)  # the default grid's 16-bit sizes: overhead, mid, large
# Default grid: a 16-bit call predicted (from T = 256) to take longer than this is skipped with
# the prediction as the reason (NumPy's float16 matmul has no BLAS kernel; its time at T = 2048:
# docs/measurements.md).
MAX_CALL_SECONDS = {"quick": 2.0, "default": 5.0, "full": None}[GRID]
# Default grid: what one backend may spend on calls in one run - first calls (compilation,
# lazy initialisation; never timed) and asv's samples.  asv runs every combination in a fresh
# process, so a backend that compiles per shape pays it every time (torch.compile'd flex
# attention).  Past the budget its remaining combinations are left out, with the reason.  The
# budget is set so the eager built-ins measure the whole default grid and torch.compile'd flex
# gets the T sweep and part of decode (what each spent: docs/measurements.md).
BACKEND_BUDGET_SECONDS = {"quick": 20.0, "default": 60.0, "full": None}[GRID]
_budget = os.environ.get("ATTNSPEC_BENCH_BUDGET")  # seconds; 0: no budget (every combination of the grid)
if _budget:
    try:
        _seconds = float(_budget)
    except ValueError:
        _seconds = float("nan")
    if not _seconds >= 0:
        raise ValueError(f"ATTNSPEC_BENCH_BUDGET={_budget!r}: expected seconds per backend (0: no budget)")
    BACKEND_BUDGET_SECONDS = _seconds or None


def _ints(var: str, default) -> list[int]:
    """A comma-separated list of positive ints from `var` (to shrink or widen an axis)."""
    text = os.environ.get(var)
    if not text:
        return list(default)
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{var}={text!r}: expected comma-separated integers, e.g. 4,64") from None
    if not values or min(values) < 1:
        raise ValueError(f"{var}={text!r}: expected positive integers")
    return values


def _words(var: str, default, allowed=None) -> list[str]:
    text = os.environ.get(var)
    if not text:
        return list(default)
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in values if allowed is not None and v not in allowed]
    if not values or bad:
        raise ValueError(f"{var}={text!r}: expected comma-separated values from {', '.join(allowed)}")
    return values


# Samples per combination (each at least SAMPLE_SECONDS of calls).  asv calls a change
# significant only with enough of them: `asv continuous` records samples and runs a
# Mann-Whitney test at p < 0.002, which 6 against 6 can pass and 5 against 5 cannot; `asv
# compare` of plain `asv run` results needs finite 99 % intervals of the median: 8 samples
# (or run with --record-samples).  `attnspec run` asks for 3: a report, not a regression check.
SAMPLES = _ints("ATTNSPEC_BENCH_SAMPLES", [1 if GRID == "quick" else 6])[0]


def explicit(var: str) -> bool:
    return bool(os.environ.get(var))


_Q, _D, _F = GRID == "quick", GRID == "default", GRID == "full"
OP_NAMES = ("forward", "forward_backward")
DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64")

# -- the T sweep (prefill / self-attention, Lq = Lk = T) --------------------------------------
# default: T = 4 (a call's fixed cost: time is flat below ~64) up to 2048, the fit range T >= 256
# at three sizes; T = 16 told nothing T = 4 and 64 do not (the full grid keeps every power of two)
T_VALUES = _ints("ATTNSPEC_BENCH_T", [64, 256, 1024] if _Q else [4, 64, 256, 1024, 2048] if _D
                 else [2 ** i for i in range(2, 12)])
E_VALUES = _ints("ATTNSPEC_BENCH_E", [E_DEFAULT] if not _F else [16, 64, 128])
OPS = _words("ATTNSPEC_BENCH_OPS", ["forward"] if _Q else OP_NAMES, OP_NAMES)
DTYPES = _words("ATTNSPEC_BENCH_DTYPES", ["float32"], DTYPE_NAMES)  # TimeAttention
# 16-bit (TimeHalfPrecision): forward at T = 4, 256, 2048 by default, the whole sweep in full
HALF_DTYPES = _words("ATTNSPEC_BENCH_HALF", SIXTEEN_BIT, SIXTEEN_BIT)
HALF_T = T_VALUES if _F or explicit("ATTNSPEC_BENCH_T") else [256] if _Q else list(SIXTEEN_BIT_T)
HALF_OPS = OPS if _F or explicit("ATTNSPEC_BENCH_OPS") else ["forward"]
MEMORY_T = [t for t in T_VALUES if t >= 256] if _D and not explicit("ATTNSPEC_BENCH_T") else T_VALUES  # the fit range
MEMORY_OPS = ["forward"] if not _F and not explicit("ATTNSPEC_BENCH_OPS") else OPS
MEMORY_E = [E_DEFAULT] if E_DEFAULT in E_VALUES else E_VALUES[:1]  # extra memory hardly depends on E

# -- decode: Lq new queries against a KV cache of Lk, Hq = 8 query heads over Hkv KV heads ------
# TimeDecode: Hkv = Hq, every dtype (16-bit for one token only, by default); TimeGroupedDecode:
# Hkv < Hq, one token against the largest cache by default (what the report's table compares)
DECODE_LQ = [1] if _Q else [1, 4]
DECODE_LK = _ints("ATTNSPEC_BENCH_LK", [2048] if _Q else [256, 2048] if _D else [256, 1024, 2048, 8192, 32768])
DECODE_DTYPES = ["float32"] if _Q else ["float32", *HALF_DTYPES]
GROUPED_HKV = [h for h in _ints("ATTNSPEC_BENCH_HKV", [1] if _Q else [2, 1] if not _F else [4, 2, 1]) if h != HEADS]
GROUPED_LQ = DECODE_LQ if _F else [1]
GROUPED_LK = DECODE_LK if _F or explicit("ATTNSPEC_BENCH_LK") else DECODE_LK[-1:]
GROUPED_DTYPES = DECODE_DTYPES if _F else ["float32"]

# -- serving formats (bench_serving.py): a decode batch over a paged cache, a mixed varlen prefill ------
PAGED_LK = _ints("ATTNSPEC_BENCH_LK", [2048] if not _F else [256, 2048, 8192])  # every cache full
PAGE_SIZES = [16, 128] if not _F else [1, 16, 128, 256]  # vLLM's default block, and a large one
SERVING_BATCH = 4  # sequences: a packed batch of lengths T, T/2, T/4, T/8 (specs.cost.prefill_lengths)
VARLEN_T = _ints("ATTNSPEC_BENCH_T", [1024] if _Q else [256, 1024] if _D else [256, 1024, 2048])  # the longest

# -- causal and sliding-window prefill (Lq = Lk = T): rates over the visible pairs only -------
MASK_NAMES = ("causal", "window-256")  # window-N: each query sees itself and N - 1 keys before it
MASKS = _words("ATTNSPEC_BENCH_MASKS", MASK_NAMES)  # or window-N of your N: below
if any(m != "causal" and not (m.startswith("window-") and m[7:].isdigit() and int(m[7:]) > 0) for m in MASKS):
    raise ValueError(f"ATTNSPEC_BENCH_MASKS={os.environ.get('ATTNSPEC_BENCH_MASKS')!r}: expected causal or window-N")
MASK_T = _ints("ATTNSPEC_BENCH_T", [1024] if _Q else [256, 1024, 2048] if _D else [256, 1024, 2048, 4096])
MASK_OPS = OPS if _F or explicit("ATTNSPEC_BENCH_OPS") else ["forward"]
MASK_DTYPES = DTYPES + HALF_DTYPES if _F and not explicit("ATTNSPEC_BENCH_DTYPES") else DTYPES


def left_out(kind: str, Lq=None, dtype=None, T=None, mask=None) -> str | None:
    """Why the current grid leaves this combination out (None: it is measured)."""
    if _D and kind == "decode" and dtype in SIXTEEN_BIT and Lq != 1:  # 16-bit decode: one token
        return "left out of the default grid (ATTNSPEC_BENCH_GRID=full measures it)"
    if not _F and kind == "masked" and mask.startswith("window-") and T is not None and int(mask[7:]) >= T:
        # a window of N keys at T <= N hides exactly what causal hides: the same problem, timed as causal
        return f"{mask} at T={T} is the causal problem (timed as causal); ATTNSPEC_BENCH_GRID=full measures it"
    return None
