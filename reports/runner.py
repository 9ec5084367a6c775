"""Child processes for `attnspec run`: one pytest per backend, asv, git.  Standard library only.

A suite run is judged from outside: its JSON file when it finished, `crashed` when the
interpreter died (signal, os._exit, a segfault in a native kernel), `timed_out` when it ran
past its limit (then its whole process group is killed).
"""
from __future__ import annotations

import codecs
import importlib.util
import json
import os
import platform
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from .inputs import ReportInputError, read_suite_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TEST_ID = re.compile(r"^\S+\.py::\S")  # pytest -v names a test at the start of its line
_RESULT = re.compile(r" (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
PROGRESS_EVERY = 10.0  # seconds between progress lines when the terminal cannot redraw one


def importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def child_env(**extra) -> dict:
    """The user's working folder stays importable (plug-ins like mypkg.attn:sdpa); output unbuffered
    so that the last line before a crash is not lost in a buffer."""
    path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", **extra)


@dataclass
class Finished:
    rc: int | None  # None: killed after the time limit
    output: str
    seconds: float

    def describe(self) -> str:
        if self.rc is None:
            return f"no result within {self.seconds:.0f} s"
        if self.rc < 0:
            try:
                return f"killed by {signal.Signals(-self.rc).name}"
            except ValueError:
                return f"killed by signal {-self.rc}"
        return f"exit status {self.rc}"


def _spawn(cmd, env=None):
    return subprocess.Popen(cmd, cwd=ROOT, env=env or child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


_LIVE: set = set()  # children being watched: Ctrl-C in the main thread must end them all


_STOPPING = threading.Event()  # set by kill_all: the run is over, its threads stay quiet


def kill_all() -> None:
    """End every child still running (they run in their own session: Ctrl-C does not reach them)."""
    _STOPPING.set()
    for proc in list(_LIVE):
        _kill_group(proc)


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _read_chunks(proc, chunks: queue.Queue) -> None:
    fd = proc.stdout.fileno()
    for chunk in iter(lambda: os.read(fd, 65536), b""):
        chunks.put(chunk)
    chunks.put(None)


def watch(cmd, timeout: float, on_line=None, env=None) -> Finished:
    """Run cmd, handing each output line to on_line; kill its process group after `timeout` s.

    on_line also gets "" once a second (a tick for progress) and an unfinished line without
    its newline as soon as it is written (pytest -v names a test before running it)."""
    start = time.monotonic()
    proc = _spawn(cmd, env)
    _LIVE.add(proc)
    chunks: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_read_chunks, args=(proc, chunks), daemon=True)
    reader.start()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    kept, pending, rc = [], "", None

    def deliver(text: str, final: bool = False) -> str:
        *complete, rest = (text + ("\n" if final and text else "")).split("\n")
        for line in complete:
            kept.append(line + "\n")
            if on_line:
                on_line(line + "\n")
        del kept[:-200]  # the tail is what explains a crash
        if rest and on_line:
            on_line(rest)
        return rest

    try:
        while True:
            left = start + timeout - time.monotonic()
            try:
                chunk = chunks.get(timeout=max(0.0, min(left, 1.0)))
            except queue.Empty:
                if left <= 0:
                    _kill_group(proc)
                    break
                if on_line:
                    on_line("")  # a tick, so progress shows while one test runs long
                continue
            if chunk is None:
                rc = proc.wait()
                break
            pending = deliver(pending + decoder.decode(chunk))
    except BaseException:  # Ctrl-C: leave no child behind
        _kill_group(proc)
        raise
    finally:
        _LIVE.discard(proc)
    reader.join(timeout=5)
    while not chunks.empty():  # what came in just before the kill
        chunk = chunks.get()
        if chunk:
            pending += decoder.decode(chunk)
    deliver(pending + decoder.decode(b"", final=True), final=True)
    proc.stdout.close()
    return Finished(rc, "".join(kept), time.monotonic() - start)


def run_captured(cmd, timeout: float) -> Finished:
    return watch(cmd, timeout)


_PRINT = threading.Lock()  # suites run side by side; their lines must not interleave


def say(text: str, end: str = "\n", stream=None) -> None:
    if _STOPPING.is_set():
        return
    stream = stream or sys.stdout
    with _PRINT:
        stream.write(text + end)
        stream.flush()


class SuiteProgress:
    """Counts pytest -v result lines; says how far a suite got every few seconds.

    With one suite at a time on a terminal the line is redrawn in place; with several
    running side by side each progress line carries the backend's name."""

    def __init__(self, label: str = "", redraw: bool | None = None, stream=None):
        self.stream = stream or sys.stdout
        self.redraw = self.stream.isatty() if redraw is None else redraw
        self.label = f"{label}: " if label else ""
        self.counts: dict[str, int] = {}
        self.current = ""
        self.start = self.last = time.monotonic()

    def __call__(self, line: str) -> None:
        complete = line.endswith("\n")
        line = line.rstrip("\n")
        if _TEST_ID.match(line):
            self.current = line.split(" ")[0]
            hit = _RESULT.search(line) if complete else None
            if hit:
                self.counts[hit.group(1).lower()] = self.counts.get(hit.group(1).lower(), 0) + 1
                self.current = ""
        now = time.monotonic()
        if (self.redraw and now - self.last >= 0.2) or now - self.last >= PROGRESS_EVERY:
            self.last = now
            self.show(final=False)

    def text(self) -> str:
        done = ", ".join(f"{n} {k}" for k, n in sorted(self.counts.items())) or "starting"
        now = f"; running {self.current.split('::')[-1]}" if self.current else ""
        return f"{self.label}{done} ({time.monotonic() - self.start:.0f} s{now})"

    def show(self, final: bool = True) -> None:
        """A progress line; final=True only clears a redrawn line (the caller says how it ended)."""
        if self.redraw:
            say("\r\x1b[K" if final else f"  {self.text()}\x1b[K", end="" if final else "\r", stream=self.stream)
        elif not final:
            say(f"  {self.text()}", stream=self.stream)


def suite_command(backend: str, json_path: str) -> list:
    return [sys.executable, "-m", "pytest", "properties", "--backend", backend, "--attnspec-json", json_path,
            "-v", "--tb=no", "-rN", "--no-header", "--color=no", "-p", "no:cacheprovider"]


def _suite_row(backend, status, message, seconds) -> dict:
    return {"backend": backend, "property": "(suite)", "dtype": "", "status": status, "examples": 0,
            "seconds": round(seconds, 2), "counterexample": "", "message": message}


def run_suite(backend: str, json_path: str, limit: float, command=None, shown: str | None = None,
              progress: SuiteProgress | None = None) -> dict:
    """The suite's rows for one backend, plus a crashed/timed_out/error row when it did not finish.

    `backend` is what the suite takes (a name or package.module:attr), `shown` the backend's own name."""
    if os.path.exists(json_path):
        os.remove(json_path)
    progress = progress or SuiteProgress()
    done = watch((command or suite_command)(backend, json_path), limit, progress)
    progress.show()
    data = {"conformance": [], "semantics": []}
    unreadable = ""
    if os.path.exists(json_path):
        try:
            data = read_suite_json(json_path)
        except ReportInputError as e:
            unreadable = str(e)
    where = f" while running {progress.current}" if progress.current else ""
    tail = " | ".join(x.strip() for x in done.output.strip().splitlines()[-3:])
    finished = done.rc in (0, 1) and os.path.exists(json_path) and not unreadable
    pytest_error = done.rc in (4, 5) or "INTERNALERROR" in done.output or "during collection" in done.output
    if done.rc is None:
        row = _suite_row(shown or backend, "timed_out", f"the suite did not finish within {limit:g} s{where}", done.seconds)
    elif finished:
        row = None
    elif unreadable or (pytest_error and done.rc >= 0):
        why = unreadable or f"pytest {done.describe()}"
        row = _suite_row(shown or backend, "error", f"the suite could not run: {why}; last output: {tail}", done.seconds)
    else:  # a signal, or an exit (os._exit, abort) in the middle of the run without results
        row = _suite_row(shown or backend, "crashed", f"the test process died ({done.describe()}) after "
                         f"{done.seconds:.1f} s{where}; last output: {tail}", done.seconds)
    if row is None:
        progress.current = ""  # finished: nothing is running any more
    else:
        say(f"  {progress.label}{row['status']}: {row['message']}")
        data["conformance"].append(row)
    return data


def _headline(line: str) -> bool:
    """asv's progress and messages; not the result tables it draws under each benchmark."""
    return bool(line.strip()) and not line[0].isspace() and "====" not in line and "----" not in line


def stream(cmd, env=None, prefix="", quiet_every: float = 30.0) -> int:
    """Run cmd, echoing its output's headlines (asv's progress lines); return its exit status.

    asv prints a parameterised benchmark's line only when all its combinations are done, so
    a line saying it is still running comes every `quiet_every` seconds of silence."""
    start = last = [time.monotonic()] * 2

    def on_line(line):
        now = time.monotonic()
        if line.endswith("\n") and _headline(line):
            print(prefix + line.rstrip("\n"), flush=True)
            last[0] = now
        elif now - last[0] >= quiet_every:
            print(f"{prefix}... still running ({now - start[1]:.0f} s)", flush=True)
            last[0] = now

    return watch(cmd, float("inf"), on_line, env).rc


def git_head() -> str:
    try:
        res = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", "HEAD"], capture_output=True, text=True)
    except FileNotFoundError:
        res = None
    if res is None or res.returncode != 0:
        why = "git is not installed" if res is None else (res.stderr.strip().splitlines() or ["no commit"])[-1]
        raise ReportInputError(f"asv files results under a git commit and there is none in {ROOT} ({why}); "
                               "commit once, or pass --no-bench")
    return res.stdout.strip()


def ensure_asv_machine() -> None:
    """`asv machine --yes` once per host: asv refuses to run without a machine entry."""
    path = os.path.expanduser("~/.asv-machine.json")
    try:
        with open(path, encoding="utf-8") as f:
            if platform.uname().node in json.load(f):
                return
    except (OSError, ValueError):
        pass
    done = watch(["asv", "machine", "--yes"], 120)
    if done.rc != 0:
        raise ReportInputError(f"`asv machine --yes` failed ({done.describe()}): {done.output.strip()[-300:]}")


def asv_results_dir() -> str:
    """results_dir from asv.conf.json (asv allows // comments in it)."""
    conf = os.path.join(ROOT, "asv.conf.json")
    try:
        with open(conf, encoding="utf-8") as f:
            text = "\n".join(line for line in f if not line.lstrip().startswith("//"))
        results = json.loads(text).get("results_dir", "results")
    except (OSError, ValueError) as e:
        raise ReportInputError(f"{conf}: cannot read the asv configuration ({e})") from None
    return os.path.join(ROOT, results)
