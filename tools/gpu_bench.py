"""tools/gpu_check.sh's benchmark step: asv over the GPU built-ins at a commit, as `attnspec run` runs them,
the results folders it wrote listed one a line for the report.

    python3 tools/gpu_bench.py COMMIT FOLDERS_FILE BACKEND [BACKEND ...]

Exits with asv's status."""
from __future__ import annotations

import sys

from attnspec import benchrun


def main(argv: list[str]) -> int:
    commit, listing, *backends = argv
    folders, rc, not_merged = benchrun.run_benchmarks([(n, n) for n in backends], "default", commit)
    with open(listing, "w", encoding="utf-8") as f:
        f.writelines(d + "\n" for d in folders)
    print("asv results:", *folders, "status", rc, *(f"not merged: {s}" for s in not_merged))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
