"""One conformance-suite child per backend for `attnspec run`: its progress, its rows, its fate.

A suite run is judged from outside: its JSON file when it finished, `crashed` when the
interpreter died (signal, os._exit, a segfault in a native kernel), `timed_out` when it ran
past its limit or a backend call hung (then its whole process group is killed).  While it
runs, the suite's plugin writes its row stream (``--attnspec-rows``: the tests collected, then
each test's rows as it finishes, JSON lines): the progress lines, the rows of what finished
before a crash, and the moment a call hangs come from there, never from parsing pytest's output.
The child's command line is the suite's one launcher, `attnspec.properties.runner.suite_command`.
"""
from __future__ import annotations

import json
import os
import queue
import re
import sys
import time

from attnspec.procs import child_env, say, watch
from attnspec.properties import runner
from attnspec.reports.inputs import NOT_ATTEMPTED, ReportInputError, read_suite_json
from attnspec.specs.problem import DTYPE_NAMES

PROGRESS_EVERY = 10.0  # seconds between progress lines when the terminal cannot redraw one
# a property's test id, in every dtype the suite draws (fp8 ones too: a test the pattern missed would
# go uncounted, and unreported as not attempted when its child dies)
_ITEM = re.compile(rf"::test_(?P<property>\w+)\[(?P<target>.+)-(?P<dtype>{'|'.join(map(re.escape, DTYPE_NAMES))})\]$")


class SuiteProgress:
    """What one suite child has done, read from its row stream while it runs.

    Every few seconds a progress line says how far the suite got: redrawn in place with one
    suite at a time on a terminal, else one line per update carrying the backend's name."""

    def __init__(self, label: str = "", redraw: bool | None = None, stream=None, path: str | None = None):
        self.stream = stream or sys.stdout
        self.redraw = self.stream.isatty() if redraw is None else redraw
        self.label = f"{label}: " if label else ""
        self.path, self._offset, self._partial = path, 0, b""
        self.tests: list = []            # collected test ids, in order (pytest runs them so in one process)
        self.finished: dict = {}         # test id -> (conformance row, semantics rows)
        self.declarations: dict = {}     # backend -> its declared conventions (Backend.conventions)
        self.counts: dict[str, int] = {}
        self.hung = ""                   # the call that hung, once a row says one did
        self.hung_in = ""                # ... in this test
        self.start = self.last = self._read_at = time.monotonic()

    @property
    def current(self) -> str:
        """The test running now: the first collected one that has not finished."""
        test = next((t for t in self.tests if t not in self.finished), "")
        m = _ITEM.search(test)
        return f"{m['property']}[{m['dtype']}]" if m else ""

    def read(self) -> None:
        """Take in what the row stream gained since the last read (a half-written last line waits)."""
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
            except (ValueError, KeyError, TypeError):  # torn or foreign: progress is best effort
                continue

    def _take(self, entry: dict) -> None:
        if "collected" in entry:
            self.tests += [t for t in entry["collected"] if _ITEM.search(t)]
            return
        if "declarations" in entry:
            self.declarations.update((d["backend"], d) for d in entry["declarations"])
            return
        row = entry.get("row")
        if not row:
            return
        self.finished[entry["nodeid"]] = (row, list(entry.get("semantics") or ()))
        self.counts[row["status"]] = self.counts.get(row["status"], 0) + 1
        if row.get("hung") and not self.hung:
            self.hung, self.hung_in = str(row["hung"]), f"{row['property']}[{row['dtype']}]"

    def __call__(self, line: str = "") -> None:
        """watch()'s callback: on output and once a second; reads the log, shows progress."""
        now = time.monotonic()
        if now - self._read_at >= 0.2:
            self._read_at = now
            self.read()
        if (self.redraw and now - self.last >= 0.2) or now - self.last >= PROGRESS_EVERY:
            self.last = now
            self.show(final=False)

    def rows(self) -> dict:
        """The conformance and semantics rows of the tests that finished, and the declarations seen."""
        return {"conformance": [row for row, _ in self.finished.values()],
                "semantics": [s for _, sem in self.finished.values() for s in sem],
                "declarations": list(self.declarations.values())}

    def not_attempted(self, backend: str, why: str) -> list[dict]:
        """A failed row for each collected test that did not finish."""
        out = []
        for test in self.tests:
            m = _ITEM.search(test)
            if test not in self.finished and m:
                out.append(dict(backend=backend, property=m["property"], dtype=m["dtype"], status="failed", examples=0,
                                seconds=0.0, counterexample="", message=NOT_ATTEMPTED + why))
        return out

    def text(self) -> str:
        done = ", ".join(f"{n} {k}" for k, n in sorted(self.counts.items()))
        if self.tests:
            done = f"{len(self.finished)}/{len(self.tests)} tests" + (f": {done}" if done else "")
        now = self.current
        return f"{self.label}{done or 'starting'} ({time.monotonic() - self.start:.0f} s{'; running ' + now if now else ''})"

    def show(self, final: bool = True) -> None:
        """A progress line; final=True only clears a redrawn line (the caller says how it ended)."""
        if self.redraw:
            say("\r\x1b[K" if final else f"  {self.text()}\x1b[K", end="" if final else "\r", stream=self.stream)
        elif not final:
            say(f"  {self.text()}", stream=self.stream)


def suite_command(backend: str, json_path: str, rows_path: str) -> list:
    """One backend's suite child, quiet: its results come from the JSON and the row stream."""
    return runner.suite_command([backend], json_path, rows_path, ["-q", "--tb=no", "-rN", "--no-header", "--color=no"])


def _last_words(output: str, n: int = 3) -> list:
    """The last lines a child printed, leaving out pytest -q's rows of progress marks (.sFE and [ 40%])."""
    lines = [x.strip() for x in output.strip().splitlines()]
    return [x for x in lines if x and x.split("[")[0].strip(".sFExXr ")][-n:]


def _suite_row(backend, status, message, seconds) -> dict:
    return {"backend": backend, "property": "(suite)", "dtype": "", "status": status, "examples": 0,
            "seconds": round(seconds, 2), "counterexample": "", "message": message}


def run_suite_child(backend: str, json_path: str, limit: float, command=None, shown: str | None = None,
                    progress: SuiteProgress | None = None, profile: str = "", cpu: int | None = None) -> dict:
    """The suite's rows for one backend, plus a (suite) row when it did not finish by itself; `cpu`: the
    child's CPU slot when the children fill the cores (properties/cores.py: one thread each).

    `backend` is what the suite takes (a name or package.module:attr), `shown` the backend's own name.
    The rows come from the suite's JSON file when it finished, else from its row stream: what
    finished before a crash or the time limit is kept.  When a row says a call hung, the child is
    ended at once (its stuck thread would burn a core for the rest of the run) and every test it
    had not finished is recorded as failed, not attempted."""
    log = json_path + ".rows.jsonl"
    for path in (json_path, log):
        if os.path.exists(path):
            os.remove(path)
    progress = progress or SuiteProgress()
    progress.path = log
    # the run's depth, not the child's: each child names one backend, which alone would be deep
    depth = {"ATTNSPEC_PROFILE": profile} if profile else {}
    if cpu is not None:
        from attnspec.properties import cores
        depth.update(cores.one_cpu_each(os.environ, slot=cpu))
    done = watch((command or suite_command)(backend, json_path, log), limit, progress,
                 env=child_env(**depth), stop=lambda: progress.hung)
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
    now = progress.current
    where = f" while running {now}" if now else ""
    tail = " | ".join(_last_words(done.output)) or "none"
    pytest_error = done.rc in (4, 5) or "INTERNALERROR" in done.output or "during collection" in done.output
    if done.stopped:
        why = (f"an earlier {progress.hung} call did not return within the per-call limit (ATTNSPEC_CALL_TIMEOUT); "
               "the suite was ended there")
        missing = progress.not_attempted(name, why)
        row = _suite_row(name, "timed_out", f"a {progress.hung} call did not return within the per-call limit "
                         f"(ATTNSPEC_CALL_TIMEOUT) in {progress.hung_in}; the suite was ended there and its "
                         f"{len(missing)} remaining test(s) recorded as failed (not attempted)", done.seconds)
        data = progress.rows()
        data["conformance"] += missing
    elif progress.hung and done.rc in (0, 1) and data is not None:
        # the child learned the hang itself and failed the rest at once, before it was ended: the same
        # verdict as when it is ended (a loaded machine decides which comes first, never the verdict)
        row = _suite_row(name, "timed_out", f"a {progress.hung} call did not return within the per-call limit "
                         f"(ATTNSPEC_CALL_TIMEOUT) in {progress.hung_in}; the suite failed its remaining tests at "
                         "once (not attempted)", done.seconds)
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
    if row is not None:
        say(f"  {progress.label}{row['status']}: {row['message']}")
        data["conformance"].append(row)
    if os.path.exists(log):
        os.remove(log)
    return data


def run_suites(chosen: list[tuple], limit: float, workdir: str, jobs: int, profile: str = "") -> dict:
    """Conformance and semantics rows from one child pytest per backend, `jobs` at a time, every
    child under the run's `profile` (properties/profiles.py)."""
    from concurrent.futures import ThreadPoolExecutor

    from attnspec.procs import kill_all
    from attnspec.properties import cores

    # side by side on every core: a CPU each (one thread each), handed from child to child
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    free: queue.SimpleQueue | None = None
    if 1 < jobs <= cpus:
        free = queue.SimpleQueue()
        for slot in range(jobs):
            free.put(slot)

    def one(i, name, shown):
        path = os.path.join(workdir, f"suite-{i}.json")
        say(f"[suite {i}/{len(chosen)}] {name}: started")
        progress = SuiteProgress(label=shown, redraw=False if jobs > 1 else None)
        cpu = None if free is None else free.get()
        try:
            data = run_suite_child(name, path, limit, shown=shown, progress=progress, profile=profile, cpu=cpu)
        finally:
            if cpu is not None:
                free.put(cpu)
        say(f"[suite {i}/{len(chosen)}] done: {progress.text()}")
        return data

    # the longest suites (as the last run recorded them) start first, so the last to finish is a short
    # one (the rows keep `chosen`'s order); the children record their own seconds for the next run
    recorded = cores.recorded_seconds(os.getcwd())
    todo = sorted(enumerate(chosen, 1), key=lambda t: cores.suite_weight(t[1][1], recorded), reverse=True)
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = {i: pool.submit(one, i, n, s) for i, (n, s) in todo}
        parts = [futures[i].result() for i in sorted(futures)]
    except BaseException:  # Ctrl-C reaches only this thread; the children run in their own sessions
        pool.shutdown(wait=False, cancel_futures=True)
        kill_all()
        raise
    pool.shutdown()
    return {key: [row for part in parts for row in part.get(key, ())]
            for key in ("conformance", "semantics", "declarations")}
