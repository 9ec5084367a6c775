"""Rows the loader derives from measured ones (reports/asv_results.py): gflops (specs.cost FLOPs /
time, so rate and time share their samples), kv_gbps (decode), memory_multiple (extra bytes /
B*H*T^2*itemsize), fidelity_ratio_sweep (the sweep's time of the fidelity combination / torch
Timer's).  pandas and NumPy are imported by the functions only."""
from __future__ import annotations

import warnings


def window_of(problem) -> tuple | None:
    """"window-256" -> (255, 0): a sliding window of 256 keys ending at the query's own position."""
    if isinstance(problem, str) and problem.startswith("window-") and problem[7:].isdigit():
        return (int(problem[7:]) - 1, 0)
    return None


def _forward_flops(cost, r) -> float:
    """Useful forward FLOPs of one attention row: only the pairs its mask keeps (specs.cost)."""
    b, h, e = int(r.batch), int(r.heads), int(r.E)
    if r.problem in ("decode", "paged_decode"):  # the Lq new tokens see the cache and each other: bottom-right
        lq, lk = int(r.Lq), int(r.Lk)
        return cost.useful_flops(b, h, lq, lk, e, causal=lq > 1, causal_alignment="bottom_right")
    if r.problem == "varlen_prefill":  # each sequence's causal triangle; nothing between sequences
        return sum(cost.useful_flops(1, h, n, n, e, causal=True) for n in cost.prefill_lengths(int(r.T), b))
    t = int(r.T)
    return cost.useful_flops(b, h, t, t, e, causal=r.problem == "causal", window=window_of(r.problem))


_DECODES = ("decode", "paged_decode")  # problems sized by Lq and Lk (T empty), rated by KV bytes read


def derived_rows(df):
    """gflops, kv_gbps, memory_multiple and fidelity_ratio_sweep, from measured rows and specs.cost."""
    import numpy as np
    import pandas as pd

    try:
        from attnspec.specs import cost
        cost.useful_flops  # noqa: B018 - an older specs without it: the plain counts below
    except (ImportError, AttributeError) as e:  # the cost model is part of the spec; without it, no rates
        warnings.warn(f"specs.cost unavailable ({e}): no gflops or memory_multiple rows", stacklevel=3)
        return pd.DataFrame(columns=df.columns)
    out = []
    sized = df[["batch", "heads", "E"]].notna().all(axis=1) & (df["T"].notna() | df["problem"].isin(_DECODES))
    for r in df[(df["metric"] == "time") & sized].itertuples(index=False):
        flops = _forward_flops(cost, r) * (1 + cost.BACKWARD_FACTOR * (r.op == "forward_backward"))
        out.append(r._asdict() | dict(metric="gflops", value=flops / r.value / 1e9, unit="GFLOP/s",
                                      ci_low=np.nan, ci_high=np.nan))
        if r.problem in _DECODES:  # every key and value is read at least once per step
            kv = cost.kv_bytes(int(r.batch), int(r.kv_heads), int(r.Lk), int(r.E), None, np.dtype(_numpy_dtype(r.dtype)).itemsize)
            out.append(r._asdict() | dict(metric="kv_gbps", value=kv / r.value / 1e9, unit="GB/s",
                                          ci_low=np.nan, ci_high=np.nan))
    for r in df[(df["metric"] == "memory") & sized].itertuples(index=False):
        itemsize = np.dtype(_numpy_dtype(r.dtype)).itemsize
        score_bytes = cost.score_matrix_bytes(int(r.batch), int(r.heads), int(r.T), int(r.T), itemsize)
        out.append(r._asdict() | dict(metric="memory_multiple", value=r.value / score_bytes, unit="x B*H*T^2*itemsize"))
    keys = ["backend", "batch", "heads", "T", "E", "op", "dtype", "machine", "commit", "clock", "grid"]
    timer = df[df["metric"] == "timer_time"]
    if not timer.empty:
        sweep = df[(df["metric"] == "time") & (df["problem"] == "dense")].merge(
            timer[keys + ["value"]], on=keys, suffixes=("", "_timer"))
        for r in sweep.itertuples(index=False):
            out.append({c: getattr(r, c) for c in keys} | dict(metric="fidelity_ratio_sweep", problem="dense",
                                                                 value=r.value / r.value_timer, unit="ratio"))
    return pd.DataFrame(out, columns=df.columns)


def _numpy_dtype(name: str) -> str:
    return "float16" if name == "bfloat16" else name  # same itemsize; NumPy has no bfloat16
