"""The report's tables as pandas DataFrames: what goes into the CSVs and the page."""
from __future__ import annotations

import pandas as pd

from attnspec.reports.inputs import CONFORMANCE_COLUMNS, SEMANTICS_COLUMNS, ReportInputError, merge_conformance, merge_semantics

BENCH_COLUMNS = ("backend", "op", "batch", "heads", "T", "E", "dtype", "metric", "value", "unit", "machine", "commit",
                 "clock", "problem", "kv_heads", "Lq", "Lk", "grid", "page_size")
SCALING_COLUMNS = ("backend", "op", "metric", "exponent", "r2")
WORKED_COLUMNS = ("source", "quantity", "kind", "printed", "computed", "agrees")
FIT_T_MIN = 256  # the O(T^2) term dominates only above a few hundred; below, call overhead does
HEADLINE_E = 64  # the plots and fits use one head dim, so lines compare like with like
PROBLEM_STATUSES = ("failed", "error", "crashed", "timed_out")


def conformance_frame(rows) -> pd.DataFrame:
    df = pd.DataFrame(merge_conformance(rows), columns=list(CONFORMANCE_COLUMNS))
    return df.sort_values(["backend", "property", "dtype"], kind="stable").reset_index(drop=True)


def semantics_frame(rows) -> pd.DataFrame:
    df = pd.DataFrame(merge_semantics(rows), columns=list(SEMANTICS_COLUMNS))
    return df.sort_values(["backend", "question"], kind="stable").reset_index(drop=True)


def benchmarks_frame(asv_dirs, skipped: list | None = None) -> pd.DataFrame:
    """Every asv results folder's rows; with `skipped`, an unreadable results file is named there
    ("path — why") and the rest is read."""
    if not asv_dirs:
        return pd.DataFrame(columns=list(BENCH_COLUMNS))
    from attnspec.reports.asv_results import load_results

    frames = []
    for d in asv_dirs:
        try:
            frames.append(load_results(d, skipped))
        except (OSError, ValueError, KeyError, TypeError) as e:  # corrupt JSON is a ValueError
            raise ReportInputError(f"{d}: cannot read the asv results ({type(e).__name__}: {e})") from None
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(BENCH_COLUMNS))
    return df[list(BENCH_COLUMNS)].drop_duplicates().reset_index(drop=True)


def headline(bench: pd.DataFrame) -> pd.DataFrame:
    """The rows the plots and fits use: one head dim and one dtype (the most measured ones)."""
    if bench.empty:
        return bench
    if "problem" in bench.columns:  # the T sweep only: decode and masked problems have their own sections
        bench = bench[bench["problem"].isna() | (bench["problem"] == "dense")]
    es = bench["E"].dropna()
    e = HEADLINE_E if (es == HEADLINE_E).any() else (es.mode().iloc[0] if len(es) else None)
    sub = bench if e is None else bench[bench["E"] == e]
    dtypes = sub["dtype"].dropna()
    if len(dtypes):
        sub = sub[sub["dtype"] == ("float32" if (dtypes == "float32").any() else dtypes.mode().iloc[0])]
    return sub


def scaling_frame(bench: pd.DataFrame) -> pd.DataFrame:
    """Fitted exponents of time and memory against T (one fit per machine when several)."""
    sub = headline(bench)
    machines = sorted(sub["machine"].dropna().unique()) if not sub.empty else []
    if not machines:
        return pd.DataFrame(columns=list(SCALING_COLUMNS))
    from attnspec.reports.asv_results import fit_scaling

    frames = []
    for machine in machines:
        for metric in ("time", "memory"):
            rows = sub[(sub["machine"] == machine) & (sub["metric"] == metric)]
            if rows.empty:
                continue
            fit = fit_scaling(rows, metric, FIT_T_MIN)
            if len(machines) > 1:
                fit = fit.assign(machine=machine)
            frames.append(fit)
    cols = list(SCALING_COLUMNS) + (["machine"] if len(machines) > 1 else []) + ["n"]  # n: for the page only
    if not frames:
        return pd.DataFrame(columns=cols)
    return pd.concat(frames, ignore_index=True)[cols]


def worked_frame() -> tuple[pd.DataFrame, str]:
    """The seeds' worked examples recomputed, with a note when the spec module is missing."""
    try:
        from attnspec.specs import worked_examples
    except ImportError as e:
        return pd.DataFrame(columns=list(WORKED_COLUMNS) + ["note"]), f"specs.worked_examples unavailable: {e}"
    rows = [_as_dict(r) for r in worked_examples.check()]
    df = pd.DataFrame(rows)
    for col in list(WORKED_COLUMNS) + ["note"]:
        if col not in df:
            df[col] = ""
    return df[list(WORKED_COLUMNS) + ["note"]], ""


def _as_dict(row) -> dict:
    if isinstance(row, dict):
        return row
    if hasattr(row, "_asdict"):
        return row._asdict()
    if hasattr(row, "__dataclass_fields__"):
        return {k: getattr(row, k) for k in row.__dataclass_fields__}
    return dict(zip(list(WORKED_COLUMNS) + ["note"], row, strict=True))


def verdict_frame(conf: pd.DataFrame, sem: pd.DataFrame) -> pd.DataFrame:
    """One line per backend: does it conform, and how many checks passed, failed or were skipped."""
    backends = sorted(set(conf["backend"]) | set(sem["backend"]))
    rows = []
    for b in backends:
        c = conf[conf["backend"] == b]
        counts = c["status"].value_counts()
        n = {s: int(counts.get(s, 0)) for s in ("passed", "failed", "error", "skipped", "crashed", "timed_out",
                                                "deviation")}
        disagree = int(sum(1 for a in sem[sem["backend"] == b]["agrees"] if a is not None and a == False))  # noqa: E712
        if n["crashed"]:
            verdict = "crashed"
        elif n["timed_out"]:
            verdict = "timed out"
        elif n["failed"] or n["error"]:
            bad = n["failed"] + n["error"]
            verdict = f"does not conform ({bad} check{'s' if bad > 1 else ''})"
        elif n["passed"] or n["deviation"]:
            verdict = "conforms" + (f" but for {n['deviation']} declared deviation(s)" if n["deviation"] else "") + (
                f"; {disagree} declaration(s) contradicted" if disagree else "")
        else:
            verdict = "not tested (all skipped)"
        rows.append({"backend": b, "verdict": verdict, "passed": n["passed"], "failed": n["failed"],
                     "error": n["error"], "skipped": n["skipped"], "deviations": n["deviation"],
                     "semantics contradicted": disagree, "reason": _first_reason(c)})
    return pd.DataFrame(rows, columns=["backend", "verdict", "passed", "failed", "error", "skipped", "deviations",
                                       "semantics contradicted", "reason"])


def _first_reason(c: pd.DataFrame) -> str:
    """Why a backend crashed, timed out or was skipped entirely: the first such message."""
    for status in ("crashed", "timed_out"):
        hit = c[c["status"] == status]
        if len(hit):
            return str(hit["message"].iloc[0] or "")
    if len(c) and (c["status"] == "skipped").all():
        return str(c["message"].iloc[0] or "")
    return ""


def speed_summary(bench: pd.DataFrame) -> pd.DataFrame:
    """Forward time at the largest T every backend reached, per machine (for the verdict table)."""
    sub = headline(bench)
    sub = sub[(sub["metric"] == "time") & (sub["op"] == "forward")] if not sub.empty else sub
    if sub.empty:
        return pd.DataFrame(columns=["backend", "machine", "T", "forward time"])
    rows = []
    for (b, m), g in sub.groupby(["backend", "machine"]):
        g = g.dropna(subset=["value"])
        if g.empty:
            continue
        top = g.loc[g["T"].idxmax()]
        rows.append({"backend": b, "machine": m, "T": int(top["T"]), "forward time": _fmt_seconds(top["value"])})
    return pd.DataFrame(rows, columns=["backend", "machine", "T", "forward time"])


def _fmt_seconds(s: float) -> str:
    for unit, k in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= k:
            return f"{s / k:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"
