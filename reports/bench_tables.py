"""The benchmark questions beyond the T sweep, as DataFrames: 16-bit dtypes against their own
matmul peak, decode bandwidth against the measured memory roof, grouped KV heads, and masked
problems' rate over useful work.  Input: the rows of reports.asv_results.load_results."""
from __future__ import annotations

import pandas as pd

DTYPE_T = (4, 256, 2048)  # the sizes the 16-bit table shows (overhead, mid, large)
DRAM_KERNEL = "triad"  # decode's roof: STREAM triad on arrays past the last-level cache


def _rows(bench: pd.DataFrame, metric: str, problem=None) -> pd.DataFrame:
    if bench.empty or "problem" not in bench.columns:
        return bench.iloc[0:0]
    sub = bench[bench["metric"] == metric].dropna(subset=["value"])
    return sub if problem is None else sub[sub["problem"] == problem]


def fmt_seconds(s) -> str:
    if s is None or pd.isna(s):
        return ""
    for unit, k in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= k:
            return f"{s / k:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def peaks_by_dtype(bench: pd.DataFrame) -> dict:
    """(machine, dtype) -> the best library's matmul GFLOP/s: each dtype's compute roof."""
    rows = _rows(bench, "peak_gflops")
    return {(m, d): float(g["value"].max()) for (m, d), g in rows.groupby(["machine", "dtype"])}


def bandwidth_roofs(bench: pd.DataFrame) -> dict:
    """(machine, kernel, array size label) -> GB/s."""
    rows = _rows(bench, "bandwidth")
    return {(m, k, s): float(g["value"].max()) for (m, k, s), g in rows.groupby(["machine", "backend", "op"])}


def dram_roof(roofs: dict, machine) -> tuple | None:
    """(label, GB/s) of the largest-array triad (else copy) measured on `machine`."""
    for kernel in (DRAM_KERNEL, "copy"):
        sizes = [(int(str(s).split()[0]), s, v) for (m, k, s), v in roofs.items() if m == machine and k == kernel]
        if sizes:
            _, label, value = max(sizes)
            return f"{kernel}, {label}", value
    return None


def dtype_frame(bench: pd.DataFrame, ts=DTYPE_T) -> pd.DataFrame:
    """Forward time at T in `ts` per backend and dtype (E = 64), and the rate at the largest T
    as a share of that dtype's matmul peak measured in the same run."""
    time = _rows(bench, "time", "dense")
    time = time[(time["op"] == "forward") & (time["E"] == 64)] if not time.empty else time
    columns = ["machine", "backend", "dtype"] + [f"T={t}" for t in ts] + ["largest T", "GFLOP/s there", "% of dtype peak"]
    if time.empty:
        return pd.DataFrame(columns=columns)
    gflops = _rows(bench, "gflops", "dense")
    peaks = peaks_by_dtype(bench)
    out = []
    for (m, b, d), g in time.groupby(["machine", "backend", "dtype"]):
        by_t = dict(zip(g["T"].astype(int), g["value"], strict=True))
        if not any(t in by_t for t in ts):
            continue
        top = max(by_t)
        rate = gflops[(gflops["machine"] == m) & (gflops["backend"] == b) & (gflops["dtype"] == d)
                      & (gflops["op"] == "forward") & (gflops["E"] == 64) & (gflops["T"] == top)]["value"]
        rate = float(rate.iloc[0]) if len(rate) else None
        peak = peaks.get((m, d))
        share = f"{100 * rate / peak:.0f} %" if rate and peak else ""
        out.append([m, b, d] + [fmt_seconds(by_t.get(t)) for t in ts] + [top, f"{rate:.1f}" if rate else "", share])
    order = {"float32": 0, "bfloat16": 1, "float16": 2, "float64": 3}
    df = pd.DataFrame(out, columns=columns)
    return df.sort_values(["machine", "backend", "dtype"], key=lambda c: c.map(order) if c.name == "dtype" else c,
                          kind="stable").reset_index(drop=True)


def decode_frame(bench: pd.DataFrame) -> pd.DataFrame:
    """Each decode step: time, KV-read GB/s and its share of the DRAM bandwidth roof."""
    time = _rows(bench, "time", "decode")
    columns = ["machine", "backend", "dtype", "Lq", "Lk", "kv_heads", "time", "KV GB/s", "% of DRAM roof"]
    if time.empty:
        return pd.DataFrame(columns=columns)
    gbps = _rows(bench, "kv_gbps", "decode")
    roofs = bandwidth_roofs(bench)
    keys = ["machine", "backend", "dtype", "Lq", "Lk", "kv_heads"]
    merged = time.merge(gbps[keys + ["value"]], on=keys, how="left", suffixes=("", "_gbps"))
    out = []
    for r in merged.itertuples(index=False):
        roof = dram_roof(roofs, r.machine)
        share = f"{100 * r.value_gbps / roof[1]:.0f} %" if roof and pd.notna(r.value_gbps) else ""
        out.append([r.machine, r.backend, r.dtype, int(r.Lq), int(r.Lk), int(r.kv_heads), fmt_seconds(r.value),
                    f"{r.value_gbps:.2f}" if pd.notna(r.value_gbps) else "", share])
    return pd.DataFrame(out, columns=columns).sort_values(
        ["machine", "backend", "dtype", "Lq", "kv_heads", "Lk"], ascending=[True, True, True, True, False, True],
        kind="stable").reset_index(drop=True)


def gqa_frame(bench: pd.DataFrame) -> pd.DataFrame:
    """Decode time against the number of KV heads (Hq = 8, one query, largest Lk, float32).

    A memory-bound kernel that reads each shared KV head once takes ~Hkv/8 of the Hkv = 8 time;
    one that copies K and V out to every query head (repeat_interleave) does not speed up."""
    time = _rows(bench, "time", "decode")
    columns = ["machine", "backend", "Lk", "Hkv=8", "Hkv=2", "Hkv=1", "Hkv=1 / Hkv=8"]
    if time.empty:
        return pd.DataFrame(columns=columns)
    time = time[(time["Lq"] == 1) & (time["dtype"] == "float32")]
    out = []
    for (m, b), g in time.groupby(["machine", "backend"]):
        lk = int(g["Lk"].max())
        by_h = dict(zip(g[g["Lk"] == lk]["kv_heads"].astype(int), g[g["Lk"] == lk]["value"], strict=True))
        ratio = f"{by_h[1] / by_h[8]:.2f}" if 1 in by_h and 8 in by_h else ""
        out.append([m, b, lk] + [fmt_seconds(by_h.get(h)) for h in (8, 2, 1)] + [ratio])
    return pd.DataFrame(out, columns=columns)


def masked_frame(bench: pd.DataFrame, largest_t_only: bool = True) -> pd.DataFrame:
    """Useful GFLOP/s (visible pairs only) of causal and windowed problems against the dense
    rate at the same T: ~1 when the kernel skips hidden work, ~visible share when it does not.
    By default only each backend's largest T (small T is call overhead, not masking)."""
    rate = _rows(bench, "gflops")
    columns = ["machine", "backend", "op", "dtype", "problem", "T", "useful GFLOP/s", "dense GFLOP/s", "useful / dense"]
    if rate.empty:
        return pd.DataFrame(columns=columns)
    masked = rate[rate["problem"].isin(["causal"]) | rate["problem"].astype(str).str.startswith("window-")]
    if largest_t_only and not masked.empty:
        top = masked.groupby(["machine", "backend", "op", "dtype", "problem"])["T"].transform("max")
        masked = masked[masked["T"] == top]
    dense = rate[(rate["problem"] == "dense") & (rate["E"] == 64)]
    keys = ["machine", "backend", "op", "T", "dtype", "E"]
    merged = masked.merge(dense[keys + ["value"]], on=keys, how="left", suffixes=("", "_dense"))
    out = []
    for r in merged.itertuples(index=False):
        ratio = f"{r.value / r.value_dense:.2f}" if pd.notna(r.value_dense) else ""
        out.append([r.machine, r.backend, r.op, r.dtype, r.problem, int(r.T), f"{r.value:.1f}",
                    f"{r.value_dense:.1f}" if pd.notna(r.value_dense) else "", ratio])
    return pd.DataFrame(out, columns=columns).sort_values(["machine", "backend", "op", "dtype", "problem", "T"],
                                                          kind="stable").reset_index(drop=True)


def paged_decode_frame(bench: pd.DataFrame) -> pd.DataFrame:
    """Each paged decode step (benchmarks/bench_serving.py): time, KV-read GB/s, its share of the DRAM roof."""
    time = _rows(bench, "time", "paged_decode")
    columns = ["machine", "backend", "dtype", "page_size", "Lk", "time", "KV GB/s", "% of DRAM roof"]
    if time.empty:
        return pd.DataFrame(columns=columns)
    keys = ["machine", "backend", "dtype", "Lk", "page_size"]
    merged = time.merge(_rows(bench, "kv_gbps", "paged_decode")[keys + ["value"]], on=keys, how="left",
                        suffixes=("", "_gbps"))
    roofs = bandwidth_roofs(bench)
    out = []
    for r in merged.itertuples(index=False):
        roof = dram_roof(roofs, r.machine)
        share = f"{100 * r.value_gbps / roof[1]:.0f} %" if roof and pd.notna(r.value_gbps) else ""
        out.append([r.machine, r.backend, r.dtype, int(r.page_size), int(r.Lk), fmt_seconds(r.value),
                    f"{r.value_gbps:.2f}" if pd.notna(r.value_gbps) else "", share])
    return pd.DataFrame(out, columns=columns).sort_values(["machine", "backend", "dtype", "Lk", "page_size"],
                                                          kind="stable").reset_index(drop=True)


def varlen_frame(bench: pd.DataFrame) -> pd.DataFrame:
    """Each mixed-length packed prefill: time and GFLOP/s over the useful pairs (each sequence's triangle)."""
    from attnspec.specs import cost

    time = _rows(bench, "time", "varlen_prefill")
    columns = ["machine", "backend", "dtype", "T", "lengths", "time", "useful GFLOP/s"]
    if time.empty:
        return pd.DataFrame(columns=columns)
    keys = ["machine", "backend", "dtype", "T"]
    merged = time.merge(_rows(bench, "gflops", "varlen_prefill")[keys + ["value"]], on=keys, how="left",
                        suffixes=("", "_gflops"))
    out = [[r.machine, r.backend, r.dtype, int(r.T), " ".join(map(str, cost.prefill_lengths(int(r.T), int(r.batch)))),
            fmt_seconds(r.value), f"{r.value_gflops:.2f}" if pd.notna(r.value_gflops) else ""]
           for r in merged.itertuples(index=False)]
    return pd.DataFrame(out, columns=columns).sort_values(["machine", "backend", "dtype", "T"],
                                                          kind="stable").reset_index(drop=True)
