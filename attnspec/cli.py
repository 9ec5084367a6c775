"""The `attnspec` command: `run`, `report`, `backends`.

Each subcommand lives in its own module under attnspec/commands, which loads what it
needs only when it runs; the modules share attnspec.errors and never import this one.
A user error (unknown backend, missing results, asv missing) exits 2 with one line on
stderr and no traceback.
"""
from __future__ import annotations

import argparse
import os
import sys

from attnspec.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnspec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    from attnspec.commands import backends_cmd, report_cmd, run_cmd

    for module in (run_cmd, report_cmd, backends_cmd):
        module.add_parser(sub)
    return parser


def main(argv=None) -> int:
    # `--backend mypkg.attn:sdpa` names a package in the current folder, as `python -m` and pytest
    # (rootdir) find it; the installed `attnspec` script does not put the current folder on sys.path
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `attnspec backends --json | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UserError as e:
        print(f"attnspec {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"attnspec {args.command}: interrupted; the previous report is left as it was", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
