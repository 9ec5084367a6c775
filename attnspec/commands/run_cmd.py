"""attnspec run (to be completed)."""
from __future__ import annotations


def add_parser(sub):
    p = sub.add_parser("run", help="run (not yet implemented)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    print("attnspec run: not implemented yet")
    return 1
