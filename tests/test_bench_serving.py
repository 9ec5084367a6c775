"""The serving formats' benchmarks (benchmarks/bench_serving.py, issue 30): a paged decode batch and a
mixed-length varlen prefill - the timed call is the backend's own format call, prepared once; the loader
rates them (KV bytes read, useful pairs only) and the report draws them."""
from __future__ import annotations

import json

import numpy as np
import pytest

from attnspec.backends import registry, serving
from attnspec.specs import cost
from attnspec.specs import formats as Fm

pd = pytest.importorskip("pandas")


def test_prefill_lengths_halve_from_the_longest_and_repeat_every_four():
    assert cost.prefill_lengths(1024, 4) == [1024, 512, 256, 128]
    assert cost.prefill_lengths(3, 6) == [3, 1, 1, 1, 3, 1]
    with pytest.raises(ValueError, match="T"):
        cost.prefill_lengths(0, 4)


@pytest.mark.parametrize("fmt, fields", [
    ("paged-NHD", dict(positions="per_sequence", kv_lengths=np.array([9, 4]))),
    ("packed", dict(positions="per_sequence", is_causal=True, causal_alignment="bottom_right",
                    q_lengths=np.array([5, 2]), kv_lengths=np.array([9, 4]))),
])
def test_a_prepared_format_call_is_the_harness_call_of_the_same_problem(fmt, fields):
    """What the benchmark times returns what the suite's call returns (the same lowering, no NaN fill)."""
    backend = registry.resolve("numpy-tiled")
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 2, 5, 8)), rng.standard_normal((2, 2, 9, 8)), rng.standard_normal((2, 2, 9, 8))
    run = serving.prepare_format(backend, fmt, q, k, v, "float64", page_size=4, **fields)
    got = np.asarray(run(), dtype=np.float64)
    if fmt == "packed":  # (total_q, H, Ev) raised to (B, H, Lq, Ev), padded rows 0 as the harness's
        got = Fm.from_packed(got, np.array([0, 5, 7]), 5)
        want = serving.forward_packed(backend, q, k, v, "float64", rng=0, **fields)
    else:
        want = serving.forward_paged(backend, q, k, v, "float64", page_size=4, rng=0, **fields)
    np.testing.assert_array_equal(got, want)


def test_a_backend_without_the_format_is_skipped_in_setup_with_its_formats():
    """Declined from the class's declarations (onnxruntime-attention takes padded calls only): asv's skip."""
    from attnspec.benchmarks import bench_serving

    with pytest.raises(NotImplementedError, match="takes no paged-NHD call"):
        bench_serving.TimePagedDecode().setup("onnxruntime-attention", 4, 8, 8, 1, 64, 64, "float32", 16, "process")
    with pytest.raises(NotImplementedError, match="takes no packed call"):
        bench_serving.TimeVarlenPrefill().setup("onnxruntime-attention", 4, 8, 64, 64, "float32", "process")


def _results(tmp_path, paged: list, varlen: list) -> str:
    """An asv results folder (format v2) with the two benchmarks' times for numpy-tiled."""
    machine = tmp_path / "results" / "box"
    machine.mkdir(parents=True)
    (machine / "machine.json").write_text(json.dumps({"machine": "box", "version": 1}))
    cols = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b"]
    results = {
        "bench_serving.TimePagedDecode.time_paged_decode": [
            paged, [["'numpy-tiled'"], ["4"], ["8"], ["8"], ["1"], ["2048"], ["64"], ["'float32'"], ["16", "128"],
                    ["'process'"]], "v", 0, 1.0, [None] * 2, [None] * 2],
        "bench_serving.TimeVarlenPrefill.time_varlen_prefill": [
            varlen, [["'numpy-tiled'"], ["4"], ["8"], ["256", "1024"], ["64"], ["'float32'"], ["'process'"]], "v", 0,
            1.0, [None] * 2, [None] * 2]}
    (machine / "abc-existing.json").write_text(json.dumps(
        {"commit_hash": "abc", "params": {"machine": "box"}, "result_columns": cols, "results": results,
         "version": 2}))
    return str(tmp_path / "results")


def test_the_loader_rates_paged_decode_by_kv_bytes_and_varlen_by_useful_pairs(tmp_path):
    from attnspec.reports.asv_results import load_results

    df = load_results(_results(tmp_path, [0.01, 0.02], [0.1, 1.0]))
    gbps = df[(df["metric"] == "kv_gbps") & (df["problem"] == "paged_decode")].sort_values("page_size")
    assert list(gbps["page_size"]) == [16, 128]
    kv = 4 * 8 * 2048 * (64 + 64) * 4  # B * Hkv * Lk * (E + Ev) * float32
    np.testing.assert_allclose(gbps["value"], [kv / 0.01 / 1e9, kv / 0.02 / 1e9])
    rate = df[(df["metric"] == "gflops") & (df["problem"] == "varlen_prefill")].sort_values("T")
    useful = [sum(2 * 8 * n * (n + 1) // 2 * 128 for n in (t, t // 2, t // 4, t // 8)) for t in (256, 1024)]
    np.testing.assert_allclose(rate["value"], [useful[0] / 0.1 / 1e9, useful[1] / 1.0 / 1e9])
    assert set(df[df["problem"] == "varlen_prefill"]["Lq"]) == {256, 1024}  # sized by the longest


def test_the_report_draws_both_in_its_serving_section(tmp_path):
    from attnspec.reports import bench_sections
    from attnspec.reports.asv_results import load_results
    from attnspec.reports.tables import benchmarks_frame

    # the report's own frame (its columns), as attnspec run and attnspec report build it
    frames = type("Frames", (), {"bench": benchmarks_frame([_results(tmp_path, [0.01, 0.02], [0.1, 1.0])])})()
    data = bench_sections.serving_data(frames)
    assert data["measured"] and data["batch"] == 4
    assert data["paged"]["rows"][0][:4] == ["numpy-tiled", "float32", "16", "2048"]
    assert [row[2] for row in data["varlen"]["rows"]] == ["256", "1024"]
    assert data["varlen"]["rows"][1][3] == "1024 512 256 128"
    assert "<svg" in str(data["paged_plot"]) and "<svg" in str(data["varlen_plot"])
    empty = type("Frames", (), {"bench": load_results(_results(tmp_path / "none", [None, None], [None, None]))})()
    assert bench_sections.serving_data(empty) == {"measured": False}

