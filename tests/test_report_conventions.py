"""The declared conventions per backend (issue 31) travel from the suite to the report: the suite records
each backend's `Backend.conventions` once (JSON and row stream), `attnspec run` keeps them from its
children, and the report sets each beside what the suite observed (conventions.csv, one table on the
page), rebuilt the same from the folder's raw/."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytest.importorskip("jinja2")

from attnspec import suites  # noqa: E402
from attnspec.backends.registry import resolve  # noqa: E402
from attnspec.properties.runner import suite_command  # noqa: E402
from attnspec.reports import build, inputs  # noqa: E402
from attnspec.reports.conventions import COLUMNS, CONVENTIONS  # noqa: E402

PLANTED = "tests.broken.convention_bugs:BackwardRandomOrder"  # declares a deterministic backward, is not


def _csv(path) -> dict:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert rows and list(rows[0]) == list(COLUMNS)
    return {(r["backend"], r["convention"]): r for r in rows}


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    """A real run: numpy-tiled and the planted kernel, the repeated-calls and knob properties."""
    work = tmp_path_factory.mktemp("conventions")
    cmd = suite_command(["numpy-tiled", PLANTED], str(work / "run.json"), str(work / "rows.jsonl"),
                        ["-q", "-n", "0", "-k", "test_repeated_backward or test_knob_setting or test_lse_base"])
    done = subprocess.run(cmd, cwd=str(work), capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]), ATTNSPEC_PROFILE="dev"))
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]  # the planted kernel fails
    return work


def test_the_suite_records_each_backends_declarations_once(suite_run):
    data = json.loads((suite_run / "run.json").read_text())
    by = {d["backend"]: d for d in data["declarations"]}
    assert len(data["declarations"]) == len(by) == 2  # once each, though every test of the first carried it
    for spec in ("numpy-tiled", PLANTED):
        backend = resolve(spec)
        assert by[backend.name] == json.loads(json.dumps(backend.conventions()))
    streamed = [json.loads(line) for line in (suite_run / "rows.jsonl").read_text().splitlines()]
    declared = [d["backend"] for e in streamed if "declarations" in e for d in e["declarations"]]
    assert sorted(declared) == sorted(by)
    # attnspec run's reader of a child's row stream keeps them (what it reports after a crash)
    progress = suites.SuiteProgress(redraw=False, stream=io.StringIO(), path=str(suite_run / "rows.jsonl"))
    progress.read()
    assert sorted(d["backend"] for d in progress.rows()["declarations"]) == sorted(by)


def test_the_report_sets_each_declaration_beside_what_the_suite_observed(suite_run, tmp_path):
    out = tmp_path / "out"
    build.build(inputs.collect([str(suite_run / "run.json")]), str(out))
    rows = _csv(out / "conventions.csv")
    assert {c for _, c in rows} == {name for name, _ in CONVENTIONS}
    tiled, planted = rows[("numpy-tiled", "deterministic")], rows[("broken-backward-random-order", "deterministic")]
    assert (tiled["declared"], tiled["agrees"]) == ("yes", "True") and "bitwise" in tiled["observed"]
    assert (planted["declared"], planted["agrees"]) == ("yes", "False") and "differs" in planted["observed"]
    knobs = rows[("numpy-tiled", "knobs")]  # observed through the knob family's checks, as declared
    assert knobs["declared"].startswith("block_size ∈ {128, 16") and knobs["agrees"] == "True"
    base = rows[("broken-backward-random-order", "lse_base")]  # undeclared: recorded, never judged
    assert (base["declared"], base["observed"], base["agrees"]) == ("", "e", "")
    page = (out / "index.html").read_text(encoding="utf-8")
    section = page[page.index('<section id="conventions">'):]
    section = section[:section.index("</section>")]
    assert section.count("<tr><td class=\"prop\">") == 2 and '<td class="disagree">yes' in section
    # rebuilt from the folder's raw/, the same table
    again = tmp_path / "again"
    build.build(inputs.collect([str(out)]), str(again))
    assert _csv(again / "conventions.csv") == rows


def test_results_without_declarations_say_so(tmp_path):
    suite = tmp_path / "old.json"
    suite.write_text(json.dumps({"conformance": [dict(backend="b", property="p", dtype="float32", status="passed",
                                                      examples=1, seconds=0.1, counterexample="", message="")],
                                 "semantics": []}))
    build.build(inputs.collect([str(suite)]), str(tmp_path / "out"))
    assert "No declarations recorded" in (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert (tmp_path / "out" / "conventions.csv").read_text().strip() == ",".join(COLUMNS)


@pytest.mark.parametrize("declarations", [{"backend": "b"}, [{"lse_base": "e"}], ["b"]])
def test_malformed_declarations_name_the_file(tmp_path, declarations):
    suite = tmp_path / "bad.json"
    suite.write_text(json.dumps({"conformance": [], "semantics": [], "declarations": declarations}))
    with pytest.raises(inputs.ReportInputError, match=f"{suite}: 'declarations' must be a list of objects"):
        inputs.read_suite_json(str(suite))


def test_the_fp8_and_bad_index_declarations_have_columns_that_name_their_questions():
    """P's rounding reads the fp8 family's p_dtype question, rejects_bad_indices every bad-index question."""
    from attnspec.backends.bad_indices import BAD_INPUTS
    from attnspec.reports.conventions import declared_text
    sources = dict(CONVENTIONS)
    assert sources["p_dtypes"] == ("semantics", ("p_dtype",))
    assert sources["rejects_bad_indices"][1] == tuple(f"bad_index_{k}" for k in BAD_INPUTS)
    declared = resolve("numpy-tiled").conventions()
    assert declared_text("p_dtypes", declared) == "e4m3: e4m3 · e5m2: e5m2"
    assert declared_text("p_dtypes", resolve("numpy-naive").conventions()) == ""  # no fp8: nothing declared
