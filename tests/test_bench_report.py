"""The benchmark sections beyond the T sweep: the loader's derived rates, the tables, the page.

tests/data/asv_sample_v2: real results of `asv run` (default grid, T cut to {4, 64, 256, 1024},
decode Lk 256 and 2048) on the 2-core dev VM for numpy-naive, numpy-tiled, torch-sdpa-cpu and
jax-dpa, with the machine benchmarks; recorded under load, so only relations that hold by
construction are asserted on its numbers.
"""
from __future__ import annotations

import os

import pytest

pd = pytest.importorskip("pandas")

from attnspec.reports import bench_tables  # noqa: E402
from attnspec.reports.asv_results import load_results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "data", "asv_sample_v2")


@pytest.fixture(scope="module")
def df():
    return load_results(SAMPLE)


def _one(df, **where):
    rows = df
    for key, value in where.items():
        rows = rows[rows[key] == value]
    assert len(rows) == 1, f"{where}: {len(rows)} rows"
    return rows.iloc[0]


def test_every_question_has_rows(df):
    time = df[df["metric"] == "time"]
    assert set(time["problem"]) == {"dense", "decode", "causal", "window-256"}
    assert {"float32", "bfloat16", "float16"} <= set(time[time["problem"] == "dense"]["dtype"])
    assert set(df[df["metric"] == "bandwidth"]["op"]) == {"16 MiB arrays", "512 MiB arrays"}
    assert {"float32", "bfloat16"} <= set(df[df["metric"] == "peak_gflops"]["dtype"])
    assert _one(df, metric="threads", backend="xla")["value"] == 1  # the XLA pin held in every run


def test_causal_rate_counts_visible_pairs_only(df):
    cost = pytest.importorskip("attnspec.specs.cost")
    t = _one(df, metric="time", backend="numpy-naive", problem="causal", T=1024, op="forward")
    g = _one(df, metric="gflops", backend="numpy-naive", problem="causal", T=1024, op="forward")
    pairs = 1024 * 1025 // 2
    assert g["value"] == pytest.approx(2 * 8 * pairs * 128 / t["value"] / 1e9)
    assert cost.useful_flops(1, 8, 1024, 1024, 64, causal=True) == 2 * 8 * pairs * 128


def test_window_rate_counts_the_window(df):
    t = _one(df, metric="time", backend="numpy-naive", problem="window-256", T=1024, op="forward")
    g = _one(df, metric="gflops", backend="numpy-naive", problem="window-256", T=1024, op="forward")
    pairs = 1024 * 256 - 255 * 256 // 2  # row i sees min(i, 255) + 1 keys
    assert g["value"] == pytest.approx(2 * 8 * pairs * 128 / t["value"] / 1e9)


def test_decode_bandwidth_is_kv_bytes_over_time(df):
    t = _one(df, metric="time", backend="numpy-naive", problem="decode", Lq=1, Lk=2048, kv_heads=2, dtype="float32")
    b = _one(df, metric="kv_gbps", backend="numpy-naive", problem="decode", Lq=1, Lk=2048, kv_heads=2, dtype="float32")
    assert b["value"] == pytest.approx(1 * 2 * 2048 * 128 * 4 / t["value"] / 1e9) and b["unit"] == "GB/s"
    assert pd.isna(t["T"]) and t["heads"] == 8  # decode rows have no T: Lq and Lk


def test_undeclared_features_have_no_rows(df):
    """torch-sdpa-cpu has no sliding window: skipped, never emulated."""
    window = df[(df["metric"] == "time") & (df["problem"] == "window-256")]
    assert "torch-sdpa-cpu" not in set(window["backend"]) and "numpy-naive" in set(window["backend"])


# -- the tables, on rows written here -----------------------------------------------------------

def _rows(*rows):
    base = dict(op="forward", batch=1, heads=8, E=64, machine="m", commit="c", unit="", clock="process",
                kv_heads=8, Lq=None, Lk=None, T=None, dtype="float32", problem="dense")
    return pd.DataFrame([base | r for r in rows])


def test_dtype_table_shares_the_dtypes_own_peak():
    bench = _rows(*[dict(backend="k", metric=m, T=t, dtype=d, value=v) for m, t, d, v in (
        ("time", 4, "bfloat16", 1e-5), ("time", 256, "bfloat16", 1e-3), ("time", 2048, "bfloat16", 0.1),
        ("gflops", 2048, "bfloat16", 50.0))],
        dict(backend="torch", metric="peak_gflops", dtype="bfloat16", value=200.0, problem=None, op="matmul"),
        dict(backend="numpy", metric="peak_gflops", dtype="float32", value=100.0, problem=None, op="matmul"))
    table = bench_tables.dtype_frame(bench)
    row = table.iloc[0]
    assert (row["backend"], row["dtype"], row["T=4"], row["T=2048"]) == ("k", "bfloat16", "10 µs", "100 ms")
    assert (row["largest T"], row["GFLOP/s there"]) == (2048, "50.0")
    assert row["% of dtype peak"] == "25 %"  # 50 of bfloat16's 200, not float32's 100


def test_decode_table_against_the_dram_triad():
    bench = _rows(dict(backend="k", metric="time", problem="decode", Lq=1, Lk=2048, value=1e-3),
                  dict(backend="k", metric="kv_gbps", problem="decode", Lq=1, Lk=2048, value=4.0),
                  dict(backend="copy", metric="bandwidth", op="512 MiB arrays", value=10.0, problem=None),
                  dict(backend="triad", metric="bandwidth", op="512 MiB arrays", value=8.0, problem=None),
                  dict(backend="triad", metric="bandwidth", op="16 MiB arrays", value=20.0, problem=None))
    row = bench_tables.decode_frame(bench).iloc[0]
    assert (row["time"], row["KV GB/s"], row["% of DRAM roof"]) == ("1 ms", "4.00", "50 %")


def test_gqa_table_ratio():
    bench = _rows(*[dict(backend="k", metric="time", problem="decode", Lq=1, Lk=lk, kv_heads=h, value=v)
                    for lk, h, v in ((256, 8, 1.0), (2048, 8, 8e-3), (2048, 2, 2e-3), (2048, 1, 1e-3))])
    row = bench_tables.gqa_frame(bench).iloc[0]
    assert (row["Lk"], row["Hkv=8"], row["Hkv=1"], row["Hkv=1 / Hkv=8"]) == (2048, "8 ms", "1 ms", "0.12")


def test_masked_table_against_the_dense_rate():
    bench = _rows(dict(backend="k", metric="gflops", problem="causal", T=1024, value=30.0),
                  dict(backend="k", metric="gflops", problem="dense", T=1024, value=60.0))
    row = bench_tables.masked_frame(bench).iloc[0]
    assert (row["problem"], row["useful / dense"]) == ("causal", "0.50")


def test_report_shows_the_new_sections(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("jinja2")
    from attnspec.reports import build, inputs

    summary = build.build(inputs.Inputs(asv_dirs=[SAMPLE]), str(tmp_path / "out"))
    page = (tmp_path / "out" / "index.html").read_text()
    for anchor in ("dtypes", "decode", "masked"):
        assert f'<section id="{anchor}">' in page
    assert "KV read bandwidth against Lk" in page and "Grouped KV heads" in page
    assert "bfloat16 matmul peak" in page and "useful / dense" in page
    assert page.count("<svg") >= 6  # time, memory, GFLOP/s, dtypes, decode, masked
    bench = pd.read_csv(tmp_path / "out" / "benchmarks.csv")
    assert {"problem", "kv_heads", "Lq", "Lk", "clock"} <= set(bench.columns) and summary["benchmark_rows"] == len(bench)


def test_every_benchmark_class_loads_by_its_class_and_method(tmp_path):
    """Names match on Class.method, whatever module asv found them in (a plug-in's own suite)."""
    import json

    box = tmp_path / "box"
    box.mkdir()
    (box / "machine.json").write_text('{"machine": "box"}')
    decode = [["'k'"], ["1"], ["8"], ["2", "1"], ["1"], ["2048"], ["64"], ["'float32'"], ["'process'"]]
    half = [["'k'"], ["1"], ["8"], ["256"], ["64"], ["'forward'"], ["'bfloat16'"], ["'process'"]]
    results = {"bench_attnspec.TimeGroupedDecode.time_decode": [[2e-3, 1e-3], decode],
               "bench_attnspec.TimeHalfPrecision.time_attention": [[1e-3], half],
               "bench_machine.Bandwidth.track_bandwidth": [[20.0, 10.0], [["'triad'"], ["16", "512"], ["1"]]]}
    (box / "c0ffee-env.json").write_text(json.dumps({"version": 2, "commit_hash": "c0ffee", "params": {},
                                                    "result_columns": ["result", "params"], "results": results}))
    df = load_results(str(tmp_path))
    grouped = df[(df["metric"] == "time") & (df["problem"] == "decode")].sort_values("kv_heads")
    assert list(grouped["kv_heads"]) == [1, 2] and set(grouped["Lq"]) == {1} and set(grouped["op"]) == {"forward"}
    kv = df[df["metric"] == "kv_gbps"].sort_values("kv_heads")
    assert kv["value"].tolist() == pytest.approx([1 * 1 * 2048 * 128 * 4 / 1e-3 / 1e9, 2 * 2048 * 128 * 4 / 2e-3 / 1e9])
    half_row = _one(df, metric="time", dtype="bfloat16")
    assert (half_row["problem"], half_row["T"], half_row["Lq"], half_row["Lk"]) == ("dense", 256, 256, 256)
    bw = df[df["metric"] == "bandwidth"].sort_values("value")
    assert list(bw["op"]) == ["512 MiB arrays", "16 MiB arrays"] and set(bw["backend"]) == {"triad"}
    assert set(bw["unit"]) == {"GB/s"}


def test_gpu_rows_are_read_against_the_gpus_own_roofs(tmp_path):
    """A GPU built-in's rows and the GPU's roofs go under "<host> gpu"; the CPU's stay apart.
    Which backend ran on a GPU the results say themselves (Device.track_on_gpu, 1 = GPU)."""
    import json

    box = tmp_path / "box"
    box.mkdir()
    (box / "machine.json").write_text('{"machine": "box"}')
    half = [["'numpy-naive'", "'torch-sdpa-cuda-flash'"], ["1"], ["8"], ["2048"], ["64"], ["'forward'"],
            ["'bfloat16'"], ["'wall'"]]
    peak = [["'torch'", "'torch-cuda'"], ["'bfloat16'"], ["'unset'"], ["1"]]
    results = {"bench_attention.TimeHalfPrecision.time_attention": [[1.0, 1e-4], half],
               "bench_attention.Device.track_on_gpu": [[0.0, 1.0], [["'numpy-naive'", "'torch-sdpa-cuda-flash'"]]],
               "bench_machine.PeakMatmul.track_peak_gflops": [[1000.0, 700000.0], peak],
               "bench_machine.Bandwidth.track_bandwidth": [[20.0, 4000.0], [["'triad'", "'cuda-triad'"], ["512"], ["1"]]]}
    (box / "c0ffee-env.json").write_text(json.dumps({"version": 2, "commit_hash": "c0ffee", "params": {},
                                                    "result_columns": ["result", "params"], "results": results}))
    df = load_results(str(tmp_path))
    assert _one(df, metric="time", backend="torch-sdpa-cuda-flash")["machine"] == "box gpu"
    assert _one(df, metric="gflops", backend="torch-sdpa-cuda-flash")["machine"] == "box gpu"  # derived rows follow
    assert _one(df, metric="time", backend="numpy-naive")["machine"] == "box"
    assert bench_tables.peaks_by_dtype(df) == {("box", "bfloat16"): 1000.0, ("box gpu", "bfloat16"): 700000.0}
    roofs = bench_tables.bandwidth_roofs(df)
    assert bench_tables.dram_roof(roofs, "box gpu")[1] == 4000.0 and bench_tables.dram_roof(roofs, "box")[1] == 20.0
    table = bench_tables.dtype_frame(df).set_index("backend")
    flops = 4 * 8 * 2048 * 2048 * 64  # two products of (2048 x 64) by (64 x 2048), 8 heads
    assert table.loc["torch-sdpa-cuda-flash", "% of dtype peak"] == f"{100 * flops / 1e-4 / 1e9 / 700000.0:.0f} %"
    assert table.loc["numpy-naive", "% of dtype peak"] == f"{100 * flops / 1.0 / 1e9 / 1000.0:.0f} %"


# -- the device of a backend: from the results alone ------------------------------------------------

def _device_results(folder, machine="box"):
    """An asv results folder (as `attnspec run` leaves it): a CPU built-in, a GPU plug-in no
    installed adapter knows, and a GPU built-in whose results record no device."""
    import json

    box = folder / machine
    box.mkdir(parents=True)
    (box / "machine.json").write_text(json.dumps({"machine": machine}))
    backends = ["'numpy-naive'", "'nosuch.gpu_kernel:attention'", "'torch-sdpa-cuda-flash'"]
    sweep = [backends, ["1"], ["8"], ["256", "1024"], ["64"], ["'forward'"], ["'float32'"], ["'wall'"]]
    memory = [backends[:2], ["1"], ["8"], ["1024"], ["64"], ["'forward'"], ["'float32'"]]
    results = {
        "bench_attention.TimeAttention.time_attention": [[1e-3, 2e-2, 1e-5, 2e-5, 1e-5, 2e-5], sweep],
        "bench_memory.MemoryAttention.track_extra_bytes": [[3.3e7, 1e6], memory],
        # the plug-in on the GPU; torch-sdpa-cuda-flash has no Device row here (older results)
        "bench_attention.Device.track_on_gpu": [[0.0, 1.0], [backends[:2]]],
        "bench_machine.PeakMatmul.track_peak_gflops": [[100.0, 50000.0], [["'numpy'", "'torch-cuda'"], ["'float32'"],
                                                                          ["'unset'"], ["1"]]],
    }
    (box / "c0ffee-env.json").write_text(json.dumps({"version": 2, "commit_hash": "c0ffee", "params": {},
                                                    "result_columns": ["result", "params"], "results": results}))
    return folder


def test_device_rows_file_a_gpu_backends_timings_under_the_gpu_machine(tmp_path):
    df = load_results(str(_device_results(tmp_path)))
    kernel = "nosuch.gpu_kernel:attention"
    for metric in ("time", "gflops", "memory", "memory_multiple"):  # measured and derived rows alike
        rows = df[(df["backend"] == kernel) & (df["metric"] == metric)]
        assert len(rows) and set(rows["machine"]) == {"box gpu"}, metric
        cpu = df[(df["backend"] == "numpy-naive") & (df["metric"] == metric)]
        assert len(cpu) and set(cpu["machine"]) == {"box"}, metric
    # no Device row for it: the results do not say, so it stays with the host (no adapter is asked)
    assert set(df[df["backend"] == "torch-sdpa-cuda-flash"]["machine"]) == {"box"}
    assert _one(df, metric="peak_gflops", machine="box gpu")["backend"] == "torch"  # the GPU's roof beside it
    assert bench_tables.peaks_by_dtype(df) == {("box", "float32"): 100.0, ("box gpu", "float32"): 50000.0}


@pytest.mark.slow
def test_device_rows_are_read_without_importing_an_adapter(tmp_path):
    """reports/ reads result files only: loading them imports no backend adapter and no framework."""
    import subprocess
    import sys

    _device_results(tmp_path / "results")
    code = ("import sys; from attnspec.reports.asv_results import load_results; df = load_results(sys.argv[1]); "
            "print(sorted(set(df[(df['backend'] == 'nosuch.gpu_kernel:attention') & (df['metric'] == 'time')]['machine']))); "
            "print(sorted(m for m in sys.modules if m.startswith(('attnspec.backends', 'attnspec.benchmarks', "
            "'torch', 'jax', 'nosuch'))))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "results")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    machines, imported = done.stdout.strip().splitlines()
    assert machines == "['box gpu']" and imported == "[]", done.stdout


def test_the_report_puts_the_gpu_backend_under_the_gpu_machine(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("jinja2")
    from attnspec.reports import build, inputs

    summary = build.build(inputs.Inputs(asv_dirs=[str(_device_results(tmp_path / "results"))]), str(tmp_path / "out"))
    bench = pd.read_csv(tmp_path / "out" / "benchmarks.csv")
    time = bench[bench["metric"] == "time"]
    assert set(time[time["backend"] == "nosuch.gpu_kernel:attention"]["machine"]) == {"box gpu"}
    assert set(time[time["backend"] == "numpy-naive"]["machine"]) == {"box"}
    assert set(summary["machines"]) == {"box", "box gpu"}
