"""attnspec backends (to be completed)."""
from __future__ import annotations


def add_parser(sub):
    p = sub.add_parser("backends", help="backends (not yet implemented)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    print("attnspec backends: not implemented yet")
    return 1
