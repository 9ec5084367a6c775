"""The suite's rows as a run goes: taken from each test's reports, streamed, summarized, written.

A plugin object (`RowRecorder`, registered by properties/plugin.py when a run is configured):
`pytest_runtest_logreport` is handed the report only, and the rows belong to the run - they live
in its ``config.stash`` (properties/stash.py).  It runs where the reports arrive: in the process
of a plain run, on pytest-xdist's controller for a spread one (the workers' reports reach it).
The row stream (``--attnspec-rows``, JSON lines): first ``{"collected": [test ids]}``, then per
test ``{"nodeid", "row", "semantics"}``, and once per backend ``{"declarations": [its conventions]}``
(`Backend.conventions`), flushed, so `attnspec run` follows its children by it.
"""
from __future__ import annotations

import json
import os

import pytest

from attnspec.properties import cores, profiles, results
from attnspec.properties.stash import COLLECTED_SENT, IN_SUITE, ROW_STREAM, ROWS, RUN


class RowRecorder:
    def __init__(self, config):
        self.config = config

    def stream(self, entry: dict) -> None:
        """One line of the --attnspec-rows file (flushed: a reader follows it while the run goes on)."""
        out = self.config.stash.get(ROW_STREAM, None)
        if out is not None:
            out.write(json.dumps(entry, default=str) + "\n")
            out.flush()

    def pytest_collection_finish(self, session):
        """The row stream starts with the tests the run collected (`attnspec run` shows progress from it)."""
        self.stream({"collected": [item.nodeid for item in session.items
                                   if any(k == results.TEST_KEY for k, _ in item.user_properties)]})

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        """Under pytest-xdist the controller collects nothing itself: the first worker's test ids."""
        if not self.config.stash.get(COLLECTED_SENT, False):
            self.config.stash[COLLECTED_SENT] = True
            self.stream({"collected": [i for i in ids if "[" in i]})

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report, config):
        """pytest counts as the suite does: 'recorded' is its own word; a harness fault is an error."""
        row = results.row_of(report)
        if row is None or report.when != "call":
            return None
        if row["status"] == "recorded":
            return "recorded", "r", "RECORDED"
        if row["status"] == "error":
            return "error", "E", "ERROR"
        return None

    def pytest_runtest_logreport(self, report):
        row = results.row_of(report)
        semantics = results.semantics_of(report)
        rows = self.config.stash[ROWS]
        if row is not None:
            rows["conformance"].append(row)
        rows["semantics"].extend(semantics)
        if row is not None or semantics:
            self.stream({"nodeid": report.nodeid, "row": row, "semantics": semantics})
        known = {d["backend"] for d in rows["declarations"]}
        for declared in results.declared_of(report):
            if declared["backend"] not in known:  # each test of the first one carries it: once
                known.add(declared["backend"])
                rows["declarations"].append(declared)
                self.stream({"declarations": [declared]})

    def pytest_terminal_summary(self, terminalreporter, config):
        found = config.stash[ROWS]
        rows = found["conformance"]
        if not rows:
            return
        from attnspec.specs.problem import DTYPE_NAMES

        tr, dtypes = terminalreporter, list(reversed(DTYPE_NAMES))
        tr.section("attnspec: per backend (problems: drawn and fixed problems the checks ran)")
        for line in results.backend_lines(rows):
            tr.write_line(line)
        narrowed = results.limits_lines(rows)
        if narrowed:
            tr.section("attnspec: checks narrowed by declared limits or declined calls")
            for line in narrowed:
                tr.write_line(line)
        attributed = results.attribution_lines(rows)
        if attributed:
            tr.section("attnspec: what the failures need")
            for line in attributed:
                tr.write_line(line)
        if found["semantics"]:
            tr.section("attnspec: semantics profile (observed per dtype; 'ok' = as declared, blank = nothing declared)")
            for line in results.semantics_lines(found["semantics"], dtypes):
                tr.write_line(line)
        if config.getoption("verbose") > 0 or len({r["backend"] for r in rows}) <= profiles.DEEP_BACKENDS:
            tr.section("attnspec: problems tried per property and dtype")
            for line in results.examples_lines(rows, dtypes):
                tr.write_line(line)
        run = config.stash.get(RUN, None)
        if run is not None:
            if any(r["reproducer"] for r in rows):
                tr.write_line(f"reproducers: {results.shown_path(run.repro_dir)}/ (python <file>)")
            tr.write_line(f"attnspec: seed {run.options.seed} ({run.seed_from}); the same verdicts again: "
                          f"--hypothesis-seed={run.options.seed}")

    def pytest_sessionfinish(self, session):
        config = session.config
        if hasattr(config, "workerinput"):  # an xdist worker: the controller writes the file
            return
        run, rows = config.stash.get(RUN, None), config.stash[ROWS]
        here = str(config.invocation_params.dir)
        in_suite = config.stash.get(IN_SUITE, False)
        path = config.getoption("attnspec_json", None) or (
            run.json_path if run is not None and (in_suite or rows["conformance"]) else None)
        if path:
            results.write_json(os.path.join(here, path), dict(rows, run=results.run_record(run)))
        if in_suite and rows["conformance"] and not (config.option.keyword or config.option.markexpr):
            cores.record_seconds(here, rows["conformance"])  # the next run's longest-first order
