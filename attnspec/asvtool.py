"""asv as `attnspec run` starts it: through this interpreter, with a configuration, results folder and
machine file of each process's own.  Standard library only.

asv is found the way Python finds it (`sys.executable -m asv`), so a virtual environment's
`attnspec`, called by its path without activating the venv, runs that venv's asv.  Every asv
process writes two shared files as it starts - `<results_dir>/benchmarks.json` while it discovers
the benchmarks, `~/.asv-machine.json` as it loads the machine - and two writing together leave
interleaved text (seen: a whole report lost to a JSONDecodeError in benchmarks.json).  So each
process gets a folder of its own (`process_folder`): its asv.conf.json, its results_dir and a HOME
holding a copy of the machine file.  attnspec/benchrun.py merges their results afterwards.
"""
from __future__ import annotations

import json
import os
import platform
import site
import sys

from attnspec import files, procs
from attnspec.reports.inputs import ReportInputError

ASV_DIR = os.path.join(".attnspec", "asv")  # under the current folder: one subfolder per benchmark grid
MACHINE_FILE = ".asv-machine.json"  # asv reads and rewrites it under HOME (asv.machine.MachineCollection)


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "asv", *args]


def missing() -> str | None:
    """Why asv cannot run from this interpreter, or None."""
    if procs.importable("asv"):
        return None
    return (f"asv is not installed for {sys.executable} (the Python running attnspec): "
            f"{sys.executable} -m pip install -e \".[bench]\"; or pass --no-bench to skip the benchmarks")


def grid_folder(grid: str) -> str:
    """A benchmark grid's own asv database (./.attnspec/asv/<grid>): a quick run at a commit never
    replaces the default or full sweep's results at that commit, and `asv compare` over one grid's
    config compares like with like."""
    return os.path.abspath(os.path.join(ASV_DIR, grid))


def write_config(folder: str) -> tuple[str, str]:
    """(config path, results folder): attnspec's asv configuration rewritten under `folder`; the
    benchmarks and the commit are attnspec's, the results land in folder/results."""
    conf = os.path.join(procs.ROOT, "asv.conf.json")
    try:
        with open(conf, encoding="utf-8") as f:  # asv allows // comments in it
            data = json.loads("\n".join(line for line in f if not line.lstrip().startswith("//")))
    except (OSError, ValueError) as e:
        raise ReportInputError(f"{conf}: cannot read attnspec's asv configuration ({e})") from None
    folder = os.path.abspath(folder)
    data.update(repo=procs.ROOT, benchmark_dir=os.path.join(procs.ROOT, data.get("benchmark_dir", "benchmarks")),
                results_dir=os.path.join(folder, "results"), env_dir=os.path.join(folder, "env"),
                html_dir=os.path.join(folder, "html"))
    path = files.write_json_atomic(os.path.join(folder, "asv.conf.json"), data)
    return path, data["results_dir"]


def _machine_entry(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return platform.uname().node in json.load(f)
    except (OSError, ValueError, TypeError):
        return False


def machine_file(folder: str) -> str:
    """A machine file with this host's entry, made once per grid folder: the user's own
    ~/.asv-machine.json when it has one (their machine name and details), else `asv machine --yes`."""
    home = os.path.join(folder, "home")
    path = os.path.join(home, MACHINE_FILE)
    if _machine_entry(path):
        return path
    users = os.path.expanduser(os.path.join("~", MACHINE_FILE))
    if _machine_entry(users):
        return files.copy_atomic(users, path)
    config, _ = write_config(folder)  # asv wants a configuration to start
    done = procs.watch(command("machine", "--yes", "--config", config), 120, env=process_env(home))
    if done.rc != 0 or not _machine_entry(path):
        raise ReportInputError(f"`asv machine --yes` failed ({done.describe()}): {done.output.strip()[-300:]}")
    return path


def process_env(home: str, **extra) -> dict:
    """The child environment of one asv process: HOME its own (for the machine file); what the
    user's HOME provides to Python and the frameworks stays theirs (user site-packages, caches)."""
    user_home = os.path.expanduser("~")
    keep = {"PYTHONUSERBASE": site.getuserbase(), "XDG_CACHE_HOME": os.path.join(user_home, ".cache"),
            "XDG_CONFIG_HOME": os.path.join(user_home, ".config"), "TRITON_HOME": user_home,
            "KERAS_HOME": os.path.join(user_home, ".keras")}
    if os.path.isfile(os.path.join(user_home, ".gitconfig")):  # asv asks git about the commit (safe.directory)
        keep["GIT_CONFIG_GLOBAL"] = os.path.join(user_home, ".gitconfig")
    env = procs.child_env(**extra)
    for key, value in keep.items():
        env.setdefault(key, value)
    env["HOME"] = home
    return env


def process_folder(grid_dir: str, name: str, machine: str) -> tuple[str, str, str]:
    """(config, results folder, HOME) of one asv process, emptied of an earlier run's results."""
    import shutil

    folder = os.path.join(grid_dir, "processes", name)
    shutil.rmtree(os.path.join(folder, "results"), ignore_errors=True)
    home = os.path.join(folder, "home")
    files.copy_atomic(machine, os.path.join(home, MACHINE_FILE))
    config, results = write_config(folder)
    return config, results, home
