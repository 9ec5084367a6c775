"""One asv database from the results of several asv processes, written once, after they end.  Standard library only.

Each asv process of `attnspec run` measures a share of the backends into a results folder of its
own (attnspec/asvtool.py); all of them run this interpreter as the same asv environment, so each
writes a results file of the same name (<machine>/<commit>-<env>.json).  `merge_into` folds them
into the grid's database: per benchmark, the parameter combinations of the first axis (the backend
for attention benchmarks, the library for the machine's) that a process measured replace those
recorded before; the other first-axis values recorded before stay (a run of one backend keeps the
others' results at that commit).  Every file it writes is written whole (files.write_atomic).

Format (asv results v2): `results[name]` is a row of `result_columns`; `params` lists each axis's
values; per-combination columns (result, stats_*, samples) are lists in itertools.product order,
so one first-axis value's combinations are one contiguous block.
"""
from __future__ import annotations

import ast
import json
import os

from attnspec import files
from attnspec.reports.inputs import GRID_FILE

_SCALAR_COLUMNS = ("version", "started_at", "duration", "profile")


def _load(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and data.get("version") == 2 and isinstance(data.get("results"), dict)
    return data if ok else None


def _blocks(entry: dict, columns: list) -> tuple[list, dict] | None:
    """(the other axes, {first-axis value: {column: its block}}), or None when not block-shaped."""
    record = dict(zip(columns, entry, strict=False))  # trailing columns may be absent
    params = record.get("params")
    if not params or not isinstance(record.get("result"), list):
        return None
    rest = 1
    for axis in params[1:]:
        rest *= len(axis)
    lists = [c for c in columns if c not in _SCALAR_COLUMNS and c != "params"]
    out = {}
    for i, value in enumerate(params[0]):
        block = {}
        for c in lists:
            col = record.get(c)
            block[c] = col[i * rest:(i + 1) * rest] if isinstance(col, list) and len(col) == len(params[0]) * rest \
                else [None] * rest
        out[value] = block
    return params[1:], out


def merge_entry(old: list | None, new: list, columns: list) -> list:
    """A benchmark's row: new's first-axis values, then old's others when the other axes agree."""
    if old is None:
        return new
    a, b = _blocks(old, columns), _blocks(new, columns)
    if a is None or b is None or a[0] != b[0]:
        return new  # another grid, or a benchmark that failed whole: the new result stands
    kept = {k: v for k, v in a[1].items() if k not in b[1]}
    if not kept:
        return new
    order = [k for k in a[1] if k in kept or k in b[1]] + [k for k in b[1] if k not in a[1]]
    record = dict(zip(columns, new, strict=False))
    record["params"] = [order] + b[0]
    for c in columns:
        if c in _SCALAR_COLUMNS or c == "params":
            continue
        record[c] = [x for k in order for x in (b[1][k] if k in b[1] else kept[k])[c]]
    old_duration = dict(zip(columns, old, strict=False)).get("duration")
    if isinstance(record.get("duration"), (int, float)) and isinstance(old_duration, (int, float)):
        record["duration"] += old_duration * len(kept) / max(1, len(a[1]))
    return [record.get(c) for c in columns]


def merge_declared(old, new):
    """A benchmarks.json entry: asv (asv show, compare, publish) lists the parameter values it
    declares, so the first axis is the union of every process's (its backends) when the rest agree."""
    if not (isinstance(old, dict) and isinstance(new, dict) and old.get("params") and new.get("params")) or \
            old["params"][1:] != new["params"][1:]:
        return new
    first = list(old["params"][0]) + [v for v in new["params"][0] if v not in old["params"][0]]
    return dict(new, params=[first] + new["params"][1:])


def _set_aside(path: str) -> str:
    """An unreadable file of the database, moved beside itself (never overwritten unread): the skip line."""
    os.replace(path, path + ".bad")
    return f"{path} — not readable; kept as {os.path.basename(path)}.bad, this run's results written in its place"


def merge_file(target: str, new: dict) -> str | None:
    """Merge `new` into the results file `target`; the skip line when `target` could not be read."""
    old = _load(target)
    said = _set_aside(target) if old is None and os.path.exists(target) else None
    if old is None or old.get("result_columns") != new.get("result_columns") or \
            old.get("commit_hash") != new.get("commit_hash"):
        files.write_json_atomic(target, new)
        return said
    columns = new["result_columns"]
    merged = dict(new, results=dict(old["results"]), durations=dict(old.get("durations") or {}))
    for name, entry in new["results"].items():
        merged["results"][name] = merge_entry(old["results"].get(name), entry, columns)
    merged["durations"].update(new.get("durations") or {})
    files.write_json_atomic(target, merged)
    return None


def merge_into(database: str, process_dirs: list) -> list:
    """Fold each process's results folder into `database`, in order; return what could not be read
    ("path — why"), which stays out of the database."""
    skipped = []
    declared = {}
    bench_file = os.path.join(database, "benchmarks.json")
    if os.path.isfile(bench_file):
        try:
            with open(bench_file, encoding="utf-8") as f:
                declared = json.load(f)
        except (OSError, ValueError):
            declared = {}
            skipped.append(_set_aside(bench_file))
    for src in process_dirs:
        if not os.path.isdir(src):
            continue
        grid = os.path.join(src, GRID_FILE)  # which grid: `attnspec report <database>` says so too
        if os.path.isfile(grid):
            files.copy_atomic(grid, os.path.join(database, GRID_FILE))
        path = os.path.join(src, "benchmarks.json")
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    for name, entry in json.load(f).items():
                        declared[name] = merge_declared(declared.get(name), entry)
            except (OSError, ValueError, AttributeError) as e:
                skipped.append(f"{path} — {e}")
        for machine in sorted(os.listdir(src)):
            mdir = os.path.join(src, machine)
            if not os.path.isfile(os.path.join(mdir, "machine.json")):
                continue
            files.copy_atomic(os.path.join(mdir, "machine.json"), os.path.join(database, machine, "machine.json"))
            for name in sorted(os.listdir(mdir)):
                if not name.endswith(".json") or name == "machine.json":
                    continue
                data = _load(os.path.join(mdir, name))
                if data is None:
                    skipped.append(f"{os.path.join(mdir, name)} — not a readable asv results file")
                    continue
                said = merge_file(os.path.join(database, machine, name), data)
                if said:
                    skipped.append(said)
    if declared:
        files.write_json_atomic(bench_file, declared)
    return skipped


def backend_seconds(database: str) -> dict:
    """backend -> seconds its combinations took to time in the newest results here (asv's sample
    time x number x repeat, summed over the time_ benchmarks whose first axis is the backend)."""
    newest = []
    for machine in sorted(os.listdir(database)) if os.path.isdir(database) else []:
        mdir = os.path.join(database, machine)
        if os.path.isdir(mdir):
            newest += [os.path.join(mdir, n) for n in os.listdir(mdir) if n.endswith(".json") and n != "machine.json"]
    data = _load(max(newest, key=os.path.getmtime)) if newest else None
    seconds: dict = {}
    if data is None:
        return seconds
    columns = data.get("result_columns", [])
    for name, entry in data["results"].items():
        if not name.rsplit(".", 1)[-1].startswith("time_"):
            continue
        shaped = _blocks(entry, columns)
        if shaped is None:
            continue
        for value, block in shaped[1].items():
            try:
                backend = ast.literal_eval(value)  # asv keeps parameter values as repr strings
            except (ValueError, SyntaxError):
                backend = value
            times = block.get("result", [])
            numbers = block.get("stats_number") or [None] * len(times)
            repeats = block.get("stats_repeat") or [None] * len(times)
            total = sum(t * (n or 1) * (r or 1) for t, n, r in zip(times, numbers, repeats, strict=True)
                        if isinstance(t, (int, float)) and t == t)  # t == t: not NaN (skipped)
            if isinstance(backend, str):
                seconds[backend] = seconds.get(backend, 0.0) + total
    return seconds
