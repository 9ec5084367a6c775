"""The page's answer first: the verdict per backend, then the failures, then the declared deviations.

A reader opening the report wants to know, per backend, whether it conforms, which properties it
fails (at which dtypes), and which departures it declares; the failures follow with their
shrunk problem and reproducer, and the declared deviations - known, documented choices, never
failures - sit in their own folded section.
"""
from __future__ import annotations

import re

import pandas as pd

from attnspec.reports.inputs import NOT_ATTEMPTED
from attnspec.reports.tables import PROBLEM_STATUSES

DTYPE_SHORT = {"float64": "f64", "float32": "f32", "bfloat16": "bf16", "float16": "f16", "float8_e4m3fn": "e4m3",
               "float8_e5m2": "e5m2"}
STATUS_TEXT = {"passed": "passed", "failed": "failed", "skipped": "skipped", "error": "error",
               "crashed": "crashed", "timed_out": "timed out", "recorded": "recorded (nothing declared)",
               "deviation": "declared deviation"}
KIND_TEXT = {"crashed": "crashed", "timed_out": "timed out", "failed": "does not conform",
             "deviation": "conforms with declared deviations", "passed": "conforms"}
KIND_ORDER = ("crashed", "timed_out", "failed", "deviation", "passed")  # the table's order: worst first
OPEN_FAILURES = 3  # the first few unfolded; the rest one line each, a click away
_ANCHOR = re.compile(r"[^A-Za-z0-9_-]+")


def text(x) -> str:
    """A cell's text: '' for missing values (None, NaN), else str."""
    if x is None or (isinstance(x, float) and pd.isna(x)):
        return ""
    return str(x)


def tri(x):
    """True, False or None (not declared / unknown), whatever pandas made of the column."""
    if x is None or (isinstance(x, float) and pd.isna(x)):
        return None
    if isinstance(x, str):
        return {"true": True, "false": False}.get(x.strip().lower())
    return bool(x)


def anchor(*parts) -> str:
    return "f-" + "-".join(_ANCHOR.sub("_", text(p)) for p in parts)


def short_dtypes(dtypes) -> str:
    order = list(DTYPE_SHORT)
    found = sorted({text(d) for d in dtypes}, key=lambda d: (order.index(d) if d in order else 9, d))
    return ", ".join(DTYPE_SHORT.get(d, d or "all") for d in found)


def _by_property(rows: pd.DataFrame) -> list:
    """[(property, "f32, f16", anchor of its first entry)] in property order."""
    out = []
    for prop, g in rows.groupby("property", sort=True):
        first = g.iloc[0]
        out.append({"property": text(prop), "dtypes": short_dtypes(g["dtype"]),
                    "anchor": anchor(first["backend"], prop, first["dtype"])})
    return out


_FINDING = re.compile(r"docs/findings\.md: ([\w-]+)")


def _declared(message) -> tuple:
    """(why, observed) of a deviation row's message ('declared deviation: WHY | observed: WHAT')."""
    why, _, observed = text(message).partition(" | observed: ")
    why = why.removeprefix("declared deviation: ").removeprefix("declared deviation not seen in this run: ")
    return why, (observed.strip().splitlines()[0] if observed.strip() else "")


def short_why(why: str) -> str:
    """A declared deviation in a few words: its finding's id when it names one, else its start."""
    found = _FINDING.search(why)
    if found:
        return found.group(1)
    head = re.split(r" \(|: |; |, ", why, maxsplit=1)[0]
    return head[:48] + ("…" if len(head) > 48 else "")


def _by_declaration(rows: pd.DataFrame) -> list:
    """[{why, short, properties, dtypes, anchor}] - one per declared deviation the rows show."""
    groups: dict = {}
    for r in rows.itertuples():
        groups.setdefault(_declared(r.message)[0], []).append(r)
    out = []
    for why, rs in groups.items():
        props = sorted({text(r.property) for r in rs})
        out.append({"why": why, "short": short_why(why), "properties": props, "dtypes": short_dtypes(r.dtype for r in rs),
                    "anchor": anchor(rs[0].backend, "deviation", short_why(why)),
                    "problems": int(pd.to_numeric(pd.Series([r.examples for r in rs]), errors="coerce").fillna(0).sum()),
                    "observed": _declared(rs[0].message)[1]})
    return out


def _untested(verdicts: pd.DataFrame) -> pd.Series:
    return verdicts["verdict"].str.startswith("not tested")


def _examples(c: pd.DataFrame) -> int:
    return int(pd.to_numeric(c["examples"], errors="coerce").fillna(0).sum())


def verdict_data(f) -> dict:
    """One row per tested backend, worst first; one line per reason for the backends not tested here."""
    conf, sem, verdicts, speed = f.conf, f.sem, f.verdicts, f.speed
    tested, untested = verdicts[~_untested(verdicts)], verdicts[_untested(verdicts)]
    speed_by = {b: g for b, g in speed.groupby("backend")} if not speed.empty else {}
    several = not speed.empty and speed["machine"].nunique() > 1
    rows = []
    for _, r in tested.iterrows():
        b = r["backend"]
        c = conf[conf["backend"] == b]
        bad = c[c["status"].isin(PROBLEM_STATUSES) & ~c["message"].astype(str).str.startswith(NOT_ATTEMPTED)]
        kind = ("crashed" if r["verdict"] == "crashed" else "timed_out" if r["verdict"] == "timed out"
                else "failed" if r["verdict"].startswith("does not") else
                "deviation" if int(r.get("deviations", 0) or 0) else "passed")
        ran = c[c["status"] != "skipped"]
        s = sem[sem["backend"] == b] if not sem.empty else sem
        contradicted = [f"{text(x.question)} [{DTYPE_SHORT.get(text(x.dtype), text(x.dtype))}]"
                        for x in s.itertuples() if tri(x.agrees) is False]
        times = speed_by.get(b)
        rows.append({"backend": text(b), "kind": kind, "verdict": KIND_TEXT[kind], "dtypes": short_dtypes(ran["dtype"]),
                     "fails": _by_property(bad), "deviates": _by_declaration(c[c["status"] == "deviation"]),
                     "contradicted": contradicted, "reason": text(r["reason"]),
                     "checks": len(ran), "problems": _examples(c),
                     "narrowed": int((ran["outside_limits"].fillna("").astype(str) != "").sum()),
                     "skipped": int((c["status"] == "skipped").sum()),
                     "times": [] if times is None else [
                         f"{x['forward time']} (T={int(x['T'])})" + (f" on {x['machine']}" if several else "")
                         for _, x in times.iterrows()]})
    rows.sort(key=lambda x: (KIND_ORDER.index(x["kind"]), x["backend"]))
    counts = {k: sum(x["kind"] == k for x in rows) for k in KIND_ORDER}
    summary = " · ".join(f"{KIND_TEXT[k]}: {n}" for k, n in counts.items() if n)
    return {"tested": rows, "summary": summary, "timed": any(x["times"] for x in rows),
            "untested": [{"reason": text(reason) or "every check skipped", "backends": ", ".join(sorted(g["backend"]))}
                         for reason, g in untested.groupby("reason", sort=True)]}


def failures_data(f) -> dict:
    """Each failed, erroring, crashed or timed-out check: where, what, the features it needs, the reproducer.

    The checks a hung backend never ran are one entry per backend, not one each."""
    conf = f.conf
    out, skipped_after_hang = [], {}
    for r in conf[conf["status"].isin(PROBLEM_STATUSES)].itertuples():
        message = text(r.message)
        if message.startswith(NOT_ATTEMPTED):
            skipped_after_hang.setdefault((text(r.backend), message), []).append(f"{r.property} [{r.dtype}]")
            continue
        first = message.strip().splitlines()[0] if message.strip() else ""
        short = first[:160] + ("…" if len(first) > 160 else "")
        tried = pd.to_numeric(pd.Series([r.examples]), errors="coerce").iloc[0]
        extra = f" · {int(tried)} problems tried" if pd.notna(tried) else ""
        seconds = pd.to_numeric(pd.Series([r.seconds]), errors="coerce").iloc[0]
        extra += f" · {float(r.seconds):.1f} s" if pd.notna(seconds) else ""
        out.append({"status": text(r.status), "label": STATUS_TEXT.get(r.status, text(r.status)),
                    "anchor": anchor(r.backend, r.property, r.dtype),
                    "backend": text(r.backend), "property": text(r.property), "dtype": text(r.dtype), "extra": extra,
                    "short": short, "message": message if message.strip() != short else "",
                    "attribution": text(getattr(r, "attribution", "")), "counterexample": text(r.counterexample)})
    for (backend, message), checks in skipped_after_hang.items():  # after the backend's other entries
        at = max((i + 1 for i, x in enumerate(out) if x["backend"] == backend), default=len(out))
        out.insert(at, {"status": "failed", "label": "not attempted", "backend": backend, "anchor": anchor(backend, "hang"),
                        "property": f"{len(checks)} checks", "dtype": "", "extra": "", "attribution": "",
                        "short": message[len(NOT_ATTEMPTED):], "counterexample": "",
                        "message": "Not attempted: " + ", ".join(checks)})
    return {"failures": out, "open_failures": OPEN_FAILURES}


def deviations_data(f) -> dict:
    """Declared deviations, one row per backend and declaration: what the backend declares, the
    properties and dtypes where the run saw it, what it observed.  Known departures: listed,
    never counted as failures."""
    conf = f.conf
    dev = conf[conf["status"] == "deviation"]
    rows = []
    for backend, g in dev.groupby("backend", sort=True):
        for d in _by_declaration(g):
            observed = d["observed"]
            rows.append({"backend": text(backend), "anchor": d["anchor"], "short": d["short"], "declared": d["why"],
                         "properties": ", ".join(d["properties"]), "count": len(d["properties"]), "dtypes": d["dtypes"],
                         "observed": observed[:200] + ("…" if len(observed) > 200 else ""), "problems": d["problems"]})
    return {"rows": rows, "backends": len({r["backend"] for r in rows})}
