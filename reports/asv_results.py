"""asv results (format v2) as one tidy table, and the exponents of time and memory against T.

A results folder holds one subfolder per machine (machine.json beside one JSON file per commit
and environment) and benchmarks.json (parameter names). In a results file every benchmark is a
row of `result_columns`: `result` lists one value per parameter combination in
itertools.product order, `params` holds each axis's values as `repr` strings, a skipped or
failed combination is None or NaN, confidence bounds may be +-inf.

Rows the benchmarks measure: time [s], memory [bytes], peak_gflops, threads, fidelity_ratio,
timer_time [s]; derived (reports/asv_derived.py): gflops (specs.cost FLOPs / time, so rate and time share their
samples), memory_multiple (extra bytes / B*H*T^2*itemsize), fidelity_ratio_sweep (the sweep's
time of the fidelity combination / torch Timer's). pandas is imported by the functions only.
"""
from __future__ import annotations

import ast
import itertools
import json
import math
import os

COLUMNS = ["backend", "op", "batch", "heads", "T", "E", "dtype", "metric", "value", "unit", "machine", "commit"]
# asv's 99% interval for time rows (NaN when unknown: inf); the clock of time rows ("process" =
# CPU time, "wall"; None for results recorded before the clock parameter); the problem: "dense"
# (the T sweep, Lq = Lk = T), "causal", "window" (masked, Lq = Lk = T), "decode" (Lq queries
# against a cache of Lk; T is empty), None for machine rows; kv_heads, Lq, Lk: its sizes.
# grid: the benchmark grid the row was measured on (quick, default, full: benchmarks/_grid.py), as
# attnspec run records it beside the results (inputs.GRID_FILE); None for results asv ran by hand.
# page_size: a paged decode's (problem "paged_decode"); "varlen_prefill" is a packed causal batch of
# specs.cost.prefill_lengths(T, batch), T its longest sequence.
EXTRA_COLUMNS = ["ci_low", "ci_high", "clock", "problem", "kv_heads", "Lq", "Lk", "grid", "page_size"]

# Class.method of a benchmark -> (metric, unit, fixed columns, problem).  Matched on the last two
# parts of asv's name, so attnspec's benchmarks re-exported from a plug-in's own asv suite
# (module bench_attnspec, say) read the same.  Anything else keeps its method name as metric.
KNOWN = {
    "TimeAttention.time_attention": ("time", "s", {}, "dense"),
    "MemoryAttention.track_extra_bytes": ("memory", "bytes", {}, "dense"),
    "TimeHalfPrecision.time_attention": ("time", "s", {}, "dense"),
    "TimeDecode.time_decode": ("time", "s", {"op": "forward"}, "decode"),
    "TimeGroupedDecode.time_decode": ("time", "s", {"op": "forward"}, "decode"),
    "TimeMasked.time_masked": ("time", "s", {}, None),  # problem: the mask parameter
    "TimePagedDecode.time_paged_decode": ("time", "s", {"op": "forward"}, "paged_decode"),
    "TimeVarlenPrefill.time_varlen_prefill": ("time", "s", {"op": "forward"}, "varlen_prefill"),
    "PeakMatmul.track_peak_gflops": ("peak_gflops", "GFLOP/s", {"op": "matmul", "dtype": "float32"}, None),
    "Bandwidth.track_bandwidth": ("bandwidth", "GB/s", {}, None),
    "Threads.track_threads": ("threads", "threads", {}, None),
    "Fidelity.track_fidelity_ratio": ("fidelity_ratio", "ratio", {"op": "forward", "dtype": "float32"}, "dense"),
    "Fidelity.track_timer_seconds": ("timer_time", "s", {"op": "forward", "dtype": "float32"}, "dense"),
    "Device.track_on_gpu": ("on_gpu", "gpu", {}, None),
}
# parameter names when benchmarks.json is missing or describes another version of the benchmark
# (every layout these benchmarks have had; the one whose length matches the results is used)
ATTENTION_PARAMS = ["backend", "batch", "heads", "T", "E", "op", "dtype"]
FIDELITY_PARAMS = ["backend", "T", "E"]
DECODE_PARAMS = ["backend", "batch", "heads", "kv_heads", "Lq", "Lk", "E", "dtype", "clock"]
DEFAULT_PARAM_NAMES = {
    "TimeAttention.time_attention": [ATTENTION_PARAMS + ["clock"], ATTENTION_PARAMS],
    "MemoryAttention.track_extra_bytes": [ATTENTION_PARAMS],
    "TimeHalfPrecision.time_attention": [ATTENTION_PARAMS + ["clock"]],
    "TimeDecode.time_decode": [DECODE_PARAMS],
    "TimeGroupedDecode.time_decode": [DECODE_PARAMS],
    "TimeMasked.time_masked": [["backend", "batch", "heads", "T", "E", "mask", "op", "dtype", "clock"]],
    "TimePagedDecode.time_paged_decode": [DECODE_PARAMS[:-1] + ["page_size", "clock"]],
    "TimeVarlenPrefill.time_varlen_prefill": [["backend", "batch", "heads", "T", "E", "dtype", "clock"]],
    "PeakMatmul.track_peak_gflops": [["library", "dtype", "openblas_coretype", "threads"],
                                     ["library", "openblas_coretype", "threads"]],
    "Bandwidth.track_bandwidth": [["kernel", "array_mib", "threads"]],
    "Threads.track_threads": [["library"]],
    "Fidelity.track_fidelity_ratio": [FIDELITY_PARAMS + ["clock"], FIDELITY_PARAMS],
    "Fidelity.track_timer_seconds": [FIDELITY_PARAMS + ["clock"], FIDELITY_PARAMS],
    "Device.track_on_gpu": [["backend"]],
}
FIDELITY_BATCH, FIDELITY_HEADS = 1, 8  # benchmarks/_grid.py BATCH, HEADS
_INT_COLUMNS = ("batch", "heads", "T", "E", "kv_heads", "Lq", "Lk", "page_size")


def _short(name: str) -> str:
    return ".".join(name.rsplit(".", 2)[-2:])


def _param_value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # an object asv could only repr (e.g. <class ...>): keep the text


def _is_missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _finite_or_nan(x) -> float:
    return float(x) if not _is_missing(x) and math.isfinite(x) else math.nan


def _param_names(name: str, params: list, declared: dict) -> list:
    for names in [declared.get(name, {}).get("param_names")] + DEFAULT_PARAM_NAMES.get(_short(name), []):
        if names is not None and len(names) == len(params):
            return list(names)
    return [f"param{i}" for i in range(len(params))]


def _rows_of_file(path: str, machine: str, declared: dict, grid: str | None = None) -> list:
    with open(path) as f:
        data = json.load(f)
    if data.get("version") != 2 or "result_columns" not in data:
        raise ValueError(f"{path}: not an asv results file of format version 2")
    columns = data["result_columns"]
    commit = data.get("commit_hash")
    machine = data.get("params", {}).get("machine", machine)
    rows = []
    for name, entry in data.get("results", {}).items():
        record = dict(zip(columns, entry, strict=False))  # trailing columns may be absent
        params = record.get("params") or []
        values = record.get("result")
        if values is None:  # the whole benchmark failed (e.g. its module did not import)
            continue
        values = values if isinstance(values, list) else [values]
        ci_a = record.get("stats_ci_99_a") or [None] * len(values)
        ci_b = record.get("stats_ci_99_b") or [None] * len(values)
        names = _param_names(name, params, declared)
        combos = list(itertools.product(*params)) if params else [()]
        if len(combos) != len(values):
            raise ValueError(f"{path}: {name} has {len(values)} results for {len(combos)} parameter combinations")
        metric, unit, fixed, problem = KNOWN.get(
            _short(name), (name.rsplit(".", 1)[-1], declared.get(name, {}).get("unit"), {}, None))
        for combo, value, lo, hi in zip(combos, values, ci_a, ci_b, strict=True):
            if _is_missing(value):  # skipped (NotImplementedError in setup) or failed
                continue
            row = {c: None for c in COLUMNS + EXTRA_COLUMNS} | fixed | {"problem": problem}
            for key, text in zip(names, combo, strict=True):
                row[_COLUMN_OF.get(key, key)] = _param_value(text)
            row.update(metric=metric, value=float(value), unit=unit, machine=machine, commit=commit,
                       ci_low=_finite_or_nan(lo), ci_high=_finite_or_nan(hi), grid=grid)
            _fill_sizes(row)
            rows.append(row)
    on_gpu = {r["backend"] for r in rows if r["metric"] == "on_gpu" and r["value"] >= 1}
    for row in rows:
        _file_gpu_rows(row, on_gpu)
    return rows


# A GPU's rows - its roofs (benchmarks/bench_machine.py GPU_LIBRARY, GPU_KERNEL) and the GPU
# built-ins' timings - go under a machine of their own, "<host> gpu": every per-machine roof the
# report draws (matmul peak per dtype, DRAM bandwidth) is then the device's own, and a GPU kernel
# is never read against the CPU's peak.  Its roofs are named as the CPU's are (torch, triad).
GPU_MACHINE_SUFFIX = " gpu"
_GPU_ROOFS = {("peak_gflops", "torch-cuda"): "torch", ("bandwidth", "cuda-triad"): "triad"}


def _file_gpu_rows(row: dict, on_gpu: set) -> None:
    """A GPU's roofs and the rows of backends the results say run on a GPU (Device.track_on_gpu)
    go under the GPU's machine."""
    roof = _GPU_ROOFS.get((row["metric"], row["backend"]))
    if roof is not None:
        row.update(backend=roof, machine=f"{row['machine']}{GPU_MACHINE_SUFFIX}")
    elif row["metric"] in _ATTENTION_METRICS and row["backend"] in on_gpu:
        row["machine"] = f"{row['machine']}{GPU_MACHINE_SUFFIX}"


_ATTENTION_METRICS = ("time", "memory")


# parameter -> column: machine rows name what they measure in `backend`, their size in `op`
_COLUMN_OF = {"library": "backend", "kernel": "backend", "kv_heads": "kv_heads", "mask": "problem"}


def _fill_sizes(row: dict) -> None:
    """Lq, Lk, kv_heads of attention rows; machine rows' size label; fidelity rows' B and H."""
    if row["metric"] in ("fidelity_ratio", "timer_time"):
        row.update(batch=row["batch"] or FIDELITY_BATCH, heads=row["heads"] or FIDELITY_HEADS)
    if row.get("array_mib") is not None:
        row["op"] = f"{row.pop('array_mib')} MiB arrays"
    for extra in ("openblas_coretype", "threads", "array_mib"):
        row.pop(extra, None)  # one-value parameters: recorded by asv, not columns here
    if row["problem"] in ("dense", "causal", "window", "varlen_prefill") and row["T"] is not None:
        row.update(Lq=row["Lq"] or row["T"], Lk=row["Lk"] or row["T"])
    if row["problem"] is not None and row["kv_heads"] is None:
        row["kv_heads"] = row["heads"]


def _read_json(path: str, skipped: list | None, what: str):
    """The JSON in path, or None when it is not there; unreadable: named in `skipped` (None: raise)."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        if skipped is None:
            raise ValueError(f"{path}: not a readable {what} ({type(e).__name__}: {e})") from None
        skipped.append(f"{path} — not a readable {what} ({type(e).__name__}: {e})")
        return None


def load_results(results_dir: str, skipped: list | None = None):
    """Every machine's results under `results_dir` as a DataFrame (COLUMNS, then EXTRA_COLUMNS).

    With a `skipped` list, a results file that cannot be read is named there ("path — why")
    and the others are read; without, it raises ValueError."""
    import pandas as pd

    if not os.path.isdir(results_dir):
        raise ValueError(f"results_dir {results_dir!r} is not a folder")
    declared = _read_json(os.path.join(results_dir, "benchmarks.json"), skipped, "asv benchmarks.json")
    declared = {k: v for k, v in declared.items() if isinstance(v, dict)} if isinstance(declared, dict) else {}
    grid = _read_json(os.path.join(results_dir, "attnspec.json"), skipped, "attnspec grid file")
    grid = grid.get("grid") if isinstance(grid, dict) else None
    rows, machines = [], 0
    for machine in sorted(os.listdir(results_dir)):
        folder = os.path.join(results_dir, machine)
        if not os.path.isfile(os.path.join(folder, "machine.json")):
            continue
        machines += 1
        for name in sorted(os.listdir(folder)):
            if name.endswith(".json") and name != "machine.json":
                path = os.path.join(folder, name)
                try:
                    rows += _rows_of_file(path, machine, declared, grid)
                except (OSError, ValueError, KeyError, TypeError) as e:  # truncated JSON is a ValueError
                    if skipped is None:
                        raise
                    why = str(e)[len(path) + 2:] if str(e).startswith(path + ": ") else f"{type(e).__name__}: {e}"
                    skipped.append(f"{path} — not a readable asv results file ({why})")
    if not machines:
        raise ValueError(f"results_dir {results_dir!r} has no machine folder (a subfolder with machine.json)")
    df = pd.DataFrame(rows, columns=COLUMNS + EXTRA_COLUMNS)
    for col in _INT_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    from attnspec.reports.asv_derived import derived_rows

    df = pd.concat([df, derived_rows(df)], ignore_index=True)
    return df.sort_values(["machine", "commit", "metric", "backend", "op", "E", "T"], kind="stable",
                          na_position="last").reset_index(drop=True)


def fit_scaling(df, metric: str, t_min: int = 256):
    """Exponent p of value ~ T^p per (backend, op), least squares on log-log for T >= t_min.

    Only the dense sweep (problem "dense", or rows without a problem column) is fitted: masked
    problems scale differently by design (a sliding window is linear in T).

    Rows of several E, dtypes, machines or commits share the exponent but each such group gets
    its own intercept (a within-group fit), so pooling them does not bias the slope. r2 is the
    share of the within-group variance of log(value) the line explains. Columns: backend, op,
    metric, exponent, r2, n (points), t_lo, t_hi (the T range fitted).
    """
    import numpy as np
    import pandas as pd

    missing = [c for c in ("backend", "op", "T", "metric", "value") if c not in df.columns]
    if missing:
        raise ValueError(f"df lacks column(s) {missing}: expected load_results() output")
    if not isinstance(t_min, (int, float)) or t_min <= 0:
        raise ValueError(f"t_min must be a positive number, got {t_min!r}")
    if metric not in set(df["metric"]):
        raise ValueError(f"metric {metric!r} not in the results (have {sorted(set(df['metric']))})")
    dense = df["problem"].isin(["dense"]) | df["problem"].isna() if "problem" in df.columns else True
    keep = (df["metric"] == metric) & (df["T"] >= t_min) & (df["value"] > 0) & dense  # T is NA on machine rows
    rows = df[keep.fillna(False).astype(bool)].copy()
    group_cols = [c for c in ("E", "dtype", "batch", "heads", "machine", "commit", "clock") if c in rows.columns]
    out = []
    for (backend, op), _ in df[(df["metric"] == metric) & dense].groupby(["backend", "op"], sort=True):
        fit = rows[(rows["backend"] == backend) & (rows["op"] == op)]
        x = np.log(fit["T"].astype(float).to_numpy())  # (n,)
        y = np.log(fit["value"].astype(float).to_numpy())  # (n,)
        if group_cols and len(fit):
            groups = fit[group_cols].apply(lambda col: col.map(str)).agg("|".join, axis=1).to_numpy()  # (n,)
            for g in np.unique(groups):  # remove each group's mean: its own intercept
                x[groups == g] -= x[groups == g].mean()
                y[groups == g] -= y[groups == g].mean()
        elif len(fit):
            x, y = x - x.mean(), y - y.mean()
        sxx = float(x @ x)
        if len(fit) < 2 or sxx == 0:  # fewer than two T values in every group: no slope
            exponent = r2 = math.nan
        else:
            exponent = float(x @ y) / sxx
            resid = y - exponent * x  # (n,)
            syy = float(y @ y)
            r2 = 1.0 - float(resid @ resid) / syy if syy > 0 else 1.0
        t_lo = int(fit["T"].min()) if len(fit) else None
        t_hi = int(fit["T"].max()) if len(fit) else None
        out.append(dict(backend=backend, op=op, metric=metric, exponent=exponent, r2=r2, n=len(fit),
                        t_lo=t_lo, t_hi=t_hi))
    return pd.DataFrame(out, columns=["backend", "op", "metric", "exponent", "r2", "n", "t_lo", "t_hi"])
