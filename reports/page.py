"""index.html: one self-contained page (inline CSS and SVG; no script, no font, no CDN).

Every value that reaches the page goes through `esc` or pandas' escaping: backend names,
messages and counterexamples are text from code we do not control.
"""
from __future__ import annotations

import html

import pandas as pd

STATUS_TEXT = {"passed": "passed", "failed": "failed", "skipped": "skipped", "error": "error",
               "crashed": "crashed", "timed_out": "timed out"}
CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;color:#1d2430;background:#fff}
main{max-width:1360px;margin:0 auto;padding:24px 32px 64px}
h1{font-size:26px;margin:0 0 4px} h2{font-size:20px;margin:40px 0 8px;padding-bottom:4px;border-bottom:2px solid #e3e7ee}
h3{font-size:15px;margin:20px 0 6px} p.lead,p.note{color:#566074;margin:4px 0 12px;max-width:900px}
table{border-collapse:collapse;font-size:13px;margin:6px 0 14px}
th,td{border:1px solid #dde2ea;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f8;font-weight:600} td.num{text-align:right;font-variant-numeric:tabular-nums}
table.matrix td{text-align:center;min-width:46px;padding:3px 4px} table.matrix th{font-size:12px} table.matrix td.prop,table.matrix th.prop{text-align:left;white-space:nowrap}
.passed,.agree{background:#d9f2df;color:#145c2a} .failed,.disagree{background:#f9d0d3;color:#8a1220;font-weight:600}
.error{background:#ffd9b3;color:#7a3b00;font-weight:600} .skipped,.none{background:#f1f2f4;color:#7b8494}
.crashed{background:#e7d4f5;color:#52157a;font-weight:600} .timed_out{background:#fff1b8;color:#6b5200;font-weight:600}
.recorded{background:#e6eefb;color:#1f3f73} tr.erratum td{background:#fdecee}
.chip{display:inline-block;min-width:24px;padding:1px 3px;margin:1px;border-radius:3px;font-size:10.5px;white-space:nowrap;text-align:center}
td.chips{white-space:nowrap;text-align:left} .scroll{overflow-x:auto}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px}
.legend span{margin-right:6px} .legend{font-size:12px;margin:4px 0 10px}
details.failure{border:1px solid #f1c0c5;border-left:4px solid #c8283a;border-radius:4px;margin:8px 0;padding:6px 10px;background:#fffafa}
details.failure summary{cursor:pointer;font-size:13px} details.failure p{margin:6px 0;font-size:13px} .short{color:#566074;font-size:12px;margin-left:18px}
pre{background:#f6f8fa;border:1px solid #e3e7ee;padding:8px;overflow-x:auto;font-size:12px;white-space:pre-wrap;word-break:break-word;max-height:420px}
svg.plot{width:100%;height:auto;max-width:1200px;display:block;margin:6px 0 12px}
td.why{max-width:360px;overflow-wrap:anywhere;font-size:12px} td.nowrap,th.nowrap{white-space:nowrap;font-variant-numeric:tabular-nums} .meta{font-size:12px;color:#6b7485} code{background:#f3f5f8;padding:0 4px;border-radius:3px}
"""


def esc(x) -> str:
    if x is None or (isinstance(x, float) and pd.isna(x)):
        return ""
    return html.escape(str(x), quote=True)


def tri(x):
    """True, False or None (not declared / unknown), whatever pandas made of the column."""
    if x is None or (isinstance(x, float) and pd.isna(x)):
        return None
    if isinstance(x, str):
        return {"true": True, "false": False}.get(x.strip().lower())
    return bool(x)


def frame_html(df: pd.DataFrame, classes: str = "") -> str:
    if df.empty:
        return '<p class="note">(none)</p>'
    return df.to_html(index=False, escape=True, na_rep="", border=0, classes=classes or None)


def legend(classes) -> str:
    return '<div class="legend">' + "".join(
        f'<span class="badge {c}">{esc(t)}</span>' for c, t in classes) + "</div>"


def _untested(verdicts: pd.DataFrame) -> pd.Series:
    return verdicts["verdict"].str.startswith("not tested")


def verdict_section(verdicts: pd.DataFrame, speed: pd.DataFrame) -> str:
    """The table of tested backends, then one line per reason for those not available here."""
    if verdicts.empty:
        return '<p class="note">No conformance results.</p>'
    tested, untested = verdicts[~_untested(verdicts)], verdicts[_untested(verdicts)]
    speed_by = {b: g for b, g in speed.groupby("backend")} if not speed.empty else {}
    several = not speed.empty and speed["machine"].nunique() > 1
    has_reason = bool(tested["reason"].astype(str).str.len().sum())
    head = ["backend", "verdict", "passed", "failed", "error", "skipped", "declarations contradicted",
            "forward time at the largest T"] + (["why"] if has_reason else [])
    rows = []
    for _, r in tested.iterrows():
        kind = ("crashed" if r["verdict"] == "crashed" else "timed_out" if r["verdict"] == "timed out"
                else "failed" if r["verdict"].startswith("does not") else "passed")
        times = speed_by.get(r["backend"])
        t = "" if times is None else "<br>".join(
            f"{esc(x['forward time'])} (T={int(x['T'])})" + (f" on {esc(x['machine'])}" if several else "")
            for _, x in times.iterrows())
        cells = [f'<td class="nowrap"><b>{esc(r["backend"])}</b></td>', f'<td class="{kind} nowrap">{esc(r["verdict"])}</td>']
        cells += [f'<td class="num">{int(r[c])}</td>' for c in ("passed", "failed", "error", "skipped", "semantics contradicted")]
        cells += [f'<td class="nowrap">{t}</td>'] + ([f'<td class="why">{esc(r["reason"])}</td>'] if has_reason else [])
        rows.append("<tr>" + "".join(cells) + "</tr>")
    out = ("<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>"
           + "".join(rows) + "</tbody></table>") if len(tested) else ""
    for reason, g in untested.groupby("reason", sort=True):
        out += (f'<p class="note">Not tested here ({esc(reason or "every check skipped")}): '
                f"{esc(', '.join(sorted(g['backend'])))}.</p>")
    return out


DTYPE_SHORT = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64"}
STATUS_MARK = {"passed": "✓", "failed": "✗", "skipped": "–", "error": "!", "crashed": "‼", "timed_out": "…"}


def conformance_matrix(conf: pd.DataFrame) -> str:
    """Rows: properties; columns: backends; in each cell one chip per dtype, coloured by status."""
    if conf.empty:
        return '<p class="note">No conformance results.</p>'
    # backends not available here have one "(all)" skip row: the verdict section lists them
    untested = {b for b, g in conf.groupby("backend") if (g["status"] == "skipped").all() and (g["property"] == "(all)").all()}
    conf = conf[~conf["backend"].isin(untested)]
    backends = list(dict.fromkeys(sorted(conf["backend"].astype(str))))
    order = {d: i for i, d in enumerate(DTYPE_SHORT)}
    cells: dict = {}
    for r in conf.itertuples():
        cells.setdefault((str(r.property), str(r.backend)), []).append(r)
    body = []
    for prop in sorted(set(conf["property"].astype(str))):
        tds = []
        for b in backends:
            chips = []
            for r in sorted(cells.get((prop, b), []), key=lambda r: (order.get(str(r.dtype), 99), str(r.dtype))):
                tip = f"{r.dtype} {r.status}" + (f": {r.message}" if r.message else "")
                text = DTYPE_SHORT.get(str(r.dtype), str(r.dtype) or "all")
                mark = "" if r.status == "passed" else " " + STATUS_MARK.get(r.status, "?")
                chips.append(f'<span class="chip {esc(r.status)}" title="{esc(tip)}">{esc(text)}{mark}</span>')
            tds.append(f'<td class="chips">{"".join(chips)}</td>' if chips else '<td class="none"></td>')
        body.append(f'<tr><td class="prop">{esc(prop)}</td>{"".join(tds)}</tr>')
    head = "".join(f"<th>{esc(b)}</th>" for b in backends)
    keys = legend((s, t if s == "passed" else f"{STATUS_MARK[s]} {t}") for s, t in STATUS_TEXT.items())
    return (keys + f'<div class="scroll"><table class="matrix"><thead><tr><th class="prop">property</th>{head}</tr>'
            + f"</thead><tbody>{''.join(body)}</tbody></table></div>")


OPEN_FAILURES = 6  # the first few unfolded; the rest one line each, a click away


def failures(conf: pd.DataFrame) -> str:
    """Each failed, erroring, crashed or timed-out check: message and shrunk counterexample."""
    bad = conf[conf["status"].isin(["failed", "error", "crashed", "timed_out"])]
    if bad.empty:
        return '<p class="note">No failures.</p>'
    out = [f'<p class="note">{len(bad)} problem(s); click a line to unfold it.</p>'] if len(bad) > OPEN_FAILURES else []
    for i, r in enumerate(bad.itertuples()):
        message = "" if r.message is None or pd.isna(r.message) else str(r.message)
        first = message.strip().splitlines()[0] if message.strip() else ""
        short = first[:140] + ("…" if len(first) > 140 else "")
        detail = f"<pre>{esc(message)}</pre>" if message.strip() != short else ""
        if r.counterexample is not None and not pd.isna(r.counterexample) and str(r.counterexample):
            detail += f"<p>Minimal counterexample (copy, paste, run):</p><pre>{esc(r.counterexample)}</pre>"
        extra = f" · {int(r.examples)} examples" if pd.notna(r.examples) and str(r.examples) != "" else ""
        extra += f" · {float(r.seconds):.1f} s" if pd.notna(r.seconds) and str(r.seconds) != "" else ""
        out.append(f'<details class="failure"{" open" if i < OPEN_FAILURES else ""}><summary>'
                   f'<span class="badge {esc(r.status)}">{STATUS_TEXT.get(r.status, esc(r.status))}</span> '
                   f"<b>{esc(r.backend)}</b> · <code>{esc(r.property)}</code> · {esc(r.dtype)}{esc(extra)}"
                   f'<br><span class="short">{esc(short)}</span></summary>{detail}</details>')
    return "".join(out)


def semantics_matrix(sem: pd.DataFrame) -> str:
    if sem.empty:
        return '<p class="note">No semantics results.</p>'
    backends = sorted(set(sem["backend"]))
    cell = {(r.question, r.backend): r for r in sem.itertuples()}
    body = []
    for q in sorted(set(sem["question"])):
        tds = []
        for b in backends:
            r = cell.get((q, b))
            if r is None:
                tds.append('<td class="none"></td>')
                continue
            agrees = tri(r.agrees)
            kind = "agree" if agrees is True else "disagree" if agrees is False else "recorded"
            declared = "" if esc(r.declared) == "" else f"<br><small>declared: {esc(r.declared)}</small>"
            tds.append(f'<td class="{kind}">{esc(r.observed)}{declared}</td>')
        body.append(f'<tr><td class="prop">{esc(q)}</td>{"".join(tds)}</tr>')
    head = "".join(f"<th>{esc(b)}</th>" for b in backends)
    return (legend([("agree", "as declared"), ("disagree", "contradicts its declaration"),
                    ("recorded", "recorded (nothing declared)")])
            + f'<table class="matrix"><thead><tr><th class="prop">question</th>{head}</tr></thead>'
            + f"<tbody>{''.join(body)}</tbody></table>")


def _cell(v) -> str:
    if isinstance(v, float):
        return esc(f"{v:.6g}")
    return esc(v)


def _rows_table(df: pd.DataFrame, columns, erratum_rows: bool) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    rows = []
    for _, r in df.iterrows():
        bad = erratum_rows and tri(r["agrees"]) is False
        rows.append(("<tr class=\"erratum\">" if bad else "<tr>")
                    + "".join(f'<td class="nowrap">{_cell(r[c])}</td>' if c in ("printed", "computed", "agrees")
                            else f"<td>{_cell(r[c])}</td>" for c in columns) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def worked_table(df: pd.DataFrame, note: str) -> str:
    """Per seed file a count, the errata in full, and every number behind a disclosure."""
    if df.empty:
        return f'<p class="note">{esc(note or "No worked examples.")}</p>'
    bad = df[[tri(v) is False for v in df["agrees"]]]
    per_file = df.assign(erratum=[tri(v) is False for v in df["agrees"]]).groupby("source")["erratum"].agg(["size", "sum"])
    per_file = per_file.rename(columns={"size": "numbers", "sum": "errata"}).reset_index()
    summary = (f'<p class="note">{len(df)} printed numbers from {len(per_file)} seed files recomputed; '
               f'<b>{len(bad)} {"erratum" if len(bad) == 1 else "errata"}</b>.</p>')
    out = summary + frame_html(per_file)
    if len(bad):
        out += "<h3>Errata</h3>" + _rows_table(bad, ["source", "quantity", "printed", "computed", "note"], True)
    out += (f"<details><summary>All {len(df)} numbers</summary>"
            + _rows_table(df, ["source", "quantity", "printed", "computed", "agrees", "note"], True) + "</details>")
    return out


def scaling_table(scaling: pd.DataFrame) -> str:
    """Exponents side by side: one row per backend and op, time and memory in columns."""
    if scaling.empty:
        return '<p class="note">Not enough T values above the fit range for a slope.</p>'
    keys = ["backend", "op"] + (["machine"] if "machine" in scaling else [])
    metrics = [m for m in ("time", "memory") if m in set(scaling["metric"])]
    head = "".join(f"<th>{esc(k)}</th>" for k in keys) + "".join(
        f"<th>{m} exponent</th><th>{m} r²</th><th>points</th>" for m in metrics)
    rows = []
    for key, g in scaling.groupby(keys, sort=True):
        by = {r.metric: r for r in g.itertuples()}
        tds = "".join(f"<td>{esc(k)}</td>" for k in (key if isinstance(key, tuple) else (key,)))
        for m in metrics:
            r = by.get(m)
            n = int(r.n) if r is not None and "n" in g and pd.notna(r.n) else ""
            tds += ('<td class="num"></td>' * 3 if r is None else
                    f'<td class="num"><b>{_num(r.exponent, 2)}</b></td><td class="num">{_num(r.r2, 3)}</td>'
                    f'<td class="num">{n}</td>')
        rows.append(f"<tr>{tds}</tr>")
    return (f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
            '<p class="note">points: the T values in the fit; with two, r² is 1 by construction.</p>')


def _num(x, digits: int) -> str:
    return "" if x is None or pd.isna(x) else f"{float(x):.{digits}f}"


def page(title: str, meta: str, sections) -> str:
    nav = " · ".join(f'<a href="#{esc(anchor)}">{esc(name)}</a>' for anchor, name, _ in sections)
    body = "".join(f'<section id="{esc(anchor)}"><h2>{esc(name)}</h2>{content}</section>'
                   for anchor, name, content in sections)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>"
            f'<h1>{esc(title)}</h1><p class="meta">{meta}</p><p class="meta">{nav}</p>{body}{FOOTER}</main></body></html>\n')


FOOTER = ('<hr><p class="meta">The tables are in the CSV files beside this page; raw/ keeps the results it was '
          "built from. <code>attnspec report</code> rebuilds it; <code>attnspec report A B</code> merges report "
          "folders, suite JSON files and asv results folders from several machines.</p>")
