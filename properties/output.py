"""What the suite prints and writes for a person: one block per failure, reproducer files, summaries.

A failure is a short block (backend, dtype, property, where and how much, the shrunk problem,
and the path of a file holding its reproducer), not pytest's traceback through the backend's
source and Hypothesis' explanation; ``--attnspec-tb=long`` (or ``-v``) brings the traceback back.
The per-backend counts use pytest's own words (passed, failed, error, skipped, recorded), so the
summary agrees with pytest's closing line.
"""
from __future__ import annotations

import os
import re
import textwrap

STATUSES = ("passed", "failed", "error", "skipped", "recorded", "deviation")
REPRO_DIR = os.path.join(".attnspec", "repro")  # under the rootdir when no JSON path says otherwise
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def repro_dir(json_path: str | None, rootdir: str) -> str:
    """Where reproducers go: beside the JSON (<name>-repro/) when there is one, else .attnspec/repro."""
    if json_path:
        stem = os.path.splitext(os.path.abspath(json_path))[0]
        return stem + "-repro"
    return os.path.join(rootdir, REPRO_DIR)


def repro_name(backend: str, dtype: str, prop: str, n: int = 0) -> str:
    stem = "-".join(_UNSAFE.sub("_", part).strip("_") or "_" for part in (backend, dtype, prop))
    return f"{stem}{'' if n == 0 else f'-{n + 1}'}.py"


def write_reproducer(folder: str, failure, n: int = 0) -> str:
    """The failure's snippet as a runnable file (its headline as comments on top); the file's path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, repro_name(failure.backend, failure.dtype, failure.prop, n))
    head = "\n".join("# " + line for line in failure.headline.splitlines())
    text = (f"{head}\n#\n# Reproducer written by attnspec: python {os.path.basename(path)}\n"
            f"{failure.snippet}\n")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def forget_reproducers(folder: str, backend: str, dtype: str, prop: str) -> None:
    """A check that passes now: its reproducers from an earlier run would mislead."""
    first = repro_name(backend, dtype, prop)
    stem = first[:-3]
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if name == first or (name.startswith(stem + "-") and name[len(stem) + 1:-3].isdigit()):
            try:
                os.remove(os.path.join(folder, name))
            except OSError:
                pass


def shown_path(path: str) -> str:
    """A path relative to the current folder when it lies below it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def failure_block(failure, path: str | None) -> str:
    """The failure without its snippet, and where the snippet is."""
    lines = [failure.headline]
    lines.append(f"  reproducer: python {shown_path(path)}" if path else
                 "  reproducer: (not written; see the JSON's counterexample)")
    return "\n".join(lines)


LONG_HINT = "(the full traceback: --attnspec-tb=long, or -v)"


def per_backend(rows) -> dict:
    """backend -> {status: count, "seconds": total}."""
    per: dict = {}
    for r in rows:
        s = per.setdefault(r["backend"], dict.fromkeys(STATUSES, 0) | {"seconds": 0.0})
        s[r["status"]] = s.get(r["status"], 0) + 1
        s["seconds"] += r.get("seconds") or 0.0
    return per


def count_words(counts: dict) -> str:
    """'3 passed, 1 failed' in pytest's order, zero counts left out."""
    return ", ".join(f"{counts[s]} {s}" for s in ("failed", "passed", "skipped", "error", "recorded", "deviation")
                     if counts.get(s))


def _checked(s: dict) -> int:
    """Checks that ran: a declared deviation ran (and was seen) too."""
    return s["passed"] + s["failed"] + s["error"] + s.get("deviation", 0)


def backend_lines(rows) -> list[str]:
    per = per_backend(rows)
    width = max([len(b) for b in per] + [8])
    out = [f"{name:{width}s} {s['passed']:4d} passed {s['failed']:3d} failed {s['error']:3d} error "
           f"{s['skipped']:4d} skipped {s['recorded']:3d} recorded {s['seconds']:7.1f} s"
           + (f"  {s['deviation']} declared deviation(s)" if s.get("deviation") else "")
           + ("  NOT TESTED: every check skipped" if s["skipped"] and not _checked(s) else "")
           for name, s in per.items()]
    total = {st: sum(s[st] for s in per.values()) for st in STATUSES}
    out.append(f"{'all':{width}s} {count_words(total) or 'nothing ran'} (as pytest counts them)")
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


def wrap(text: str, indent: str = "  ") -> str:
    return textwrap.indent(text, indent)
