"""What the suite prints and writes for a person: one block per failure, its rows, the summaries, the JSON.

Each test carries what it found in pytest's own ``user_properties`` (its conformance row, its
semantics answers), so the rows reach the controller of an xdist run, a ``--report-log`` file
and `pytest_runtest_logreport` alike; the status comes from pytest's outcome (a declared
deviation is pytest's xfail; a recorded semantics answer passes and is counted as "recorded").
"""
from __future__ import annotations

import json
import os
import tempfile

STATUSES = ("passed", "failed", "error", "skipped", "recorded", "deviation")
TEST_KEY, ROW_KEY, SEMANTICS_KEY = "attnspec_test", "attnspec_conformance", "attnspec_semantics"
DECLARED_KEY = "attnspec_declared"  # a backend's declared conventions (Backend.conventions), once per process
LONG_HINT = "(the full traceback: --attnspec-tb=long, or -v)"


def verdict_lines(verdict) -> list[str]:
    """A verdict as the suite and the reproducers print it: message, where, how much, allowed."""
    lines = [f"  {line}" for line in verdict.message.splitlines()]
    if verdict.where is not None:
        lines.append(f"  where: {verdict.where}  (index into the tensor named above)")
    if verdict.amount == verdict.amount:  # NaN: no amount (a call that raised)
        lines.append(f"  how much: {verdict.amount:.6g}" + ("" if verdict.limit is None else
                                                             f"  (allowed: {verdict.limit:.6g})"))
    return lines


def headline(failure) -> str:
    """The failure without its reproducer: property, backend, dtype, verdict, problem."""
    lines = [f"{failure.prop.name} failed on backend {failure.target.name!r} at {failure.target.dtype}",
             *verdict_lines(failure.verdict), f"  problem: {failure.case!r}"]
    if failure.attribution:
        lines.append(f"  attribution: {failure.attribution}")
    if failure.flaky:
        lines.append(f"  note: {failure.flaky}")
    return "\n".join(lines)


def shown_path(path: str) -> str:
    """A path relative to the current folder when it lies below it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def block(failure, path: str | None) -> str:
    """The failure as pytest reports it: its headline, the labelled draws of the (shrunk) example
    (not in the headline: a declaration's ``when`` reads that), the reproducer."""
    drawn = f"  drawn: {', '.join(failure.draws)}\n" if getattr(failure, "draws", ()) else ""
    return headline(failure) + "\n" + drawn + (f"  reproducer: python {shown_path(path)}" if path else
                                               "  reproducer: (not written; see the JSON's counterexample)")


# ---- rows --------------------------------------------------------------------------------------

def _found(report, key):
    return [v for k, v in getattr(report, "user_properties", ()) if k == key]


def row_of(report) -> dict | None:
    """The conformance row of a test's report (call, or a failed or skipped setup), else None."""
    test = _found(report, TEST_KEY)
    if not test or not (report.when == "call" or (report.when == "setup" and not report.passed)):
        return None
    part = (_found(report, ROW_KEY) or [{}])[-1]
    semantics = _found(report, SEMANTICS_KEY) if report.when == "call" else []
    if hasattr(report, "wasxfail"):  # a declared deviation, failed as declared
        status = "deviation"
    elif report.passed:
        status = "recorded" if semantics and all(r["agrees"] is None for r in semantics) else "passed"
    elif report.skipped:
        status = "skipped"
    else:
        status = "failed" if part.get("failed") else "error"  # anything but a property's verdict: the harness
    message = part.get("message")
    if message is None and not report.passed:
        message = _longrepr_text(report)
    return dict(test[0], status=status, examples=part.get("examples", 0), seconds=round(report.duration or 0.0, 4),
                counterexample=part.get("counterexample"), message=message, reproducer=part.get("reproducer"),
                attribution=part.get("attribution", ""), hung=part.get("hung", ""),
                declined=part.get("declined", 0), outside_limits=part.get("outside_limits", ""))


def _longrepr_text(report) -> str:
    """What pytest says of a skip or a failure (a report object, or a --report-log entry of one)."""
    lr = report.longrepr
    if isinstance(lr, (tuple, list)) and len(lr) == 3:  # a skip: (path, line, "Skipped: why")
        return str(lr[2]).removeprefix("Skipped: ")
    if hasattr(report, "wasxfail"):
        return report.wasxfail
    crash = lr.get("reprcrash") if isinstance(lr, dict) else getattr(lr, "reprcrash", None)
    message = (crash or {}).get("message") if isinstance(crash, dict) else getattr(crash, "message", None)
    return (message or str(lr))[:4000]


def semantics_of(report) -> list:
    return _found(report, SEMANTICS_KEY) if report.when == "call" else []


def declared_of(report) -> list:
    """The declared conventions a test's report carries (the first test of each backend in a process)."""
    return _found(report, DECLARED_KEY)


def run_record(run) -> dict:
    """What the JSON says of the run itself: its profile, seed (and where it came from), examples."""
    if run is None:
        return {}
    o = run.options
    return {"profile": run.profile, "seed": o.seed, "seed_from": run.seed_from, "examples": o.examples,
            "again": f"--hypothesis-seed={o.seed}"}


def write_json(path: str, rows: dict) -> None:
    """Atomically: a reader never sees half a file."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".attnspec-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(rows, f, indent=1, default=str)
    os.replace(tmp, path)


# ---- the terminal summary ------------------------------------------------------------------------

def per_backend(rows) -> dict:
    """backend -> {status: count, "seconds": total, "examples": total}."""
    per: dict = {}
    for r in rows:
        s = per.setdefault(r["backend"], dict.fromkeys(STATUSES, 0) | {"seconds": 0.0, "examples": 0})
        s[r["status"]] = s.get(r["status"], 0) + 1
        s["seconds"] += r.get("seconds") or 0.0
        s["examples"] += r.get("examples") or 0
    return per


def count_words(counts: dict) -> str:
    """'3 passed, 1 failed' in pytest's order, zero counts left out ('deviation': pytest's xfailed)."""
    return ", ".join(f"{counts[s]} {s}" for s in ("failed", "passed", "skipped", "error", "recorded", "deviation")
                     if counts.get(s))


def _checked(s: dict) -> int:
    """Checks that ran: a declared deviation ran (and was seen) too."""
    return s["passed"] + s["failed"] + s["error"] + s.get("deviation", 0)


def backend_lines(rows) -> list[str]:
    per = per_backend(rows)
    width = max([len(b) for b in per] + [8])
    out = [f"{name:{width}s} {s['passed']:4d} passed {s['failed']:3d} failed {s['error']:3d} error "
           f"{s['skipped']:4d} skipped {s['recorded']:3d} recorded {s['examples']:6d} problems {s['seconds']:7.1f} s"
           + (f"  {s['deviation']} declared deviation(s) (pytest: xfailed)" if s.get("deviation") else "")
           + ("  NOT TESTED: every check skipped" if s["skipped"] and not _checked(s) else "")
           for name, s in per.items()]
    total = {st: sum(s[st] for s in per.values()) for st in STATUSES}
    out.append(f"{'all':{width}s} {count_words(total) or 'nothing ran'}")
    return out


def attribution_lines(rows) -> list[str]:
    """Which features the failures need: per backend and attribution, the properties (and dtypes)."""
    groups: dict = {}
    for r in rows:
        if r["status"] == "failed" and r.get("attribution"):
            groups.setdefault((r["backend"], r["attribution"]), {}).setdefault(r["property"], []).append(r["dtype"])
    return [f"{backend}: {len(props)} propert{'y' if len(props) == 1 else 'ies'} {attribution} - "
            + ", ".join(f"{p}[{','.join(d)}]" for p, d in props.items()) for (backend, attribution), props in groups.items()]


def examples_lines(rows, dtype_order) -> list[str]:
    """Problems tried per property, backend and dtype (a property x backend a line)."""
    table: dict = {}
    for r in rows:
        if r["property"].startswith("("):
            continue
        table.setdefault((r["backend"], r["property"]), {})[r["dtype"]] = r.get("examples") or 0
    dtypes = [d for d in dtype_order if any(d in cells for cells in table.values())]
    if not table:
        return []
    wb = max(len(b) for b, _ in table)
    wp = max(len(p) for _, p in table)
    out = [f"{'backend':{wb}s}  {'property':{wp}s}  " + "  ".join(f"{d:>8s}" for d in dtypes)]
    for (backend, prop), cells in table.items():
        out.append(f"{backend:{wb}s}  {prop:{wp}s}  " + "  ".join(
            f"{cells[d]:8d}" if d in cells else f"{'-':>8s}" for d in dtypes))
    return out


def limits_lines(rows) -> list[str]:
    """The checks a backend's declared limits narrowed, or in which it declined calls: a property x dtype a
    line, never shown as a plain pass (a fixed grid's problems outside the limits were not checked)."""
    out = []
    for r in rows:
        left, declined = r.get("outside_limits") or "", r.get("declined") or 0
        if left or declined:
            said = "; ".join(x for x in (left, f"{declined} call(s) declined" if declined else "") if x)
            out.append(f"{r['backend']} {r['property']}[{r['dtype']}]: {r['status']}, "
                       f"{r.get('examples') or 0} problems checked; {said}")
    return out


def _cell(row) -> str:
    agrees = row.get("agrees")
    mark = "" if agrees is None else " ok" if agrees else f" (declared {row['declared']}) CONTRADICTS"
    return f"{row['observed']}{mark}"


def semantics_lines(rows, dtype_order) -> list[str]:
    """One line per backend and question, one column per dtype; where the answer changes with
    the dtype the line says so."""
    table: dict = {}
    for r in sorted(rows, key=lambda r: r["backend"]):  # stable: questions keep their order
        table.setdefault((r["backend"], r["question"]), {})[r.get("dtype") or "-"] = r
    dtypes = sorted({d for cells in table.values() for d in cells},
                    key=lambda d: (dtype_order.index(d) if d in dtype_order else len(dtype_order), d))
    if not table:
        return []
    cells = {key: {d: _cell(r) for d, r in row.items()} for key, row in table.items()}
    wb = max(len(b) for b, _ in table)
    wq = max(len(q) for _, q in table)
    wd = {d: max([len(d)] + [len(c.get(d, "")) for c in cells.values()]) for d in dtypes}
    out = [f"{'backend':{wb}s}  {'question':{wq}s}  " + "  ".join(f"{d:{wd[d]}s}" for d in dtypes)]
    for (backend, question), row in table.items():
        observed = {"(the dtype)" if r["observed"] == d else r["observed"] for d, r in row.items()}  # relative
        note = "  <- changes with the dtype" if len(observed) > 1 else ""
        out.append(f"{backend:{wb}s}  {question:{wq}s}  "
                   + "  ".join(f"{cells[(backend, question)].get(d, '-'):{wd[d]}s}" for d in dtypes) + note)
    return out
