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


@contextlib.contextmanager
def _replacing(path: str):
    """A temporary file beside `path` for the block to fill; renamed over `path` when the block ends,
    removed if it raises (Ctrl-C included), so `path` is the old file or the new one, never a prefix."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; results are for reading
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_atomic(path: str, text: str) -> str:
    with _replacing(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return path


def write_json_atomic(path: str, data) -> str:
    return write_atomic(path, json.dumps(data, indent=1, default=str))


def copy_atomic(src: str, dst: str) -> str:
    with _replacing(dst) as tmp:
        shutil.copy2(src, tmp)
    return dst


class RunLocked(Exception):
    """Another `attnspec run` holds the folder's lock."""


def _holder(path: str) -> dict:
    """What the lock's holder wrote of itself (pid, host, start); {} while it has not written it yet."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def run_lock(path: str, what: str = "attnspec run"):
    """Hold `path` while the block runs; RunLocked if another process holds it.

    The lock is the kernel's (``fcntl.flock`` on the file): it is released when its holder ends,
    however it ends (Ctrl-C, SIGKILL, the OOM killer), so no pid is ever judged stale, and two runs
    can never both hold it.  The file stays; its text (pid, host, start) is for the refusal message."""
    import fcntl

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = _holder(path)
        raise RunLocked(f"another {what} (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started "
                        f"{holder.get('started', '?')}) is running in this folder and writes the same files; wait "
                        f"for it to finish, or run from another folder (its lock: {path})") from None
    try:
        me = {"pid": os.getpid(), "host": platform.uname().node, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # free: nobody's text in it (the file stays, so no one locks a removed file)
        os.close(fd)  # releases the lock
