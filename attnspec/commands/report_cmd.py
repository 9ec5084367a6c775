"""attnspec report (to be completed)."""
from __future__ import annotations


def add_parser(sub):
    p = sub.add_parser("report", help="report (not yet implemented)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    print("attnspec report: not implemented yet")
    return 1
