"""Build the report folder from stored results: CSVs, index.html and a raw/ copy of the inputs.

`build(inputs, out_dir)` writes everything into a staging folder and swaps it in at the end,
so a failure anywhere (a corrupt input, a plotting error, Ctrl-C) leaves the previous report.
The raw/ copy makes the folder self-contained: `attnspec report` rebuilds it, and several
machines' report folders merge by naming them all.
"""
from __future__ import annotations

import datetime
import html
import json
import os
import shutil

from . import inputs as inp
from .writer import staging, write_text

CSV_FILES = ("conformance.csv", "semantics.csv", "benchmarks.csv", "scaling.csv", "worked_examples.csv")


def matmul_peaks(bench) -> dict:
    """machine -> measured float32 matmul GFLOP/s (the roofline), from the benchmark rows."""
    if bench.empty:
        return {}
    is_peak = bench["op"].astype(str).str.contains("matmul") | bench["metric"].astype(str).str.contains("peak")
    rows = bench[is_peak & bench["unit"].astype(str).str.contains("GFLOP", case=False)].dropna(subset=["value"])
    return {m: float(g["value"].max()) for m, g in rows.groupby("machine")}


def build(inputs: inp.Inputs, out_dir: str, *, asv_commit: str | None = None, title: str = "attnspec report",
          _before_swap=None) -> dict:
    """Write the report; return a small summary (counts, paths) for the command to print."""
    if not inputs.conformance and not inputs.semantics and not inputs.asv_dirs:
        raise inp.ReportInputError("no results to report: run `attnspec run`, or name suite JSON files, "
                                   "asv results folders or report folders")
    with staging(out_dir) as tmp:
        raw = os.path.join(tmp, inp.RAW)
        os.makedirs(os.path.join(raw, "asv"))
        write_text(raw, inp.SUITE_FILE, json.dumps({"conformance": inputs.conformance,
                                                    "semantics": inputs.semantics}, indent=1, default=str))
        kept = []
        for i, src in enumerate(inputs.asv_dirs):
            dst = os.path.join(raw, "asv", str(i))
            if inp.copy_asv_results(src, dst, asv_commit):
                kept.append(dst)
            else:
                shutil.rmtree(dst, ignore_errors=True)
        summary = _write_tables_and_page(tmp, inputs, kept, title)
        if _before_swap is not None:  # tests simulate a failure at the last moment
            _before_swap(tmp)
    summary["out"] = os.path.abspath(out_dir)
    return summary


def _write_tables_and_page(tmp: str, inputs: inp.Inputs, asv_dirs: list, title: str) -> dict:
    from . import page, plots, tables  # pandas and matplotlib only when a report is built

    conf = tables.conformance_frame(inputs.conformance)
    sem = tables.semantics_frame(inputs.semantics)
    bench = tables.benchmarks_frame(asv_dirs)
    scaling = tables.scaling_frame(bench)
    worked, worked_note = tables.worked_frame()
    scaling_csv = scaling.drop(columns=["n"], errors="ignore")
    for name, df in zip(CSV_FILES, (conf, sem, bench, scaling_csv, worked[list(tables.WORKED_COLUMNS)])):
        df.to_csv(os.path.join(tmp, name), index=False)

    verdicts = tables.verdict_frame(conf, sem)
    speed = tables.speed_summary(bench)
    head = tables.headline(bench)
    several = head["machine"].nunique() > 1 if not head.empty else False
    slopes = {}
    for r in scaling.itertuples():
        slopes[(r.backend, r.op, r.metric) + ((r.machine,) if several else ())] = r.exponent
    perf = _performance(plots, page, tables, head, scaling, slopes, matmul_peaks(bench))
    sections = [
        ("verdict", "Verdict per backend", page.verdict_section(verdicts, speed)),
        ("conformance", "Conformance: backend × property × dtype",
         '<p class="lead">Each cell is one property checked with Hypothesis on one backend and dtype '
         "(hover a chip for its message): bf16, f16, f32, f64 are the dtypes. Failures are listed below with "
         "their shrunk counterexample.</p>"
         + page.conformance_matrix(conf) + "<h3>Failures</h3>" + page.failures(conf)),
        ("semantics", "Semantics: what each backend does where the spec leaves a choice",
         '<p class="lead">Recorded behaviour; a backend fails here only where it contradicts its own '
         "declaration.</p>" + page.semantics_matrix(sem)),
        ("performance", "Performance", perf),
        ("worked", "The seeds' worked examples", '<p class="lead">Every number printed in the course notes, '
         "recomputed with the float64 reference. Rows that disagree are errata in the notes.</p>"
         + page.worked_table(worked, worked_note)),
    ]
    machines = sorted(set(bench["machine"].dropna())) if not bench.empty else []
    commits = sorted({str(c)[:8] for c in bench["commit"].dropna()}) if not bench.empty else []
    meta = (f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC} · "
            f"{len(verdicts)} backend(s) · machines: {html.escape(', '.join(map(str, machines)) or 'none')} · "
            f"commit: {html.escape(', '.join(commits) or 'n/a')} · data: CSV files beside this page")
    write_text(tmp, "index.html", page.page(title, meta, sections))
    return {"backends": len(verdicts), "conformance_rows": len(conf), "benchmark_rows": len(bench),
            "machines": machines, "problems": int(conf["status"].isin(tables.PROBLEM_STATUSES).sum())}


def _performance(plots, page, tables, head, scaling, slopes, peaks) -> str:
    if head.empty:
        return '<p class="note">No benchmark results (run <code>attnspec run</code> without --no-bench).</p>'
    e, dtype = head["E"].iloc[0], head["dtype"].iloc[0]
    parts = [f'<p class="lead">Batch {page.esc(head["batch"].iloc[0])} × heads {page.esc(head["heads"].iloc[0])}, '
             f"head dim E = {page.esc(e)}, {page.esc(dtype)}; every E is in benchmarks.csv. Slopes are least-squares "
             f"fits of log(value) against log(T) for T ≥ {tables.FIT_T_MIN}: attention's cost is O(T²·E), so time and the "
             "naive memory should approach 2, a tiled kernel's memory 1.</p>"]
    for metric, ylabel, title, k in (("time", "seconds per call", "Time per call", 1.0),
                                      ("memory", "extra MiB per call", "Extra memory per call", 1 / 2 ** 20)):
        svg = plots.metric_vs_T(head, metric, ylabel, slopes, scale=k)
        if svg:
            parts.append(f"<h3>{title}</h3>{svg}")
    svg = plots.gflops_vs_T(head, peaks)
    if svg:
        parts.append("<h3>Achieved GFLOP/s (roofline: the measured float32 matmul peak)</h3>" + svg)
    parts.append("<h3>Fitted exponents (value ∝ T^exponent)</h3>" + page.scaling_table(scaling))
    return "".join(parts)
