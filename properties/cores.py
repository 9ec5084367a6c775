"""Side by side over the cores: which backends' suites go first, from what the last run measured.

The suite does not spread itself over the cores: a run of `pytest properties` stays in one
process unless the user says otherwise, with pytest-xdist's own options::

    pytest properties -n auto --dist loadgroup

(``loadgroup``: a backend's tests in one dtype share a worker, and with them the programs that
backend compiled for that dtype).  `attnspec run` starts one child per backend itself.  In both
the longest suites start first, so the last to finish is a short one; "longest" is what the
previous run recorded (each row carries its ``seconds``), in ``.attnspec/suite-seconds.json`` of
the folder the run started in.  With nothing recorded a backend weighs its number of tests
(pytest-xdist), or keeps its place (`attnspec run`).
"""
from __future__ import annotations

import json
import os

SECONDS_FILE = os.path.join(".attnspec", "suite-seconds.json")


def recorded_seconds(folder: str) -> dict[str, float]:
    """backend -> seconds its suite took in the last run that recorded it (empty when none did)."""
    try:
        with open(os.path.join(folder, SECONDS_FILE)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}


def record_seconds(folder: str, rows: list) -> None:
    """Add the seconds of each backend in `rows` (conformance rows) to the record, keeping the others'."""
    totals: dict[str, float] = {}
    for r in rows:
        if r.get("backend"):
            totals[r["backend"]] = totals.get(r["backend"], 0.0) + float(r.get("seconds") or 0.0)
    if not totals:
        return
    path = os.path.join(folder, SECONDS_FILE)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".lock", "w") as lock:  # `attnspec run`'s children finish side by side
            _locked(lock)
            merged = {**recorded_seconds(folder), **{b: round(s, 2) for b, s in totals.items()}}
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(merged, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
    except OSError:  # a read-only folder: the next run keeps the fallback order
        pass


def _locked(f) -> None:
    try:
        import fcntl
    except ImportError:  # not POSIX: a lost update costs only an order
        return
    fcntl.flock(f, fcntl.LOCK_EX)


def suite_weight(backend: str, recorded: dict, tests: int = 0) -> tuple:
    """Sort key, largest first: the backend's recorded seconds, else its number of tests."""
    return (1, recorded[backend]) if backend in recorded else (0, tests)


def longest_first(items: list, target_of, recorded: dict) -> None:
    """Reorder collected items so that each (backend, dtype) group stays together and the longest
    backends' groups come first (pytest-xdist's loadgroup then hands them out in this order)."""
    groups: dict = {}
    for item in items:
        t = target_of(item)
        groups.setdefault(None if t is None else (t.name, t.dtype), []).append(item)
    counts: dict = {}
    for key, members in groups.items():
        if key is not None:
            counts[key[0]] = counts.get(key[0], 0) + len(members)
    order = sorted(groups, key=lambda key: (key is not None, suite_weight(key[0], recorded, counts[key[0]])
                                            if key else ()), reverse=True)
    items[:] = [item for key in order for item in groups[key]]
