"""attnspec's benchmarks in a plug-in's own repository: its commits on asv's time axis.

    cd my-kernel                      # a git repository with your package (pyproject.toml)
    python -m attnspec.benchmarks.plugin_suite mykernel.attn:attention
    asv machine --yes
    asv continuous main HEAD          # or: asv run, asv publish, asv compare A B

writes asv.conf.json (asv builds your package per commit into a virtualenv, as attnspec's own
configuration does) and benchmarks/bench_attnspec.py (asv's default folder; --bench-dir for
another), which re-exports attnspec's benchmark classes with ATTNSPEC_BACKENDS set to your
backend (any name the plug-in contract takes: an entry point, package.module:attr).  Benchmark
names keep their class and method (bench_attnspec.TimeAttention.time_attention), so
`attnspec.reports.asv_results.load_results` and `attnspec report .asv/results` read your results
like attnspec's.

asv's environment gets attnspec by its install_command: after your package's wheel, it installs
attnspec with its bench extra - from the folder your attnspec was installed from (a clone, pip
install -e or pip install DIR), else attnspec==<your version> from your package index.  The
command says which route it wrote (route()).  Your frameworks come with your package's
dependencies (or --requirement, repeatable, for asv's matrix).  It works from a virtual
environment: nothing relies on what the base interpreter has installed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

BENCH_DIR = "benchmarks"  # asv's default (attnspec installs as attnspec.benchmarks: no clash)
BENCH_MODULE = '''"""attnspec's benchmarks with {backend} as the backend (python -m attnspec.benchmarks.plugin_suite).

asv collects the classes this module holds; the grid is attnspec's (ATTNSPEC_BENCH_GRID,
ATTNSPEC_BENCH_T, ... as in attnspec's benchmarks/README.md).
"""
import os

os.environ.setdefault("ATTNSPEC_BACKENDS", {backend!r})

from attnspec.benchmarks.bench_attention import TimeAttention, TimeHalfPrecision  # noqa: E402,F401
from attnspec.benchmarks.bench_decode import TimeDecode, TimeGroupedDecode  # noqa: E402,F401
from attnspec.benchmarks.bench_masks import TimeMasked  # noqa: E402,F401
from attnspec.benchmarks.bench_serving import TimePagedDecode, TimeVarlenPrefill  # noqa: E402,F401
from attnspec.benchmarks.bench_memory import MemoryAttention  # noqa: E402,F401
'''


def route() -> tuple[str, str]:
    """(pip's argument for attnspec, in words where it comes from): the folder this attnspec was installed
    from (PEP 610's direct_url.json), else this version from the package index."""
    import json as _json
    from importlib import metadata
    from urllib.parse import unquote, urlparse

    for dist in metadata.distributions(name="attnspec"):
        text = dist.read_text("direct_url.json")
        url = _json.loads(text).get("url", "") if text else ""
        if url.startswith("file://") and os.path.isdir(unquote(urlparse(url).path)):
            folder = unquote(urlparse(url).path)
            return f"{folder}[bench]", f"the folder your attnspec was installed from ({folder})"
    version = metadata.version("attnspec")
    return f"attnspec[bench]=={version}", f"attnspec {version} from your package index"


def config(project: str, requirements=(), bench_dir: str = BENCH_DIR) -> dict:
    """The plug-in's asv.conf.json: attnspec's choices (benchmarks/README.md), its own package, and
    attnspec installed after it (`route`)."""
    source, _ = route()
    conf = {
        "version": 1, "project": project, "repo": ".", "branches": ["HEAD"], "dvcs": "git",
        "environment_type": "virtualenv",
        "build_command": ["python -m pip wheel --no-deps --no-build-isolation -w {build_cache_dir} {build_dir}"],
        "install_command": ["in-dir={env_dir} python -m pip install {wheel_file}",
                            f"in-dir={{env_dir}} python -m pip install {source}"],
        "build_cache_size": 8, "launch_method": "forkserver", "benchmark_dir": bench_dir,
        "env_dir": ".asv/env", "results_dir": ".asv/results", "html_dir": ".asv/html",
    }
    if requirements:
        conf["matrix"] = {"req": {f"pip+{r}": [""] for r in requirements}}
    return conf


def write(repo: str, backend: str, requirements=(), project: str | None = None, force: bool = False,
          bench_dir: str = BENCH_DIR) -> list[str]:
    """Write asv.conf.json and the benchmark folder into `repo`; returns the paths written."""
    if not backend or not isinstance(backend, str):
        raise ValueError(f"backend must be a backend name (e.g. mypkg.attn:attention); got {backend!r}")
    if not os.path.isdir(repo):
        raise ValueError(f"repo {repo!r} is not a folder")
    paths = [os.path.join(repo, "asv.conf.json"), os.path.join(repo, bench_dir, "__init__.py"),
             os.path.join(repo, bench_dir, "bench_attnspec.py")]
    existing = [p for p in paths if os.path.exists(p)]
    if existing and not force:
        raise ValueError(f"{', '.join(existing)} already exist(s): pass --force to replace")
    os.makedirs(os.path.join(repo, bench_dir), exist_ok=True)
    name = project or os.path.basename(os.path.abspath(repo))
    with open(paths[0], "w") as f:
        json.dump(config(name, requirements, bench_dir), f, indent=4)
        f.write("\n")
    with open(paths[1], "w") as f:
        f.write("")
    with open(paths[2], "w") as f:
        f.write(BENCH_MODULE.format(backend=backend))
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnspec.benchmarks.plugin_suite", description=__doc__.split("\n\n")[0])
    p.add_argument("backend", help="your backend: an entry-point name or package.module:attr")
    p.add_argument("--repo", default=".", help="your git repository (default: the current folder)")
    p.add_argument("--requirement", action="append", default=[], metavar="PIP_SPEC",
                   help="a requirement asv installs into the environment (repeatable), e.g. attnspec's")
    p.add_argument("--bench-dir", default=BENCH_DIR, help=f"asv's benchmark folder (default: {BENCH_DIR})")
    p.add_argument("--force", action="store_true", help="replace an existing asv.conf.json and bench_attnspec.py")
    args = p.parse_args(argv)
    try:
        for path in write(args.repo, args.backend, args.requirement, force=args.force, bench_dir=args.bench_dir):
            print(f"wrote {path}")
    except ValueError as e:
        print(f"plugin_suite: {e}", file=sys.stderr)
        return 2
    print(f"asv's environment gets attnspec from {route()[1]}")
    print("next: asv machine --yes && asv continuous main HEAD")
    return 0


if __name__ == "__main__":
    sys.exit(main())
