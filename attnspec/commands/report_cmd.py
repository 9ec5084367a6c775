"""attnspec report: rebuild the report from stored results, running nothing.

RESULTS may be suite JSON files (`pytest properties --attnspec-json`), asv results folders
(one subfolder per machine) and earlier report folders (their raw/ copy); all are merged,
which is how a CPU box's and a GPU box's results end up on one page.  An input that cannot be
read is left out and named ("skipped: path — why"); the rest is written and the exit status is 1.
"""
from __future__ import annotations

import os
import sys

from attnspec.errors import UserError


def add_parser(sub):
    p = sub.add_parser("report", help="rebuild the report from stored results (runs nothing)",
                       description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("results", nargs="*", metavar="RESULTS",
                   help="suite JSON files, asv results folders or report folders (default: the --out folder's "
                        "own stored results)")
    p.add_argument("--out", default=os.path.join("reports", "out"),
                   help="report folder (default: ./reports/out, under the current folder)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from attnspec.reports import build, inputs, writer

    try:
        writer.check_out_dir(args.out)
    except writer.OutDirError as e:
        raise UserError(str(e)) from None
    paths = args.results
    if not paths:
        if not os.path.isdir(os.path.join(args.out, inputs.RAW)):
            raise UserError(f"no stored results in {os.path.join(args.out, inputs.RAW)}: run `attnspec run` first, "
                            "or name RESULTS (suite JSON files, asv results folders, report folders)")
        paths = [args.out]
    try:
        build.require_modules()
        summary = build.build(inputs.collect(paths), args.out)
    except inputs.ReportInputError as e:
        raise UserError(str(e)) from None
    for skip in summary["skipped"]:
        print(f"attnspec report: skipped: {skip}", file=sys.stderr)
    machines = ", ".join(summary["machines"]) or "no benchmarks"
    print(f"attnspec report: wrote {os.path.join(summary['out'], 'index.html')} "
          f"({summary['backends']} backends, {summary['conformance_rows']} conformance rows, "
          f"{summary['benchmark_rows']} benchmark rows from {machines})")
    if summary["skipped"]:  # written, but not all of it: a script must not take it for the whole
        print(f"attnspec report: the report is incomplete: {len(summary['skipped'])} input(s) could not be read",
              file=sys.stderr)
        return 1
    return 0
