"""The report answers at a glance: the verdict per backend first (which properties fail, at which
dtypes; which deviations are declared), the failures apart from the declared deviations (those
folded away), plots that stay readable with two dozen backends, and a page of a few hundred KB.
A headless browser opens it where one is installed."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
pytest.importorskip("jinja2")
import pandas as pd  # noqa: E402

from attnspec.reports import build, inputs, plots, tables  # noqa: E402

FAMILIES = {"numpy": ("naive", "tiled"), "torch": ("math", "sdpa-cpu", "sdpa-cpu-math", "sdpa-cpu-flash", "flex"),
            "jax": ("naive", "dpa"), "onnxruntime": ("attention",), "openvino": ("sdpa", "sdpa-f32"),
            "keras": ("numpy", "jax", "torch"), "flax": ("linen", "nnx"), "transformers": ("sdpa", "eager"),
            "mlx": ("sdpa",)}
BACKENDS = [f"{f}-{m}" for f, members in FAMILIES.items() for m in members] + ["mypkg.attn:sdpa"]
DTYPES = ("float64", "float32", "bfloat16", "float16")
PROPERTIES = [f"property_{i:02d}" for i in range(24)]
LONG_SCRIPT = "EARLIER = []\n" + "q = np.array([...])  # a shrunk problem\n" * 40


def conformance_rows() -> list:
    """Every backend passes every property at every dtype, but for one failing backend and one
    declaring a deviation."""
    rows = []
    for b in BACKENDS:
        for p in PROPERTIES:
            for d in DTYPES:
                rows.append(dict(backend=b, property=p, dtype=d, status="passed", examples=6, seconds=0.1,
                                 counterexample=None, message=None))
    for r in rows:
        if r["backend"] == "torch-flex" and r["property"] == "property_03" and r["dtype"] in ("float16", "bfloat16"):
            r.update(status="failed", message="property_03 failed on backend 'torch-flex' at "
                     f"{r['dtype']}\n  row 0 differs by 0.5 > 0.01", counterexample=LONG_SCRIPT,
                     attribution="needs: window")
        if r["backend"] == "keras-numpy" and r["property"] in ("property_05", "property_06"):
            r.update(status="deviation", counterexample=LONG_SCRIPT,
                     message="declared deviation: grouped KV heads raise | observed: operands could not be broadcast")
    return rows


def bench_rows() -> pd.DataFrame:
    """Forward and forward+backward time, memory and GFLOP/s from T=4 to 2048 for every backend."""
    rows = []
    for i, b in enumerate(BACKENDS):
        for op in ("forward", "forward_backward"):
            for t in (4, 16, 64, 256, 512, 1024, 2048):
                time = (1e-5 + 1e-9 * t * t) * (1 + i / 10) * (3 if op == "forward_backward" else 1)
                for metric, value, unit in (("time", time, "seconds"), ("memory", 64.0 * t * t, "bytes"),
                                            ("gflops", 4 * 8 * t * t * 64 / time / 1e9, "GFLOP/s")):
                    rows.append(dict(backend=b, op=op, batch=1, heads=8, T=t, E=64, dtype="float32", metric=metric,
                                     value=value, unit=unit, machine="vm", commit="0" * 40, clock=None,
                                     problem="dense", kv_heads=8, Lq=t, Lk=t))
    return pd.DataFrame(rows, columns=list(tables.BENCH_COLUMNS))


@pytest.fixture(scope="module")
def page(tmp_path_factory, request):
    work = tmp_path_factory.mktemp("glance")
    suite = work / "suite.json"
    suite.write_text(json.dumps({"conformance": conformance_rows(), "semantics": []}))
    asv = work / "asv"
    (asv / "vm").mkdir(parents=True)  # an asv results folder; its rows come from bench_rows()
    mp = pytest.MonkeyPatch()
    request.addfinalizer(mp.undo)
    mp.setattr(inputs, "copy_asv_results", lambda src, dst, commit, skipped=None: os.makedirs(dst, exist_ok=True) or True)
    mp.setattr(tables, "benchmarks_frame", lambda dirs, skipped=None: bench_rows())
    out = work / "out"
    build.build(inputs.Inputs(conformance=conformance_rows(), asv_dirs=[str(asv)]), str(out))
    return out, (out / "index.html").read_text(encoding="utf-8")


def section(html: str, anchor: str) -> str:
    return html.split(f'<section id="{anchor}">')[1].split("</section>")[0]


def test_the_first_section_says_per_backend_what_fails_and_what_deviates(page):
    out, html = page
    assert html.index('<section id="verdict">') < html.index('<section id="failures">') \
        < html.index('<section id="deviations">') < html.index('<section id="conformance">')
    verdict = section(html, "verdict")
    assert (f"does not conform: 1 · conforms with declared deviations: 1 · conforms: {len(BACKENDS) - 2}</b>"
            in verdict)
    rows = re.findall(r"<tr><td class=\"nowrap\"><b>([^<]+)</b></td><td class=\"(\w+) nowrap\">", verdict)
    assert rows[0] == ("torch-flex", "failed") and rows[1] == ("keras-numpy", "deviation")  # worst first
    assert {b for b, kind in rows[2:]} == set(BACKENDS) - {"torch-flex", "keras-numpy"}
    flex = verdict.split("<b>torch-flex</b>")[1].split("</tr>")[0]
    assert re.search(r'<a href="#(f-torch-flex-property_03-[a-z0-9]+)"><code>property_03</code></a> \[bf16, f16\]', flex)
    assert "f64, f32, bf16, f16" in flex and "576 in 96 checks" in flex  # dtypes run; problems tried
    keras = verdict.split("<b>keras-numpy</b>")[1].split("</tr>")[0]  # one line per declaration, not per property
    assert re.search(r'title="grouped KV heads raise">grouped KV heads raise</a>: 2 properties \[f64, f32, bf16, f16\]',
                     keras), keras


def test_failures_and_declared_deviations_are_apart_and_the_deviations_folded(page):
    out, html = page
    failures, deviations = section(html, "failures"), section(html, "deviations")
    assert failures.count('<details class="failure"') == 2 and "keras-numpy" not in failures
    anchor = re.search(r'href="#(f-torch-flex-property_03-[a-z0-9]+)"', section(html, "verdict")).group(1)
    assert f'id="{anchor}"' in failures and "Attribution:</b> needs: window" in failures
    assert '<details class="deviations">' in deviations and "<details class=\"deviations\" open" not in deviations
    assert "1 declared deviation(s) in 1 backend(s)" in deviations
    assert "2 properties [f64, f32, bf16, f16]: property_05, property_06" in deviations
    assert "grouped KV heads raise" in deviations and "operands could not be broadcast" in deviations
    assert "torch-flex" not in deviations and LONG_SCRIPT not in deviations  # no scripts for known departures


def test_plots_draw_each_family_in_a_panel_of_its_own(page):
    out, html = page
    perf = section(html, "performance")
    svgs = re.findall(r"<svg.*?</svg>", perf, re.S)
    assert len(svgs) == 6  # time, memory, GFLOP/s x forward, forward + backward
    for svg in svgs:
        titles = set(re.findall(r">(numpy|torch|jax|onnxruntime|openvino|keras|flax|transformers|mlx|plug-ins)</text>", svg))
        assert titles == set(FAMILIES) | {"plug-ins"}
    assert all(b in svgs[0] for b in BACKENDS)


def test_the_page_stays_within_a_few_hundred_kb(page):
    out, html = page
    size = len(html.encode("utf-8"))
    assert size < 400_000, f"index.html is {size / 1000:.0f} KB with {len(BACKENDS)} backends"


def test_the_svg_is_compacted_without_changing_its_text():
    rows = bench_rows()
    rows = rows[(rows["metric"] == "time") & (rows["op"] == "forward")]
    svg = plots.family_panels(rows, "seconds per call", best="min")
    assert "font-family: 'DejaVu" not in svg and 'style="fill: none; stroke: #b0b0b0' not in svg
    attributes = re.findall(r'(?:d|x|y|viewBox)="([^"]*)"', svg)
    assert attributes and not [a for a in attributes if re.search(r"\d\.\d\d", a)]  # coordinates to 0.1 pt
    for name in BACKENDS:
        assert f">{name}</text>" in svg  # legends keep the names whole


def browser():
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.mark.slow
@pytest.mark.skipif(browser() is None, reason="no headless browser (chromium) installed")
def test_a_headless_browser_opens_the_page(page, tmp_path):
    out, html = page
    done = subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                           f"file://{out / 'index.html'}"], capture_output=True, text=True, timeout=180)
    dom = done.stdout
    assert done.returncode == 0 and '<section id="verdict">' in dom, done.stderr[-2000:]
    assert dom.count("<svg") == html.count("<svg") and "does not conform" in dom


def test_the_header_names_the_baselines_benchmarked_but_not_checked(tmp_path, monkeypatch):
    """`attnspec run --backend X` times X beside --baselines it does not check: the page says which."""
    monkeypatch.setattr(inputs, "copy_asv_results",
                        lambda src, dst, commit, skipped=None: os.makedirs(dst, exist_ok=True) or True)
    monkeypatch.setattr(tables, "benchmarks_frame", lambda dirs, skipped=None: bench_rows())
    (tmp_path / "asv" / "vm").mkdir(parents=True)
    checked = [r for r in conformance_rows() if r["backend"] not in ("numpy-naive", "jax-dpa")] + [
        dict(backend="torch-sdpa-cuda-flash", property=p, dtype="float16", status="skipped", examples=0, seconds=0.0,
             counterexample=None, message="CUDA is not available") for p in PROPERTIES]
    build.build(inputs.Inputs(conformance=checked, asv_dirs=[str(tmp_path / "asv")]), str(tmp_path / "out"))
    meta = re.search(r'<p class="meta">(.*?)</p>', (tmp_path / "out" / "index.html").read_text(encoding="utf-8")).group(1)
    assert f"{len(BACKENDS) - 2} backend(s) checked and 1 not tested here (why: under the verdict table) · " \
        "benchmarked beside them, not checked: jax-dpa, numpy-naive" in meta, meta
