"""Writing the report folder atomically: build in a temporary folder beside it, then swap.

The swap is two renames (current -> .name.old-*, new -> name); a crash between them leaves
the previous report under its .old name, and the next write puts it back before starting.
Nothing half-written ever sits at the report's path.
"""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile


class OutDirError(ValueError):
    """The report folder's path holds something that is not a report: never overwritten."""


def check_out_dir(out_dir: str) -> None:
    """Refuse a path whose contents a swap would delete: a file, or a folder that is not a report.

    A report folder (index.html or raw/ inside) or an empty folder may be replaced; anything else
    is the user's and stays.
    """
    path = os.path.abspath(out_dir)
    if os.path.isfile(path) or (os.path.exists(path) and not os.path.isdir(path)):
        raise OutDirError(f"--out {out_dir!r} is a file, not a report folder; choose another path")
    if os.path.isdir(path) and os.listdir(path) and not (
            os.path.isfile(os.path.join(path, "index.html")) or os.path.isdir(os.path.join(path, "raw"))):
        raise OutDirError(f"--out {out_dir!r} is a folder that holds something other than an attnspec report "
                          "(no index.html, no raw/); it would be replaced whole, so it is left alone: "
                          "choose a new or empty folder")


def _old_copies(out_dir: str) -> list:
    parent, name = os.path.split(os.path.abspath(out_dir))
    return sorted(glob.glob(os.path.join(parent, f".{name}.old-*")), key=os.path.getmtime)


def recover(out_dir: str) -> None:
    """Put back a previous report that an interrupted swap left under its .old name."""
    olds = _old_copies(out_dir)
    if olds and not os.path.exists(out_dir):
        os.rename(olds[-1], out_dir)
        olds = olds[:-1]
    for old in olds:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staging(out_dir: str):
    """Yield a fresh folder to fill; on success it replaces out_dir, on any error it is removed."""
    out_dir = os.path.abspath(out_dir)
    parent, name = os.path.split(out_dir)
    os.makedirs(parent, exist_ok=True)
    recover(out_dir)
    check_out_dir(out_dir)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    try:
        yield tmp
        swap(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def swap(new_dir: str, out_dir: str) -> None:
    parent, name = os.path.split(out_dir)
    os.chmod(new_dir, 0o755)  # mkdtemp makes it 0700; a report is for reading
    if os.path.exists(out_dir):
        old = tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent)
        os.rmdir(old)  # only its unique name is wanted
        os.rename(out_dir, old)
        os.rename(new_dir, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(new_dir, out_dir)


def write_text(folder: str, name: str, text: str) -> str:
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return path
