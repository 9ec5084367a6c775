"""The report folder: CSV schemas, the page, escaping, atomic replacement, merging machines."""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
pytest.importorskip("jinja2")

import markupsafe  # noqa: E402 - Jinja2's escaping

from attnspec.reports import build, inputs  # noqa: E402
from attnspec.reports.writer import recover  # noqa: E402

SAMPLE = os.path.join(os.path.dirname(__file__), "data", "report_sample")
SUITE = os.path.join(SAMPLE, "suite_cpu.json")
ASV = os.path.join(SAMPLE, "asv_results")

SCHEMAS = {
    "conformance.csv": ["backend", "property", "dtype", "status", "examples", "seconds", "counterexample", "message",
                        "attribution", "outside_limits", "declined"],
    "semantics.csv": ["backend", "question", "dtype", "observed", "declared", "agrees"],
    "benchmarks.csv": ["backend", "op", "batch", "heads", "T", "E", "dtype", "metric", "value", "unit", "machine",
                       "commit", "clock", "problem", "kv_heads", "Lq", "Lk", "grid", "page_size"],
    "scaling.csv": ["backend", "op", "metric", "exponent", "r2"],
    "worked_examples.csv": ["source", "quantity", "kind", "printed", "computed", "agrees"],
    "verdicts.csv": ["backend", "verdict", "passed", "failed", "error", "skipped", "deviations", "semantics contradicted",
                     "reason"],
}


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def header(path):
    with open(path, newline="", encoding="utf-8") as f:
        return next(csv.reader(f))


def make_report(out, paths=(SUITE, ASV), **kw):
    return build.build(inputs.collect(list(paths)), str(out), **kw)


def second_machine(tmp_path, name="gpu-box", factor=0.1):
    """A copy of the sample asv results under another machine's name, `factor` times the values."""
    root = tmp_path / f"asv-{name}"
    shutil.copytree(ASV, root)
    (src,) = [d for d in os.listdir(root) if os.path.isdir(root / d)]
    os.rename(root / src, root / name)
    machine = json.loads((root / name / "machine.json").read_text())
    (root / name / "machine.json").write_text(json.dumps(dict(machine, machine=name)))
    for f in (root / name).glob("*.json"):
        if f.name == "machine.json":
            continue
        data = json.loads(f.read_text())
        data["params"]["machine"] = name
        for entry in data["results"].values():
            entry[0] = [None if x is None else x * factor for x in entry[0]]
        f.write_text(json.dumps(data))
    return root


def test_csv_files_have_the_documented_columns(tmp_path):
    out = tmp_path / "out"
    summary = make_report(out)
    for name, columns in SCHEMAS.items():
        assert header(out / name) == columns, name
    conf = read_csv(out / "conformance.csv")
    assert {r["status"] for r in conf} <= set(inputs.STATUSES)
    assert len(conf) == summary["conformance_rows"] == 80
    bench = read_csv(out / "benchmarks.csv")
    assert {"time", "memory"} <= {r["metric"] for r in bench}
    scaling = read_csv(out / "scaling.csv")
    naive_time = [r for r in scaling if r["backend"] == "numpy-naive" and r["metric"] == "time" and r["op"] == "forward"]
    assert len(naive_time) == 1 and 1.0 < float(naive_time[0]["exponent"]) < 3.0


def test_page_is_self_contained_with_every_section(tmp_path):
    out = tmp_path / "out"
    make_report(out)
    page = (out / "index.html").read_text(encoding="utf-8")
    for section in ('id="verdict"', 'id="conformance"', 'id="semantics"', 'id="performance"', 'id="worked"'):
        assert section in page
    assert "<svg" in page and re.search(r"numpy-naive \(\d\.\d\d\)", page)  # the fitted slope in the legend
    assert "<script" not in page.lower() and "<link" not in page.lower()
    for fetch in ('src="http', 'href="http', "url(http", "@import", "https://"):  # nothing from the network
        assert fetch not in page
    # the failure in the sample shows its counterexample, escaped but whole
    assert "q = np.full((1, 1, 2, 4), 11.0)" in page


def test_every_section_has_its_template_and_data_function():
    """build.SECTIONS is the page's list: each anchor needs sections/<anchor>.html.j2 and page.<anchor>_data."""
    from attnspec.reports import page

    env = page.environment()
    for anchor, _title in build.SECTIONS:
        env.get_template(f"sections/{anchor}.html.j2")  # raises TemplateNotFound
        assert callable(getattr(page, f"{anchor}_data", None)), anchor


def test_the_templates_ship_in_a_non_editable_install():
    """pyproject's package-data must name every file under reports/templates (a wheel has nothing else)."""
    from pathlib import PurePosixPath  # matches as setuptools' globs do: '*' stays within one folder

    import tomllib

    with open(os.path.join(os.path.dirname(os.path.dirname(build.__file__)), "pyproject.toml"), "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    assert setuptools["package-dir"]["attnspec.reports"] == "reports"  # the folder installs as attnspec.reports
    globs = setuptools["package-data"]["attnspec.reports"]
    root = os.path.join(os.path.dirname(build.__file__), "templates")
    files = [os.path.relpath(os.path.join(d, n), os.path.dirname(root)).replace(os.sep, "/")
             for d, _, names in os.walk(root) for n in names if "__pycache__" not in d]
    assert files and [f for f in files if not any(PurePosixPath(f).match(g) for g in globs)] == []


@pytest.mark.slow
def test_the_page_is_written_from_a_folder_outside_the_checkout(tmp_path):
    """The templates are found in the installed attnspec.reports, whatever the current folder
    (no top-level `reports` package there to lean on)."""
    import subprocess
    import sys

    code = ("import sys; from attnspec.reports import build, inputs; "
            "build.build(inputs.collect([sys.argv[1]]), 'out'); "
            "print(sorted(m for m in sys.modules if m == 'reports' or m.startswith('reports.')))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code, SUITE], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "[]"  # nothing loaded under a second, top-level name
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert 'id="conformance"' in page and "q = np.full((1, 1, 2, 4), 11.0)" in page


def test_failure_attribution_reaches_the_csv_and_older_results_read_without_it(tmp_path):
    """The suite's rows gained "attribution" (the features a failure needs); results written before
    it lack the field and read as empty, not as a corrupt file."""
    data = json.loads(Path(SUITE).read_text())
    failed = next(i for i, r in enumerate(data["conformance"]) if r["status"] == "failed")
    data["conformance"][failed]["attribution"] = "needs: causal, gqa"
    assert all("attribution" not in r for i, r in enumerate(data["conformance"]) if i != failed)
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps(data))
    out = tmp_path / "out"
    make_report(out, [str(suite)])
    rows = read_csv(out / "conformance.csv")
    assert [r["attribution"] for r in rows if r["attribution"]] == ["needs: causal, gqa"]
    assert {r["attribution"] for r in rows} == {"", "needs: causal, gqa"}
    assert inputs.read_suite_json(SUITE)["conformance"][0]["attribution"] == ""  # the sample predates it


def test_a_check_its_declared_limits_narrowed_says_so_in_the_csv_the_matrix_and_the_verdict(tmp_path):
    """A passed edge grid that a declared limit cut (suite rows' outside_limits) is never shown as a plain
    pass: the CSV keeps the count, the matrix chip's tooltip and the verdict line say it."""
    with open(SUITE) as f:
        data = json.load(f)
    passed = next(i for i, r in enumerate(data["conformance"]) if r["status"] == "passed")
    data["conformance"][passed]["outside_limits"] = "3 outside the declared limits (E > 128: 3)"
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps(data))
    out = tmp_path / "out"
    make_report(out, [str(suite)])
    rows = read_csv(out / "conformance.csv")
    assert [r["outside_limits"] for r in rows if r["outside_limits"]] == ["3 outside the declared limits (E > 128: 3)"]
    page = (out / "index.html").read_text()
    assert "3 outside the declared limits (E &gt; 128: 3)" in page and "1 narrowed by declared limits" in page


def test_strings_from_backends_are_escaped(tmp_path):
    evil = "<script>alert('x')</script>"
    data = json.loads(Path(SUITE).read_text())
    data["conformance"][0].update(backend=evil, status="failed", message=f"bad {evil}", counterexample=evil)
    data["semantics"][0].update(backend=evil, observed=evil, declared="<b>zeros</b>", agrees=False)
    suite = tmp_path / "evil.json"
    suite.write_text(json.dumps(data))
    asv = tmp_path / "asv"
    shutil.copytree(ASV, asv)
    for f in asv.glob("*/*.json"):  # a benchmarked backend with a hostile name: legends, tables
        f.write_text(f.read_text().replace("'numpy-tiled'", "'<script>$x$</script>'"))
    out = tmp_path / "out"
    make_report(out, [str(suite), str(asv)])
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "<script" not in page.lower()
    assert str(markupsafe.escape(evil)) in page  # escaped, and whole
    assert "<b>zeros</b>" not in page and "&lt;b&gt;zeros&lt;/b&gt;" in page
    assert "&lt;script&gt;" in page.split('id="performance"')[1]  # the SVG legend, as text
    assert evil in {r["backend"] for r in read_csv(out / "conformance.csv")}  # CSVs keep the raw text


def test_checks_a_hung_backend_never_ran_are_one_entry_and_nothing_tested_is_not_a_pass(tmp_path):
    data = json.loads(Path(SUITE).read_text())
    row = dict(examples=0, seconds=0.0, counterexample="", dtype="float32")
    data["conformance"] += [dict(row, backend="hangs", property="(suite)", dtype="", status="timed_out",
                                 message="a forward call did not return within the per-call limit")]
    data["conformance"] += [dict(row, backend="hangs", property=p, status="failed",
                                 message=inputs.NOT_ATTEMPTED + "an earlier forward call did not return")
                            for p in ("rows_sum_to_one", "order_preserved", "matches_reference")]
    data["conformance"] += [dict(row, backend="declines", property=p, status="skipped", message="declined")
                            for p in ("rows_sum_to_one", "order_preserved")]
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps(data))
    out = tmp_path / "out"
    summary = make_report(out, [str(suite)])
    page = (out / "index.html").read_text(encoding="utf-8")
    listed = page.split('<section id="failures">')[1].split('<section id="deviations">')[0]
    assert listed.count("an earlier forward call did not return") == 1  # one entry, not one per check
    assert "<code>3 checks</code>" in page
    verdicts = {r["backend"]: r for r in read_csv(out / "verdicts.csv")}
    assert verdicts["hangs"]["verdict"] == "timed out" and verdicts["hangs"]["failed"] == "3"
    assert verdicts["declines"]["verdict"].startswith("not tested") and verdicts["declines"]["reason"] == "declined"
    assert summary["not_tested"] == {"declines": "declined"}


def test_a_failed_build_leaves_the_previous_report_whole(tmp_path):
    out = tmp_path / "out"
    make_report(out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def fail(staged):
        assert os.path.exists(os.path.join(staged, "index.html"))  # everything written, then the failure
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        make_report(out, [SUITE], _before_swap=fail)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"conformance": [ {"backend": ')
    with pytest.raises(inputs.ReportInputError, match="every input was skipped"):  # nothing readable: no report
        make_report(out, [str(corrupt)])
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert sorted(os.listdir(tmp_path)) == ["corrupt.json", "out"]  # no staging folder left behind


def test_an_interrupted_swap_is_undone_by_the_next_write(tmp_path):
    out = tmp_path / "out"
    make_report(out, [SUITE])
    os.rename(out, tmp_path / ".out.old-abc123")  # killed between the two renames
    recover(str(out))
    assert (out / "index.html").exists() and not (tmp_path / ".out.old-abc123").exists()


def test_merging_two_machines_and_two_suite_runs(tmp_path):
    gpu_suite = tmp_path / "suite_gpu.json"
    gpu_suite.write_text(json.dumps({"conformance": [
        dict(backend="torch-sdpa-cuda-flash", property="rows_sum_to_one", dtype="float16", status="passed",
             examples=10, seconds=0.5, counterexample=None, message=None)], "semantics": []}))
    cpu_suite = json.loads(Path(SUITE).read_text())
    cpu_suite["conformance"].append(dict(backend="torch-sdpa-cuda-flash", property="rows_sum_to_one", dtype="float16",
                                         status="skipped", examples=0, seconds=0, counterexample=None,
                                         message="no CUDA device"))
    (tmp_path / "suite_cpu.json").write_text(json.dumps(cpu_suite))
    gpu = second_machine(tmp_path)
    out = tmp_path / "out"
    summary = make_report(out, [str(tmp_path / "suite_cpu.json"), ASV, str(gpu_suite), str(gpu)])
    assert summary["machines"] == ["gpu-box", "vm"]
    bench = read_csv(out / "benchmarks.csv")
    assert {r["machine"] for r in bench} == {"gpu-box", "vm"}
    scaling = read_csv(out / "scaling.csv")
    assert header(out / "scaling.csv") == SCHEMAS["scaling.csv"] + ["machine"]  # one fit per machine
    assert {r["machine"] for r in scaling} == {"gpu-box", "vm"}
    conf = read_csv(out / "conformance.csv")
    cuda = [r for r in conf if r["backend"] == "torch-sdpa-cuda-flash"]
    assert [r["status"] for r in cuda] == ["passed"]  # a real result supersedes the CPU box's skip
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "gpu-box" in page and "numpy-naive @ gpu-box" in page


def test_report_folders_rebuild_and_merge(tmp_path):
    cpu, gpu, merged = tmp_path / "cpu", tmp_path / "gpu", tmp_path / "merged"
    make_report(cpu)
    make_report(gpu, [str(second_machine(tmp_path))])
    make_report(merged, [str(cpu), str(gpu)])
    assert {r["machine"] for r in read_csv(merged / "benchmarks.csv")} == {"gpu-box", "vm"}
    assert len(read_csv(merged / "conformance.csv")) == 80
    before = read_csv(cpu / "benchmarks.csv")
    make_report(cpu, [str(cpu)])  # a rebuild from its own raw/ copy reads the same results
    assert read_csv(cpu / "benchmarks.csv") == before


@pytest.mark.parametrize("content, expected", [
    ("{not json", "not valid JSON"),
    ('{"something": []}', "not a suite results file"),
    ('{"conformance": [{"backend": "x"}], "semantics": []}', "lacks property"),
    ('{"conformance": [{"backend": "x", "property": "p", "dtype": "float32", "status": "great", "examples": 1, '
     '"seconds": 0, "counterexample": null, "message": null}], "semantics": []}', "has status 'great'"),
])
def test_corrupt_suite_files_are_named_with_what_is_wrong(tmp_path, content, expected):
    """Read beside a good input, a corrupt one is left out and named: "path — why"."""
    path = tmp_path / "results.json"
    path.write_text(content)
    with pytest.raises(inputs.ReportInputError, match=expected) as info:
        inputs.read_suite_json(str(path))
    assert str(path) in str(info.value)
    collected = inputs.collect([SUITE, str(path)])
    assert len(collected.skipped) == 1 and collected.skipped[0].startswith(f"{path} — ")
    assert re.search(expected, collected.skipped[0]) and collected.conformance  # the good file is read


def _truncate(path, keep: float = 0.5) -> None:
    """What a writer killed mid-file leaves: the first part of the text."""
    text = path.read_text()
    path.write_text(text[:int(len(text) * keep)])


def test_a_truncated_asv_results_file_is_a_named_skip_and_the_rest_is_written(tmp_path):
    asv = tmp_path / "asv"
    shutil.copytree(ASV, asv)
    (result,) = [f for f in asv.glob("*/*.json") if f.name != "machine.json"]
    _truncate(result)
    gpu = second_machine(tmp_path)
    out = tmp_path / "out"
    summary = make_report(out, [SUITE, str(asv), str(gpu)])
    assert len(summary["skipped"]) == 1, summary["skipped"]
    assert summary["skipped"][0].startswith(f"{result} — not a readable asv results file")
    assert {r["machine"] for r in read_csv(out / "benchmarks.csv")} == {"gpu-box"}  # the other machine's rows stay
    assert len(read_csv(out / "conformance.csv")) > 0
    page = (out / "index.html").read_text(encoding="utf-8")
    assert f"skipped: {result} — not a readable asv results file" in page


def test_a_truncated_suite_file_in_a_report_folder_is_a_named_skip(tmp_path):
    out, rebuilt = tmp_path / "out", tmp_path / "rebuilt"
    make_report(out)
    suite = out / "raw" / inputs.SUITE_FILE
    _truncate(suite)
    summary = make_report(rebuilt, [str(out)])
    assert len(summary["skipped"]) == 1 and summary["skipped"][0].startswith(f"{suite} — not valid JSON")
    assert summary["benchmark_rows"] > 0 and read_csv(rebuilt / "benchmarks.csv")  # the asv results stay
    assert f"skipped: {suite} — not valid JSON" in (rebuilt / "index.html").read_text(encoding="utf-8")


def test_detection_power_reaches_the_page_and_its_csv(tmp_path):
    """A detection_power.csv folder (python tools/detection_power.py --defects tests.defects --out DIR) is a report
    input: the page gets its table, the folder its CSV and raw/ copy; a wrong CSV is named."""
    from attnspec.reports import build, inputs

    measured = tmp_path / "dp"
    measured.mkdir()
    (measured / "detection_power.csv").write_text(
        "dtype,defect,smallest_d_rejected,flash_rule_smallest_d_rejected,target,meets_target,runs,"
        "flash_rule_control_failed\nfloat16,gain,0.001,0.0003,0.003,True,1,gradients_match_reference\n")
    build.build(inputs.collect([str(measured)]), str(tmp_path / "out"))
    page = (tmp_path / "out" / "index.html").read_text()
    assert 'id="detection"' in page and "0.0003" in page and "gradients_match_reference" in page
    assert "own false alarms on the correct kernel: none" in page
    assert (tmp_path / "out" / "detection_power.csv").read_text().startswith("dtype,defect")
    rebuilt = inputs.collect([str(tmp_path / "out")])  # the report folder keeps it in raw/
    assert rebuilt.detection and rebuilt.detection[0]["smallest_d_rejected"] == "0.001"
    (measured / "detection_power.csv").write_text("a,b\n1,2\n")
    import pytest

    with pytest.raises(inputs.ReportInputError, match="not a detection_power.csv"):
        inputs.read_detection_csv(str(measured / "detection_power.csv"))
    (skip,) = inputs.collect([str(measured)]).skipped  # among other inputs: left out, named
    assert skip.startswith(f"{measured} — ") and "not a detection_power.csv" in skip
