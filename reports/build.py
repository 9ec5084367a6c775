"""Build the report folder from stored results: CSVs, index.html and a raw/ copy of the inputs.

`build(inputs, out_dir)` writes everything into a staging folder and swaps it in at the end,
so a failure anywhere (a corrupt input, a plotting error, Ctrl-C) leaves the previous report.
The raw/ copy makes the folder self-contained: `attnspec report` rebuilds it, and several
machines' report folders merge by naming them all.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
from dataclasses import dataclass

from attnspec.reports import inputs as inp
from attnspec.reports.writer import staging, write_text

CSV_FILES = ("conformance.csv", "semantics.csv", "benchmarks.csv", "scaling.csv", "worked_examples.csv",
             "verdicts.csv", "conventions.csv")

# The page, top to bottom: (anchor, title).  Section <anchor> is drawn by the template
# reports/templates/sections/<anchor>.html.j2 from the dict `data` that reports.page.<anchor>_data
# returns (it reads the tables in Frames).  To add a section: write those two, add its line here
# (and, if it needs a table the report does not compute yet, a field to Frames).
SECTIONS = (
    ("verdict", "Verdict per backend"),
    ("failures", "Failures"),
    ("deviations", "Declared deviations"),
    ("conformance", "Conformance: backend × property × dtype"),
    ("semantics", "Semantics: what each backend does where the spec leaves a choice"),
    ("conventions", "Declared conventions per backend: declared, observed, agrees"),
    ("performance", "Performance"),
    ("dtypes", "Performance in 16-bit dtypes"),
    ("decode", "Decode: KV-cache bandwidth and grouped KV heads"),
    ("masked", "Causal and sliding-window problems: rate over useful work"),
    ("serving", "Serving formats: paged decode and varlen prefill"),
    ("detection", "Detection power: the smallest defect the suite rejects"),
    ("worked", "The seeds' worked examples"),
)


REPORT_MODULES = ("pandas", "matplotlib", "jinja2")  # what writing a report imports (the `report` extra)


def missing_modules() -> list:
    """The report's dependencies that are not installed, checked without importing them."""
    import importlib.util

    return [m for m in REPORT_MODULES if importlib.util.find_spec(m) is None]


def require_modules() -> None:
    """ReportInputError naming the missing dependencies, before anything runs."""
    missing = missing_modules()
    if missing:
        one = len(missing) == 1
        raise inp.ReportInputError(f"{', '.join(missing)} {'is' if one else 'are'} not installed; the report needs "
                                   f"{'it' if one else 'them'}: pip install -e \".[report]\"")


def matmul_peaks(bench) -> dict:
    """machine -> measured float32 matmul GFLOP/s (the roofline), from the benchmark rows."""
    if bench.empty:
        return {}
    is_peak = bench["op"].astype(str).str.contains("matmul") | bench["metric"].astype(str).str.contains("peak")
    is_f32 = bench["dtype"].isna() | (bench["dtype"] == "float32")  # 16-bit peaks: bench_tables.peaks_by_dtype
    rows = bench[is_peak & is_f32 & bench["unit"].astype(str).str.contains("GFLOP", case=False)].dropna(subset=["value"])
    return {m: float(g["value"].max()) for m, g in rows.groupby("machine")}


def build(inputs: inp.Inputs, out_dir: str, *, asv_commit: str | None = None, title: str = "attnspec report",
          _before_swap=None) -> dict:
    """Write the report; return a small summary (counts, paths) for the command to print."""
    if not inputs.conformance and not inputs.semantics and not inputs.asv_dirs and not inputs.detection:
        if inputs.skipped:
            raise inp.ReportInputError("no results to report: every input was skipped: " + "; ".join(
                f"skipped: {line}" for line in inputs.skipped))
        raise inp.ReportInputError("no results to report: run `attnspec run`, or name suite JSON files, "
                                   "asv results folders or report folders")
    with staging(out_dir) as tmp:
        raw = os.path.join(tmp, inp.RAW)
        os.makedirs(os.path.join(raw, "asv"))
        write_text(raw, inp.SUITE_FILE, json.dumps({"conformance": inputs.conformance, "semantics": inputs.semantics,
                                                    "declarations": inputs.declarations}, indent=1, default=str))
        kept, skipped = [], list(inputs.skipped)
        for i, src in enumerate(inputs.asv_dirs):
            dst = os.path.join(raw, "asv", str(i))
            if inp.copy_asv_results(src, dst, asv_commit, skipped):
                kept.append(dst)
            else:
                shutil.rmtree(dst, ignore_errors=True)
        summary = _write_tables_and_page(tmp, inputs, kept, title, skipped)
        if _before_swap is not None:  # tests simulate a failure at the last moment
            _before_swap(tmp)
    summary["out"] = os.path.abspath(out_dir)
    return summary


@dataclass
class Frames:
    """Every table a report computes: what the sections' data functions (reports/page.py) read."""

    conf: object      # conformance rows (conformance.csv)
    sem: object       # semantics rows (semantics.csv)
    bench: object     # benchmark rows (benchmarks.csv)
    scaling: object   # fitted exponents (scaling.csv, plus n: the points in each fit)
    worked: object    # the seeds' worked examples (worked_examples.csv, plus note)
    worked_note: str  # why there are none, when there are none
    verdicts: object  # one row per backend (verdicts.csv)
    speed: object     # forward time at the largest T, per backend and machine
    head: object      # the benchmark rows the plots and fits use (one E, one dtype)
    slopes: dict      # (backend, op, metric[, machine]) -> fitted exponent, for the legends
    peaks: dict       # machine -> measured float32 matmul GFLOP/s (the roofline)
    detection: object = None  # detection_power.csv rows (a DataFrame; empty when not measured)
    conventions: object = None  # declared conventions beside the observations (conventions.csv)


def _write_tables_and_page(tmp: str, inputs: inp.Inputs, asv_dirs: list, title: str, skipped: list) -> dict:
    """The CSVs and the page; `skipped` ("path — why" of each input left out) grows by the asv
    results files that cannot be read, and the page and the summary name them all."""
    from attnspec.reports import page, tables  # pandas, matplotlib and Jinja2 only when a report is built
    from attnspec.reports.conventions import conventions_frame

    conf = tables.conformance_frame(inputs.conformance)
    sem = tables.semantics_frame(inputs.semantics)
    bench = tables.benchmarks_frame(asv_dirs, skipped)
    scaling = tables.scaling_frame(bench)
    worked, worked_note = tables.worked_frame()
    verdicts = tables.verdict_frame(conf, sem)
    conventions = conventions_frame(inputs.declarations, sem, conf)
    csvs = (conf, sem, bench, scaling.drop(columns=["n"], errors="ignore"), worked[list(tables.WORKED_COLUMNS)],
            verdicts, conventions)
    for name, df in zip(CSV_FILES, csvs, strict=True):
        df.to_csv(os.path.join(tmp, name), index=False)

    head = tables.headline(bench)
    several = head["machine"].nunique() > 1 if not head.empty else False
    slopes = {}
    for r in scaling.itertuples():
        slopes[(r.backend, r.op, r.metric) + ((r.machine,) if several else ())] = r.exponent
    import pandas as pd

    detection = pd.DataFrame(inputs.detection)
    if not detection.empty:  # the page's table, and raw/'s copy for rebuilding the folder
        for folder in (tmp, os.path.join(tmp, inp.RAW)):
            detection.to_csv(os.path.join(folder, inp.DETECTION_FILE), index=False)
    frames = Frames(conf=conf, sem=sem, bench=bench, scaling=scaling, worked=worked, worked_note=worked_note,
                    verdicts=verdicts, speed=tables.speed_summary(bench), head=head, slopes=slopes,
                    peaks=matmul_peaks(bench), detection=detection, conventions=conventions)
    sections = [(anchor, name, getattr(page, f"{anchor}_data")(frames)) for anchor, name in SECTIONS]
    machines = sorted(set(bench["machine"].dropna())) if not bench.empty else []
    commits = sorted({str(c)[:8] for c in bench["commit"].dropna()}) if not bench.empty else []
    untested = verdicts["verdict"].str.startswith("not tested")
    meta = {"generated": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
            "backends": int((~untested).sum()), "not_tested": int(untested.sum()),
            "machines": ", ".join(map(str, machines)), "commits": ", ".join(commits),
            "grids": ", ".join(sorted(set(bench["grid"].dropna()))) if not bench.empty else "",
            "skipped": [_relative(line, tmp) for line in skipped],
            # baselines a run of named backends times beside them (attnspec run --baselines): not checked
            "benched_only": ", ".join(sorted(set(head["backend"]) - set(verdicts["backend"]))) if not head.empty else ""}
    write_text(tmp, "index.html", page.render(title, meta, sections))
    not_tested = verdicts[untested]
    return {"backends": len(verdicts), "conformance_rows": len(conf), "benchmark_rows": len(bench),
            "machines": machines, "problems": int(conf["status"].isin(tables.PROBLEM_STATUSES).sum()),
            "not_tested": dict(zip(not_tested["backend"], not_tested["reason"], strict=True)),
            "skipped": [_relative(line, tmp) for line in skipped]}


def _relative(line: str, staged: str) -> str:
    """A skip inside the staged folder names the report folder's copy (raw/...), not the staging path."""
    return line.replace(staged + os.sep, "") if line.startswith(staged + os.sep) else line
