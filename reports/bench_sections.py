"""Data for the page's benchmark sections beyond the T sweep (templates sections/<anchor>.html.j2):
16-bit dtypes, decode and grouped KV heads, masked problems.  Same contract as reports/page.py:
`<anchor>_data(frames) -> dict` of plain text, numbers and SVG marked safe (matplotlib escapes
its own text)."""
from __future__ import annotations

import pandas as pd
from markupsafe import Markup

from attnspec.reports import bench_tables, plots

DTYPE_TITLES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "float64": "float64"}


def _table(df: pd.DataFrame, numeric=()) -> dict:
    """Columns and rows as text; the machine column only when results come from several."""
    if "machine" in df.columns and df["machine"].nunique() <= 1:
        df = df.drop(columns=["machine"])
    cells = [["" if v is None or (isinstance(v, float) and pd.isna(v)) else str(v) for v in row]
             for row in df.itertuples(index=False)]
    return {"columns": list(df.columns), "rows": cells, "numeric": [c for c in df.columns if c in numeric]}


def _svg(svg) -> Markup | None:
    return Markup(svg) if svg else None


def dtypes_data(f) -> dict:
    """Forward time per dtype at T = 4, 256, 2048 and the rate against that dtype's own matmul peak."""
    df = bench_tables.dtype_frame(f.bench)
    if df.empty:
        return {"measured": False}
    peaks = bench_tables.peaks_by_dtype(f.bench)
    several = len({m for m, _ in peaks}) > 1
    roofs: dict = {}
    for (machine, dtype), value in sorted(peaks.items()):
        roofs.setdefault(dtype, []).append((f"{dtype} matmul peak {value:.0f}" + (f" ({machine})" if several else ""),
                                            value))
    rate = f.bench[(f.bench["metric"] == "gflops") & (f.bench["problem"] == "dense") & (f.bench["op"] == "forward")
                   & (f.bench["E"] == 64)] if not f.bench.empty else f.bench
    numeric = [c for c in df.columns if c.startswith(("T=", "GFLOP", "%", "largest"))]
    return {"measured": True, "table": _table(df, numeric),
            "peaks": [[d, f"{v:.0f}"] + ([m] if several else []) for (m, d), v in sorted(peaks.items())],
            "plot": _svg(plots.rate_by_panel(rate, "dtype", DTYPE_TITLES, roofs))}


def decode_data(f) -> dict:
    """Decode steps: KV-read bandwidth against the measured copy/triad roofs, and grouped heads."""
    df = bench_tables.decode_frame(f.bench)
    if df.empty:
        return {"measured": False}
    roofs = bench_tables.bandwidth_roofs(f.bench)
    gbps = f.bench[(f.bench["metric"] == "kv_gbps") & (f.bench["kv_heads"] == f.bench["heads"])]
    dtypes = list(gbps["dtype"].dropna().unique())
    dtype = "float32" if "float32" in dtypes else (dtypes[0] if dtypes else None)
    plot = plots.decode_bandwidth(gbps[gbps["dtype"] == dtype], roofs) if dtype else None
    first = f.bench[f.bench["problem"] == "decode"].iloc[0]
    return {"measured": True, "dtype": dtype or "", "heads": int(first["heads"]), "E": int(first["E"]),
            "batch": int(first["batch"]), "plot": _svg(plot),
            "roofs": [[k, s, f"{v:.1f}"] for (m, k, s), v in sorted(roofs.items())],
            "table": _table(df, ("Lq", "Lk", "kv_heads", "time", "KV GB/s", "% of DRAM roof")),
            "gqa": _table(bench_tables.gqa_frame(f.bench), ("Lk", "Hkv=8", "Hkv=2", "Hkv=1", "Hkv=1 / Hkv=8"))}


def masked_data(f) -> dict:
    """Causal and sliding-window problems: GFLOP/s over the visible pairs, against the dense rate."""
    df = bench_tables.masked_frame(f.bench)
    if df.empty:
        return {"measured": False}
    rate = f.bench[(f.bench["metric"] == "gflops") & (f.bench["op"] == "forward") & (f.bench["dtype"] == "float32")]
    masked = (rate["problem"] == "causal") | rate["problem"].astype(str).str.startswith("window-")
    rate = rate[masked | ((rate["problem"] == "dense") & (rate["E"] == 64) & rate["T"].isin(set(rate[masked]["T"])))]
    titles = {"dense": "no mask (all pairs)", "causal": "causal (visible pairs only)"}
    titles.update({p: f"sliding window of {p[7:]} keys" for p in set(rate["problem"].astype(str)) if p.startswith("window-")})
    return {"measured": True, "plot": _svg(plots.rate_by_panel(rate, "problem", titles, ylabel="useful GFLOP/s")),
            "table": _table(df, ("T", "useful GFLOP/s", "dense GFLOP/s", "useful / dense"))}


def serving_data(f) -> dict:
    """Serving formats: a decode batch over a paged cache (KV GB/s under the roofs) and a mixed-length
    packed prefill (GFLOP/s over the useful pairs)."""
    paged, varlen = bench_tables.paged_decode_frame(f.bench), bench_tables.varlen_frame(f.bench)
    if paged.empty and varlen.empty:
        return {"measured": False}
    gbps = f.bench[(f.bench["metric"] == "kv_gbps") & (f.bench["problem"] == "paged_decode")]
    rate = f.bench[(f.bench["metric"] == "gflops") & (f.bench["problem"] == "varlen_prefill")]
    first = f.bench[f.bench["problem"].isin(("paged_decode", "varlen_prefill"))].iloc[0]
    return {"measured": True, "batch": int(first["batch"]), "heads": int(first["heads"]), "E": int(first["E"]),
            "paged_plot": _svg(plots.paged_bandwidth(gbps, bench_tables.bandwidth_roofs(f.bench))),
            "varlen_plot": _svg(plots.rate_by_panel(rate, "problem", {"varlen_prefill": "mixed lengths T, T/2, T/4, "
                                                                      "T/8, causal (useful pairs)"},
                                                    ylabel="useful GFLOP/s")),
            "paged": _table(paged, ("page_size", "Lk", "time", "KV GB/s", "% of DRAM roof")),
            "varlen": _table(varlen, ("T", "time", "useful GFLOP/s"))}
