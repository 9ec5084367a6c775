"""Files that a killed run never leaves half written, and the lock that keeps two runs apart.  Standard library only.

Every file `attnspec run` writes where a later run or `attnspec report` reads it goes through
`write_atomic`: the text lands in a temporary file beside the target and is renamed over it, so a
reader sees the old file or the new one, never a prefix (Ctrl-C, SIGTERM or the OOM killer between
the two leaves the old file and a stray temporary that nothing reads).
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import tempfile
import time


def write_atomic(path: str, text: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; results are for reading
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return path


def write_json_atomic(path: str, data) -> str:
    return write_atomic(path, json.dumps(data, indent=1, default=str))


def copy_atomic(src: str, dst: str) -> str:
    folder = os.path.dirname(os.path.abspath(dst))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dst)}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return dst


class RunLocked(Exception):
    """Another `attnspec run` holds the folder's lock."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _holder(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # written by a run killed between create and write: stale


def _stale(holder: dict) -> bool:
    """A lock whose process is gone (on this host); another host's lock (a shared folder) is kept."""
    if holder.get("host") not in (None, platform.uname().node):
        return False
    pid = holder.get("pid")
    return not isinstance(pid, int) or not _alive(pid)


@contextlib.contextmanager
def run_lock(path: str, what: str = "attnspec run"):
    """Hold `path` (a file holding our pid, host and start) while the block runs; RunLocked if a live
    process holds it.  A lock left by a killed run (its pid gone) is taken over."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    me = {"pid": os.getpid(), "host": platform.uname().node, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(path)
            if holder is None:
                continue  # released meanwhile
            if not _stale(holder):
                raise RunLocked(f"another {what} (pid {holder.get('pid')} on {holder.get('host')}, started "
                                f"{holder.get('started')}) is running in this folder and writes the same files; wait "
                                f"for it to finish, or run from another folder (its lock: {path})") from None
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(me, f)
        break
    else:
        raise RunLocked(f"could not take the lock {path}: it keeps changing hands")
    try:
        yield
    finally:
        if (_holder(path) or {}).get("pid") == me["pid"]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
