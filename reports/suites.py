"""One conformance-suite child per backend for `attnspec run`: its progress, its rows, its fate.

A suite run is judged from outside: its JSON file when it finished, `crashed` when the
interpreter died (signal, os._exit, a segfault in a native kernel), `timed_out` when it ran
past its limit or a backend call hung (then its whole process group is killed).  While it
runs, the pytest plugin reports each test on a progress channel (JSON lines in the file
$ATTNSPEC_PROGRESS names, see properties/plugin.py): the progress lines, the rows of what
finished before a crash, and the moment a call hangs come from there, never from parsing
pytest's output.  Standard library only.
"""
from __future__ import annotations

import json
import os
import sys
import time

from attnspec.reports.inputs import NOT_ATTEMPTED, ReportInputError, read_suite_json
from attnspec.reports.runner import child_env, say, watch

PROGRESS_EVERY = 10.0  # seconds between progress lines when the terminal cannot redraw one


class SuiteProgress:
    """What one suite child has done, read from its progress channel while it runs.

    The pytest plugin appends JSON lines to $ATTNSPEC_PROGRESS (properties/plugin.py):
    {"event": "collected", "tests": [...]} once, then per test "started" and "finished" (the
    test's conformance row, its semantics rows, and "hung": the call that did not return within
    the per-call limit, if one did).  Every few seconds a progress line says how far the suite
    got: redrawn in place with one suite at a time on a terminal, else one line per update
    carrying the backend's name.
    """

    def __init__(self, label: str = "", redraw: bool | None = None, stream=None, path: str | None = None):
        self.stream = stream or sys.stdout
        self.redraw = self.stream.isatty() if redraw is None else redraw
        self.label = f"{label}: " if label else ""
        self.path, self._offset, self._partial = path, 0, b""
        self.tests: list | None = None   # collected: test (pytest's id), backend, property, dtype
        self._ids: set = set()
        self.finished: dict = {}         # test id -> its "finished" line
        self.counts: dict[str, int] = {}
        self.current = ""                # the test running now, e.g. rows_sum_to_one[float32]
        self.hung = ""                   # the call that hung, once the plugin says one did
        self.hung_in = ""                # ... noticed when this test finished
        self.start = self.last = self._read_at = time.monotonic()

    def read(self) -> None:
        """Take in what the plugin appended since the last read (a half-written last line waits)."""
        if not self.path:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            try:
                self._take(json.loads(line))
            except (ValueError, KeyError, TypeError):  # not ours, or torn: progress is best effort
                continue

    def _take(self, ev: dict) -> None:
        if ev["event"] == "collected":
            if self.tests is None:  # a pytest the suite itself starts inherits the variable: not ours
                self.tests, self._ids = ev["tests"], {t["test"] for t in ev["tests"]}
        elif self.tests is None or ev["test"] not in self._ids:
            return
        elif ev["event"] == "started":
            self.current = f"{ev['property']}[{ev['dtype']}]"
        elif ev["event"] == "finished":
            self.finished[ev["test"]] = ev
            self.counts[ev["status"]] = self.counts.get(ev["status"], 0) + 1
            self.current = ""
            if ev.get("hung") and not self.hung:
                self.hung, self.hung_in = str(ev["hung"]), f"{ev['property']}[{ev['dtype']}]"

    def __call__(self, line: str = "") -> None:
        """watch()'s callback: on output and once a second; reads the channel, shows progress."""
        now = time.monotonic()
        if now - self._read_at >= 0.2:
            self._read_at = now
            self.read()
        if (self.redraw and now - self.last >= 0.2) or now - self.last >= PROGRESS_EVERY:
            self.last = now
            self.show(final=False)

    def rows(self) -> dict:
        """The conformance and semantics rows of the tests that finished."""
        done = self.finished.values()
        keep = ("backend", "property", "dtype", "status", "examples", "seconds", "counterexample", "message")
        return {"conformance": [{k: ev.get(k) for k in keep} for ev in done],
                "semantics": [row for ev in done for row in ev.get("semantics", [])]}

    def not_attempted(self, why: str) -> list[dict]:
        """A failed row for each collected test that did not finish."""
        return [dict(backend=t["backend"], property=t["property"], dtype=t["dtype"], status="failed", examples=0,
                     seconds=0.0, counterexample="", message=NOT_ATTEMPTED + why)
                for t in self.tests or () if t["test"] not in self.finished]

    def text(self) -> str:
        done = ", ".join(f"{n} {k}" for k, n in sorted(self.counts.items()))
        if self.tests is not None:
            done = f"{len(self.finished)}/{len(self.tests)} tests" + (f": {done}" if done else "")
        now = f"; running {self.current}" if self.current else ""
        return f"{self.label}{done or 'starting'} ({time.monotonic() - self.start:.0f} s{now})"

    def show(self, final: bool = True) -> None:
        """A progress line; final=True only clears a redrawn line (the caller says how it ended)."""
        if self.redraw:
            say("\r\x1b[K" if final else f"  {self.text()}\x1b[K", end="" if final else "\r", stream=self.stream)
        elif not final:
            say(f"  {self.text()}", stream=self.stream)


PROGRESS_ENV = "ATTNSPEC_PROGRESS"  # the plugin's name for it (properties/plugin.py)


def suite_command(backend: str, json_path: str) -> list:
    return [sys.executable, "-m", "pytest", "properties", "--backend", backend, "--attnspec-json", json_path,
            "-q", "--tb=no", "-rN", "--no-header", "--color=no", "-p", "no:cacheprovider"]


def _last_words(output: str, n: int = 3) -> list:
    """The last lines a child printed, leaving out pytest -q's rows of progress marks (.sFE and [ 40%])."""
    lines = [x.strip() for x in output.strip().splitlines()]
    return [x for x in lines if x and x.split("[")[0].strip(".sFExX ")][-n:]


def _suite_row(backend, status, message, seconds) -> dict:
    return {"backend": backend, "property": "(suite)", "dtype": "", "status": status, "examples": 0,
            "seconds": round(seconds, 2), "counterexample": "", "message": message}


def run_suite(backend: str, json_path: str, limit: float, command=None, shown: str | None = None,
              progress: SuiteProgress | None = None, cpus: str = "") -> dict:
    """The suite's rows for one backend, plus a (suite) row when it did not finish by itself.

    `backend` is what the suite takes (a name or package.module:attr), `shown` the backend's own name.
    The rows come from the suite's JSON file when it finished, else from its progress channel:
    what finished before a crash or the time limit is kept.  When the plugin reports that a call
    hung, the child is ended at once (its stuck thread would burn a core for the rest of the
    run) and every test it had not finished is recorded as failed, not attempted."""
    channel = json_path + ".progress"
    for path in (json_path, channel):
        if os.path.exists(path):
            os.remove(path)
    progress = progress or SuiteProgress()
    progress.path = channel
    pinned = {"ATTNSPEC_CPUS": cpus} if cpus else {}
    done = watch((command or suite_command)(backend, json_path), limit, progress,
                 env=child_env(**{PROGRESS_ENV: channel}, **pinned), stop=lambda: progress.hung)
    progress.read()
    progress.show()
    name = shown or backend
    unreadable = ""
    data = None
    if os.path.exists(json_path) and not done.stopped:
        try:
            data = read_suite_json(json_path)
        except ReportInputError as e:
            unreadable = str(e)
    where = f" while running {progress.current}" if progress.current else ""
    tail = " | ".join(_last_words(done.output)) or "none"
    pytest_error = done.rc in (4, 5) or "INTERNALERROR" in done.output or "during collection" in done.output
    if done.stopped:
        why = (f"an earlier {progress.hung} call did not return within the per-call limit (ATTNSPEC_CALL_TIMEOUT); "
               "the suite was ended there")
        missing = progress.not_attempted(why)
        row = _suite_row(name, "timed_out", f"a {progress.hung} call did not return within the per-call limit "
                         f"(ATTNSPEC_CALL_TIMEOUT) in {progress.hung_in}; the suite was ended there and its "
                         f"{len(missing)} remaining test(s) recorded as failed (not attempted)", done.seconds)
        data = progress.rows()
        data["conformance"] += missing
    elif done.rc in (0, 1) and data is not None:
        row = None
    elif done.rc is None:
        row = _suite_row(name, "timed_out", f"the suite did not finish within {limit:g} s{where}", done.seconds)
    elif unreadable or (pytest_error and done.rc >= 0):
        why = unreadable or f"pytest {done.describe()}"
        row = _suite_row(name, "error", f"the suite could not run: {why}; last output: {tail}", done.seconds)
    else:  # a signal, or an exit (os._exit, abort) in the middle of the run without results
        row = _suite_row(name, "crashed", f"the test process died ({done.describe()}) after "
                         f"{done.seconds:.1f} s{where}; last output: {tail}", done.seconds)
    if data is None:
        data = progress.rows()  # what finished before the crash or the time limit
    if row is None and not data["conformance"]:  # nothing tested is not a pass
        row = dict(_suite_row(name, "skipped", "the suite selected no test for this backend (no dtype it declares "
                              "has an error budget, or every test was deselected)", done.seconds), property="(all)")
    if row is None or done.stopped:
        progress.current = ""  # nothing is running any more
    if row is not None:
        say(f"  {progress.label}{row['status']}: {row['message']}")
        data["conformance"].append(row)
    if os.path.exists(channel):
        os.remove(channel)
    return data
