"""Reading stored results: suite JSON files, asv results folders and earlier report folders.

Everything here is plain json/os: a corrupt or missing input becomes one `ReportInputError`
line naming the path and what was wrong, never a traceback.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field

CONFORMANCE_COLUMNS = ("backend", "property", "dtype", "status", "examples", "seconds", "counterexample", "message",
                       "attribution", "outside_limits", "declined")
SEMANTICS_COLUMNS = ("backend", "question", "dtype", "observed", "declared", "agrees")
# "recorded": a semantics question the backend declares nothing about (never failed, never a pass)
# "deviation": a failure the backend declares as a known departure (Semantics.deviations)
STATUSES = ("passed", "failed", "skipped", "error", "crashed", "timed_out", "recorded", "deviation")
# When two runs (say a CPU and a GPU box) judged the same check, the more telling result wins:
# a failure anywhere is shown; a skip is superseded by any real result.
_STATUS_RANK = {"failed": 0, "error": 1, "crashed": 2, "timed_out": 3, "deviation": 4, "passed": 5, "recorded": 6,
                "skipped": 7}
# older results lack them (per-dtype answers; attribution; what declared limits left out, calls declined)
_OPTIONAL = {"dtype": "", "attribution": "", "outside_limits": "", "declined": 0}
NOT_ATTEMPTED = "not attempted: "  # how a failed row that never ran begins (after a backend hung)
RAW = "raw"  # the report folder keeps its inputs here, so `attnspec report` can rebuild it
SUITE_FILE = "suite.json"
# `python tools/detection_power.py --defects tests.defects --out DIR` (in a checkout) writes it; the report
# shows it when given DIR
# (attnspec run takes reports/detection-power/, the figures measured for this checkout)
DETECTION_FILE = "detection_power.csv"
DETECTION_COLUMNS = ("dtype", "defect", "smallest_d_rejected", "flash_rule_smallest_d_rejected", "target",
                     "meets_target")


class ReportInputError(ValueError):
    """A stored result that is missing, unreadable or not in the expected format."""


@dataclass
class Inputs:
    conformance: list = field(default_factory=list)  # dicts with CONFORMANCE_COLUMNS
    semantics: list = field(default_factory=list)    # dicts with SEMANTICS_COLUMNS
    declarations: list = field(default_factory=list)  # per backend, its declared conventions (Backend.conventions)
    asv_dirs: list = field(default_factory=list)     # asv results folders (one subfolder per machine)
    detection: list = field(default_factory=list)    # detection_power.csv rows (dicts of strings)
    skipped: list = field(default_factory=list)      # "path — why" of each input that could not be read

    def add_suite(self, data: dict) -> None:
        self.conformance += data["conformance"]
        self.semantics += data["semantics"]
        self.declarations += data.get("declarations", [])


def _check_rows(rows, columns, path, key):
    if not isinstance(rows, list):
        raise ReportInputError(f"{path}: {key!r} must be a list, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ReportInputError(f"{path}: {key}[{i}] must be an object, got {type(row).__name__}")
        missing = [c for c in columns if c not in row and c not in _OPTIONAL]
        if missing:
            raise ReportInputError(f"{path}: {key}[{i}] lacks {', '.join(missing)}")
        if key == "conformance" and row["status"] not in STATUSES:
            raise ReportInputError(f"{path}: {key}[{i}] has status {row['status']!r}; expected one of {', '.join(STATUSES)}")
    return [{c: row.get(c, _OPTIONAL.get(c)) for c in columns} for row in rows]


def read_suite_json(path: str) -> dict:
    """The suite's JSON ({"conformance": [...], "semantics": [...]}), validated."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ReportInputError(f"results file not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ReportInputError(f"{path}: not valid JSON ({e})") from None
    except OSError as e:
        raise ReportInputError(f"{path}: cannot read ({e.strerror})") from None
    if not isinstance(data, dict) or "conformance" not in data:
        raise ReportInputError(f"{path}: not a suite results file (expected an object with 'conformance' and 'semantics')")
    return {"conformance": _check_rows(data["conformance"], CONFORMANCE_COLUMNS, path, "conformance"),
            "semantics": _check_rows(data.get("semantics", []), SEMANTICS_COLUMNS, path, "semantics"),
            "declarations": _check_declarations(data.get("declarations", []), path)}  # older results: none


def _check_declarations(rows, path) -> list:
    """Each backend's declared conventions, as `Backend.conventions` wrote them (objects naming a backend)."""
    if not isinstance(rows, list) or any(not isinstance(r, dict) or not isinstance(r.get("backend"), str)
                                         for r in rows):
        raise ReportInputError(f"{path}: 'declarations' must be a list of objects, each naming its 'backend'")
    return rows


def is_asv_results_dir(path: str) -> bool:
    """asv keeps one subfolder per machine, each with a machine.json."""
    try:
        return any(os.path.isfile(os.path.join(path, d, "machine.json")) for d in os.listdir(path))
    except OSError:
        return False


def read_detection_csv(path: str) -> list:
    """The rows of a detection_power.csv; ReportInputError naming what is wrong."""
    import csv

    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ReportInputError(f"{path}: not a readable CSV file ({e})") from None
    missing = [c for c in DETECTION_COLUMNS if rows and c not in rows[0]]
    if missing:
        raise ReportInputError(f"{path}: not a detection_power.csv (missing columns {', '.join(missing)})")
    return rows


def skip_line(path: str, error: Exception) -> str:
    """"path — why" from an error that may begin with the path itself."""
    why = str(error)
    return f"{path} — {why[len(path) + 2:] if why.startswith(path + ': ') else why}"


def collect(paths) -> Inputs:
    """Suite JSON files, asv results folders and report folders (their raw/), merged.

    A path that is not there, or holds no results at all, is a ReportInputError; a results file
    that is there but cannot be read (truncated, not the format) is named in `skipped` and the
    rest is read (tables.benchmarks_frame does the same for each asv results file)."""
    inputs = Inputs()
    for path in paths:
        try:
            _collect_one(inputs, path)
        except ReportInputError as e:
            if not os.path.exists(path) or "neither an asv results folder" in str(e):
                raise
            inputs.skipped.append(skip_line(path, e))
    return inputs


def _read_suite_into(inputs: Inputs, path: str) -> None:
    try:
        inputs.add_suite(read_suite_json(path))
    except ReportInputError as e:
        inputs.skipped.append(skip_line(path, e))


def _collect_one(inputs: Inputs, path: str) -> None:
    if os.path.isdir(path):
        raw = os.path.join(path, RAW)
        if os.path.isdir(raw):
            path = raw  # an earlier report folder: rebuild from what it kept
        suite = os.path.join(path, SUITE_FILE)
        if os.path.isfile(suite):
            _read_suite_into(inputs, suite)
        detection = os.path.join(path, DETECTION_FILE)
        if os.path.isfile(detection):
            inputs.detection = read_detection_csv(detection)  # one measurement: the last named wins
        asv_dirs = [path] if is_asv_results_dir(path) else _kept_asv_dirs(path)
        if not asv_dirs and not os.path.isfile(suite) and not os.path.isfile(detection):
            raise ReportInputError(f"{path}: neither an asv results folder (one subfolder per machine with "
                                   "machine.json), nor a report folder, nor a suite JSON file")
        inputs.asv_dirs += asv_dirs
    elif os.path.basename(path) == DETECTION_FILE and os.path.isfile(path):
        inputs.detection = read_detection_csv(path)
    elif os.path.isfile(path):
        inputs.add_suite(read_suite_json(path))
    else:
        raise ReportInputError(f"results not found: {path}")


def _kept_asv_dirs(raw: str) -> list:
    root = os.path.join(raw, "asv")
    if not os.path.isdir(root):
        return []
    return [os.path.join(root, d) for d in sorted(os.listdir(root)) if is_asv_results_dir(os.path.join(root, d))]


def merge_conformance(rows) -> list:
    """One row per (backend, property, dtype): the most telling status across runs."""
    best = {}
    for row in rows:
        key = (row["backend"], row["property"], row["dtype"])
        if key not in best or _STATUS_RANK[row["status"]] < _STATUS_RANK[best[key]["status"]]:
            best[key] = row
    return list(best.values())


def merge_semantics(rows) -> list:
    """One row per (backend, question, dtype); a disagreement seen anywhere is kept."""
    best = {}
    for row in rows:
        key = (row["backend"], row["question"], row.get("dtype", ""))
        if key not in best or (row["agrees"] is False and best[key]["agrees"] is not False):
            best[key] = row
    return list(best.values())


def _results_files(machine_dir: str):
    for name in os.listdir(machine_dir):
        if name.endswith(".json") and name != "machine.json":
            yield os.path.join(machine_dir, name)


def _commit_of(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            commit = json.load(f).get("commit_hash")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise ReportInputError(f"{path}: not a readable asv results file ({e})") from None
    if not isinstance(commit, str):
        raise ReportInputError(f"{path}: asv results file without a commit_hash")
    return commit


GRID_FILE = "attnspec.json"  # beside an asv results folder's machines: {"grid": ...} (attnspec/benchrun.py)


def copy_asv_results(src: str, dst: str, commit: str | None = None, skipped: list | None = None) -> int:
    """Copy one commit's results per machine (the given one, else the newest readable file's) into dst.

    Returns how many results files were copied; asv keeps every commit it ever measured,
    and a report compares backends at one commit per machine.  A file that cannot be read is
    left out and named in `skipped` ("path — why").
    """
    copied = 0
    for machine in sorted(os.listdir(src)):
        mdir = os.path.join(src, machine)
        if not os.path.isfile(os.path.join(mdir, "machine.json")):
            continue
        commits = {}
        for f in sorted(_results_files(mdir), key=os.path.getmtime):
            try:
                commits[f] = _commit_of(f)
            except ReportInputError as e:
                if skipped is not None:
                    skipped.append(skip_line(f, e))
        if not commits:
            continue
        wanted = commit if commit is not None else list(commits.values())[-1]
        chosen = [f for f, c in commits.items() if c == wanted]
        if not chosen:
            continue
        os.makedirs(os.path.join(dst, machine), exist_ok=True)
        shutil.copy2(os.path.join(mdir, "machine.json"), os.path.join(dst, machine, "machine.json"))
        for f in chosen:
            shutil.copy2(f, os.path.join(dst, machine, os.path.basename(f)))
            copied += 1
    for name in ("benchmarks.json", GRID_FILE):
        if copied and os.path.isfile(os.path.join(src, name)):
            shutil.copy2(os.path.join(src, name), os.path.join(dst, name))
    return copied
