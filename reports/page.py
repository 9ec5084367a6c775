"""index.html: the report's tables turned into what each section's template shows.

The page is reports/templates/page.html.j2, rendered by Jinja2 with autoescaping on: backend
names, messages and counterexamples are text from code we do not control, and every value
a template prints is escaped.  The one exception is the plots' SVG, marked safe here
(matplotlib writes it and escapes its own text).  Each section `<anchor>` of build.SECTIONS
has a template sections/<anchor>.html.j2 and a function `<anchor>_data(frames) -> dict`
below; the template gets that dict as `data`.  Values are plain text and numbers here;
layout and wording live in the templates.
"""
from __future__ import annotations

import jinja2
import pandas as pd
from markupsafe import Markup

from attnspec.reports import plots
from attnspec.reports.bench_sections import decode_data, dtypes_data, masked_data, serving_data  # noqa: F401 - sections of build.SECTIONS
from attnspec.reports.conventions import conventions_data  # noqa: F401 - a section of build.SECTIONS
from attnspec.reports.tables import FIT_T_MIN
from attnspec.reports.verdicts import STATUS_TEXT, deviations_data, failures_data, text, tri, verdict_data  # noqa: F401 - sections

DTYPE_SHORT = {"float8_e5m2": "e5m2", "float8_e4m3fn": "e4m3", "bfloat16": "bf16", "float16": "f16", "float32": "f32",
               "float64": "f64"}
STATUS_MARK = {"passed": "✓", "failed": "✗", "skipped": "–", "error": "!", "crashed": "‼", "timed_out": "…",
               "recorded": "○", "deviation": "≠"}


def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.PackageLoader("attnspec.reports", "templates"), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def render(title: str, meta: dict, sections) -> str:
    """sections: [(anchor, title, data)] in page order."""
    sections = [{"anchor": a, "title": t, "data": d} for a, t, d in sections]
    return environment().get_template("page.html.j2").render(title=title, meta=meta, sections=sections) + "\n"


def conformance_data(f) -> dict:
    """Rows: properties; columns: backends; in each cell one chip per dtype, coloured by status."""
    conf = f.conf
    # backends not available here have one "(all)" skip row: the verdict section lists them
    untested = {b for b, g in conf.groupby("backend") if (g["status"] == "skipped").all() and (g["property"] == "(all)").all()}
    shown = conf[~conf["backend"].isin(untested)]
    backends = sorted(set(shown["backend"].astype(str)))
    order = {d: i for i, d in enumerate(DTYPE_SHORT)}
    cells: dict = {}
    for r in shown.itertuples():
        cells.setdefault((str(r.property), str(r.backend)), []).append(r)
    ran = {b: set(g["dtype"].astype(str)) for b, g in shown[shown["status"] != "skipped"].groupby("backend")}
    rows = []
    for prop in sorted(set(shown["property"].astype(str))):
        row = []
        for b in backends:
            found = sorted(cells.get((prop, b), []), key=lambda r: (order.get(str(r.dtype), 99), str(r.dtype)))
            row.append(_chips(found, ran.get(b, set())))
        rows.append({"property": prop, "cells": row})
    legend = [(s, t if s == "passed" else f"{STATUS_MARK[s]} {t}") for s, t in STATUS_TEXT.items()]
    return {"backends": backends, "rows": rows, "legend": legend}


def _chips(found, ran: set) -> list:
    """One chip per dtype, or one for the cell when every dtype says the same (status and message):
    two thousand chips with their tooltips weighed 260 KB of the page."""
    if not found:
        return []
    same = len({(str(r.status), _first_line(r.message), _narrowed(r)) for r in found}) == 1
    if len(found) > 1 and same:
        r = found[0]
        dtypes = [DTYPE_SHORT.get(str(x.dtype), str(x.dtype)) for x in found]
        tried = sorted({int(n) for n in pd.to_numeric(pd.Series([x.examples for x in found]), errors="coerce").dropna()})
        every = {str(x.dtype) for x in found} == ran or r.status == "skipped"
        mark = STATUS_MARK.get(r.status, "?")
        return [{"status": text(r.status), "mark": "",
                 "text": (mark if every else " ".join(dtypes) + " " + mark),
                 "tip": f"{STATUS_TEXT.get(r.status, r.status)} at {', '.join(dtypes)}"
                        + (f"; {'-'.join(map(str, tried[::max(1, len(tried) - 1)]))} problems tried each" if tried else "")
                        + _narrowed(r) + (f": {_first_line(r.message)}" if text(r.message) else "")}]
    return [{"status": text(r.status),
             "tip": f"{r.dtype} {r.status}" + _tried(r.examples) + _narrowed(r)
                    + (f": {_first_line(r.message)}" if text(r.message) else ""),
             "text": DTYPE_SHORT.get(str(r.dtype), str(r.dtype) or "all"),
             "mark": "" if r.status == "passed" else " " + STATUS_MARK.get(r.status, "?")} for r in found]


def _narrowed(r) -> str:
    """What a check did not cover: a fixed grid's problems its declared limits left out, calls declined."""
    left = text(r.outside_limits)
    declined = pd.to_numeric(pd.Series([r.declined]), errors="coerce").fillna(0).iloc[0]
    return "".join(x for x in (f"; {left}" if left else "", f"; {int(declined)} call(s) declined" if declined else ""))


def _tried(examples) -> str:
    n = pd.to_numeric(pd.Series([examples]), errors="coerce").iloc[0]
    return f", {int(n)} problem{'s' if n != 1 else ''} tried" if pd.notna(n) and n > 0 else ""


def _first_line(message) -> str:
    """A tooltip's message: its first line, cut (the failures section has the whole of it)."""
    first = text(message).strip().splitlines()[0] if text(message).strip() else ""
    return first[:160] + ("…" if len(first) > 160 else "")


def semantics_data(f) -> dict:
    sem = f.sem
    backends = sorted(set(sem["backend"]))
    cell: dict = {}  # (question, backend) -> its rows, one per dtype (older results: one)
    for r in sem.itertuples():
        cell.setdefault((r.question, r.backend), []).append(r)
    order = {d: i for i, d in enumerate(reversed(list(DTYPE_SHORT)))}  # float64 first
    rows = []
    for q in sorted(set(sem["question"])):
        cells = []
        for b in backends:
            found = sorted(cell.get((q, b), []), key=lambda r: order.get(text(getattr(r, "dtype", "")), 99))
            cells.append(_semantics_cell(found) if found else None)
        rows.append({"question": q, "cells": cells})
    return {"backends": backends, "rows": rows}


def _semantics_cell(found) -> dict:
    """One backend's answers to one question: "observed" when every dtype agrees, else one
    "dtype: observed" per dtype, so where the answer changes with the dtype shows."""
    agrees = [tri(r.agrees) for r in found]
    kind = "disagree" if False in agrees else "agree" if all(a is True for a in agrees) else "recorded"
    dtypes = [text(getattr(r, "dtype", "")) for r in found]
    relative = {text(r.observed) if text(r.observed) != d else "(the dtype)" for r, d in zip(found, dtypes, strict=True)}
    if len(relative) == 1 or not all(dtypes):
        observed = text(found[0].observed) if len(found) == 1 or relative != {"(the dtype)"} else "the input's dtype"
    else:
        observed = " · ".join(f"{DTYPE_SHORT.get(d, d)}: {text(r.observed)}" for r, d in zip(found, dtypes, strict=True))
    declared = sorted({text(r.declared) if text(r.declared) != d or len(found) == 1 else "the input's dtype"
                       for r, d in zip(found, dtypes, strict=True) if text(r.declared)})
    return {"kind": kind, "observed": observed, "declared": ", ".join(declared)}


def performance_data(f) -> dict:
    """Time, memory and GFLOP/s against T (SVG), and the fitted exponents."""
    head = f.head
    if head.empty:
        return {"measured": False}
    figures = []
    for metric, ylabel, title, k in (("time", "seconds per call", "Time per call", 1.0),
                                      ("memory", "extra MiB per call", "Extra memory per call", 1 / 2 ** 20)):
        figures += [(f"{title}: {op}", svg) for op, svg in plots.metric_vs_T(head, metric, ylabel, f.slopes, scale=k)]
    figures += [(f"Achieved GFLOP/s: {op} (roofline: the measured float32 matmul peak)", svg)
                for op, svg in plots.gflops_vs_T(head, f.peaks)]
    first = head.iloc[0]
    return {"measured": True, "batch": text(first["batch"]), "heads": text(first["heads"]), "E": text(first["E"]),
            "dtype": text(first["dtype"]), "fit_t_min": FIT_T_MIN, "scaling": scaling_data(f.scaling),
            "plots": [(title, Markup(svg)) for title, svg in figures if svg]}  # matplotlib's SVG: its text is escaped


def scaling_data(scaling: pd.DataFrame) -> dict:
    """Exponents side by side: one row per backend and op, time and memory in columns."""
    if scaling.empty:
        return {"key_columns": [], "metrics": [], "rows": []}
    keys = ["backend", "op"] + (["machine"] if "machine" in scaling else [])
    metrics = [m for m in ("time", "memory") if m in set(scaling["metric"])]
    rows = []
    for key, g in scaling.groupby(keys, sort=True):
        by = {r.metric: r for r in g.itertuples()}
        fits = []
        for m in metrics:
            r = by.get(m)
            fits.append(None if r is None else {"exponent": _num(r.exponent, 2), "r2": _num(r.r2, 3),
                                                "n": int(r.n) if "n" in g and pd.notna(r.n) else ""})
        rows.append({"key_values": [text(k) for k in (key if isinstance(key, tuple) else (key,))], "fits": fits})
    return {"key_columns": keys, "metrics": metrics, "rows": rows}


def _num(x, digits: int) -> str:
    return "" if x is None or pd.isna(x) else f"{float(x):.{digits}f}"


def _cell(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) and not pd.isna(v) else text(v)


def worked_data(f) -> dict:
    """Per seed file a count and the errata in full (every number: worked_examples.csv)."""
    df = f.worked
    cols = ("source", "quantity", "kind", "printed", "computed", "agrees", "note")
    rows = [{**{c: _cell(r[c]) if c in r else "" for c in cols}, "erratum": tri(r["agrees"]) is False}
            for _, r in df.iterrows()]
    per_file: dict = {}
    for r in rows:
        n = per_file.setdefault(r["source"], [r["source"], 0, 0, 0])
        n[1] += 1
        n[2] += int(r["kind"] == "input")
        n[3] += int(r["erratum"])
    return {"rows": rows, "errata": [r for r in rows if r["erratum"]], "note": f.worked_note,
            "inputs": sum(r["kind"] == "input" for r in rows), "per_file": [per_file[s] for s in sorted(per_file)]}


def detection_data(f) -> dict:
    """One row per dtype and defect: the smallest d rejected, by this suite and by flash's rule."""
    df = f.detection if f.detection is not None else pd.DataFrame()
    if df.empty:
        return {"rows": [], "note": "Not measured for this report: python tools/detection_power.py --defects "
                                    "tests.defects --out reports/detection-power (then attnspec run or attnspec report "
                                    "reports/out reports/detection-power)."}
    alarms = "flash_rule_control_failed"
    rows = [[text(r.get("dtype")), text(r.get("defect")), text(r.get("smallest_d_rejected")),
             text(r.get("target")), {"True": "yes", "False": "no"}.get(text(r.get("meets_target")), ""),
             text(r.get("flash_rule_smallest_d_rejected")),
             text(r.get(alarms)).replace(" ", ", ") or "none"]
            for _, r in df.iterrows()]
    runs = sorted({text(r) for r in df.get("runs", pd.Series(dtype=object)).dropna()})
    own = sorted({p for v in df.get("control_failed", pd.Series(dtype=object)).dropna() for p in text(v).split()})
    return {"rows": rows, "note": "", "runs": ", ".join(runs), "own_alarms": ", ".join(own)}
