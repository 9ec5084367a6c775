"""Child processes of `attnspec run`: watched with a time limit, their output echoed; git.  Standard library only.

Children run in the user's current folder, in their own session, and are watched with a time
limit (then their whole process group is killed); Ctrl-C ends them all.  They import what the
user's shell imports: the current folder and PYTHONPATH (asv's benchmark processes through
ASV_PYTHONPATH, the variable asv passes on).  The suite's children: attnspec/suites.py; asv's: attnspec/asvtool.py.
"""
from __future__ import annotations

import codecs
import contextlib
import importlib.util
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from attnspec.reports.inputs import ReportInputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # attnspec's source (a checkout when editable)


def importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def child_env(**extra) -> dict:
    """The user's working folder stays importable (plug-ins like mypkg.attn:sdpa), in the suite's
    children and in asv's benchmark processes; output unbuffered so that the last line before a
    crash is not lost in a buffer."""
    path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, ASV_PYTHONPATH=path, PYTHONUNBUFFERED="1", **extra)


@dataclass
class Finished:
    rc: int | None  # None: killed after the time limit
    output: str
    seconds: float
    stopped: str = ""  # why the caller's stop() ended it (then rc is the kill's signal)

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
    return subprocess.Popen(cmd, cwd=os.getcwd(), env=env or child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


_LIVE: set = set()  # children being watched: Ctrl-C in the main thread must end them all


_STOPPING = threading.Event()  # set by kill_all: the run is over, its threads stay quiet


def start_run() -> None:
    """A new run in this process (the command called again, an in-process test): children start again."""
    _STOPPING.clear()


def kill_all() -> None:
    """End every child still running (they run in their own session: Ctrl-C does not reach them)."""
    _STOPPING.set()
    for proc in list(_LIVE):
        _kill_group(proc)


def _kill_group(proc) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone already, or not ours to kill
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read_chunks(proc, chunks: queue.Queue) -> None:
    fd = proc.stdout.fileno()
    for chunk in iter(lambda: os.read(fd, 65536), b""):
        chunks.put(chunk)
    chunks.put(None)


def watch(cmd, timeout: float, on_line=None, env=None, stop=None) -> Finished:
    """Run cmd, handing each output line to on_line; kill its process group after `timeout` s,
    or as soon as stop() returns a reason (checked after each line and tick).

    on_line also gets "" once a second (a tick for progress) and an unfinished line without
    its newline as soon as it is written."""
    start = time.monotonic()
    stopped = ""
    if _STOPPING.is_set():  # the run was interrupted before this child started: it never does
        return Finished(-signal.SIGKILL, "", 0.0, "the run was interrupted")
    proc = _spawn(cmd, env)
    _LIVE.add(proc)
    if _STOPPING.is_set():  # kill_all ran between the check and the add: end it as it would have
        _kill_group(proc)
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
            else:
                if chunk is None:
                    rc = proc.wait()
                    break
                pending = deliver(pending + decoder.decode(chunk))
            if stop is not None and (stopped := stop()):
                _kill_group(proc)
                rc = proc.returncode
                break
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
    return Finished(rc, "".join(kept), time.monotonic() - start, str(stopped or ""))


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


def _headline(line: str) -> bool:
    """asv's progress and messages; not the result tables it draws under each benchmark."""
    return bool(line.strip()) and not line[0].isspace() and "====" not in line and "----" not in line


_WHY = re.compile(r"^\s*(attnspec: cannot load backend .*|[\w.]*(Error|Exception)(: .*)?)$")


def _why(line: str) -> str | None:
    """A failure's reason in asv's --show-stderr output: our own load error, or a traceback's last line."""
    found = _WHY.match(line.rstrip("\n"))
    return found.group(1).strip() if found else None


def stream(cmd, env=None, prefix="", quiet_every: float = 30.0) -> int:
    """Run cmd, echoing its output's headlines (asv's progress lines) and, once each, the reasons
    benchmarks failed (from asv's --show-stderr); return its exit status.

    asv prints a parameterised benchmark's line only when all its combinations are done, so
    a line saying it is still running comes every `quiet_every` seconds of silence."""
    start = last = [time.monotonic()] * 2
    said = set()

    def on_line(line):
        now = time.monotonic()
        why = _why(line) if line.endswith("\n") else None
        if why and why not in said:
            said.add(why)
            print(f"{prefix}    why: {why}", flush=True)
            last[0] = now
        elif line.endswith("\n") and _headline(line):
            print(prefix + line.rstrip("\n"), flush=True)
            last[0] = now
        elif now - last[0] >= quiet_every:
            print(f"{prefix}... still running ({now - start[1]:.0f} s)", flush=True)
            last[0] = now

    return watch(cmd, float("inf"), on_line, env).rc


def git_head() -> str:
    """attnspec's commit (asv files benchmark results under it)."""
    try:
        res = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", "HEAD"], capture_output=True, text=True)
    except FileNotFoundError:
        res = None
    if res is None or res.returncode != 0:
        why = "git is not installed" if res is None else (res.stderr.strip().splitlines() or ["no commit"])[-1]
        raise ReportInputError(f"asv files results under a git commit of attnspec and there is none in {ROOT} ({why}); "
                               "install attnspec from a clone (pip install -e), or pass --no-bench")
    return res.stdout.strip()
