"""The asv results loader and the scaling fits, on results recorded here (tests/data/asv_sample/).

Machine "testbox": real results of `asv run` on the 2-core dev VM (numpy-naive, numpy-tiled,
torch-sdpa-cpu, jax-dpa; T = 4..1024, E = 16, 64). Machine "handmade": edge cases written by
hand (inf CIs, skipped and failed combinations, a benchmark missing from benchmarks.json, an
unknown benchmark). The last test runs asv itself at two commits of a throwaway repository.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

pd = pytest.importorskip("pandas")

from attnspec.backends import registry  # noqa: E402
from attnspec.reports.asv_results import COLUMNS, fit_scaling, load_results  # noqa: E402
from tests._helpers import ACTIVATED_PATH  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "data", "asv_sample")
ROOT = os.path.dirname(HERE)
ELSEWHERE = tempfile.gettempdir()  # a folder outside the checkout: only the installed attnspec imports


@pytest.fixture(scope="module")
def df():
    return load_results(SAMPLE)


def _one(df, **where):
    rows = df
    for key, value in where.items():
        rows = rows[rows[key] == value]
    assert len(rows) == 1, f"{where}: {len(rows)} rows"
    return rows.iloc[0]


def test_columns_and_types(df):
    assert list(df.columns[:len(COLUMNS)]) == COLUMNS
    assert set(df["machine"]) == {"testbox", "handmade"}
    time = df[(df["metric"] == "time") & (df["machine"] == "testbox")]
    assert set(time["backend"]) == {"numpy-naive", "numpy-tiled", "torch-sdpa-cpu", "jax-dpa"}
    assert set(time["T"]) == {4, 128, 256, 512, 1024} and set(time["E"]) == {16, 64}
    assert set(time["op"]) == {"forward", "forward_backward"} and set(time["unit"]) == {"s"}
    assert (time["batch"] == 1).all() and (time["heads"] == 8).all()
    assert time["commit"].str.fullmatch(r"[0-9a-f]{40}").all()
    assert set(time["clock"]) == {"process"}  # one thread: CPU time (benchmarks/_common.py)


def test_params_come_from_repr_strings(df):
    """'numpy-naive' (a repr) becomes numpy-naive; '2048' becomes the int 2048."""
    row = _one(df, machine="testbox", metric="memory", backend="numpy-naive", T=1024, op="forward")
    assert (row["backend"], row["dtype"], row["T"], row["E"]) == ("numpy-naive", "float32", 1024, 64)


def test_naive_memory_is_one_score_matrix(df):
    """numpy-naive works in place: the one (B, H, T, T) float32 buffer, within the issue's 0.75-1.25."""
    row = _one(df, machine="testbox", metric="memory_multiple", backend="numpy-naive", T=1024, op="forward")
    assert 0.75 <= row["value"] <= 1.25
    mem = _one(df, machine="testbox", metric="memory", backend="numpy-naive", T=1024, op="forward")
    assert row["value"] == pytest.approx(mem["value"] / (1 * 8 * 1024 ** 2 * 4))


def test_gflops_is_cost_over_time(df):
    cost = pytest.importorskip("attnspec.specs.cost")
    t = _one(df, machine="testbox", metric="time", backend="numpy-naive", T=512, E=64, op="forward")
    g = _one(df, machine="testbox", metric="gflops", backend="numpy-naive", T=512, E=64, op="forward")
    assert g["value"] == pytest.approx(cost.forward_flops(1, 8, 512, 512, 64) / t["value"] / 1e9)
    both = _one(df, machine="testbox", metric="gflops", backend="numpy-naive", T=512, E=64, op="forward_backward")
    assert both["unit"] == "GFLOP/s" and both["value"] > 0


def test_machine_rows(df):
    peaks = df[(df["metric"] == "peak_gflops") & (df["machine"] == "testbox")]
    assert set(peaks["backend"]) == {"numpy", "torch"} and (peaks["value"] > 1).all()
    for clock in ("process", "wall"):
        ratio = _one(df, machine="testbox", metric="fidelity_ratio", clock=clock)
        assert ratio["backend"] == "torch-sdpa-cpu" and ratio["T"] == 2048 and 0.5 < ratio["value"] < 2
        timer = _one(df, machine="testbox", metric="timer_time", clock=clock)
        assert timer["unit"] == "s" and timer["value"] > 0
    threads = df[(df["metric"] == "threads") & (df["machine"] == "testbox")]
    assert set(threads["backend"]) == {"blas", "torch"}


def test_skipped_and_failed_combinations_are_dropped(df):
    hand = df[(df["machine"] == "handmade") & (df["metric"] == "time")]
    # 2 backends x 3 T in the file: one None (skipped), one NaN (failed) -> 4 rows
    assert len(hand) == 4
    assert not hand["value"].isna().any()
    assert set(zip(hand["backend"], hand["T"], strict=True)) == {("numpy-naive", 64), ("numpy-naive", 128),
                                                    ("numpy-naive", 256), ("my.pkg:attn", 128)}


def test_infinite_confidence_bounds_become_nan(df):
    row = _one(df, machine="handmade", metric="time", backend="numpy-naive", T=64)
    assert math.isnan(row["ci_low"]) and math.isnan(row["ci_high"])
    row = _one(df, machine="handmade", metric="time", backend="numpy-naive", T=128)
    assert row["ci_low"] == pytest.approx(0.0009) and row["ci_high"] == pytest.approx(0.0011)


def test_without_benchmarks_json_the_default_names_apply(tmp_path):
    shutil.copytree(os.path.join(SAMPLE, "handmade"), tmp_path / "handmade")
    alone = load_results(str(tmp_path))
    row = _one(alone, metric="memory", backend="numpy-naive", T=256)
    assert row["E"] == 64 and row["op"] == "forward" and row["value"] == 262144.0
    assert row["commit"] == "0123456789abcdef0123456789abcdef01234567"


def test_unknown_benchmark_keeps_its_name_and_params(df):
    rows = df[(df["machine"] == "handmade") & (df["metric"] == "track_something")]
    assert sorted(rows["value"]) == [1.0, 2.0]
    assert not (df["metric"] == "time_never").any()  # a benchmark whose result is null: no rows


def test_fit_naive_memory_is_quadratic_and_tiled_linear(df):
    real = df[df["machine"] == "testbox"]
    mem = fit_scaling(real, "memory", t_min=256).set_index(["backend", "op"])
    # T^2 score block plus O(T*E) output and row statistics: the small terms pull the local
    # slope below 2 at T <= 1024 (1.25 -> 1.06 score blocks), never above it
    assert 1.8 < mem.loc[("numpy-naive", "forward"), "exponent"] <= 2.0
    assert mem.loc[("numpy-naive", "forward"), "r2"] > 0.99
    # a tiled kernel keeps one (T, block) tile and the O(T*E) accumulator: linear in T
    assert mem.loc[("numpy-tiled", "forward"), "exponent"] == pytest.approx(1, abs=0.1)
    assert (mem["n"] == 3).all() and (mem["t_lo"] == 256).all() and (mem["t_hi"] == 1024).all()


def test_fit_of_one_group_is_the_ordinary_log_log_line(df):
    """With a single E the fit is plain least squares: compare with numpy.polyfit."""
    np = pytest.importorskip("numpy")
    rows = df[(df["machine"] == "testbox") & (df["metric"] == "time") & (df["E"] == 64)]
    fit = fit_scaling(rows, "time", t_min=128).set_index(["backend", "op"])
    for (backend, op), got in fit.iterrows():
        sub = rows[(rows["backend"] == backend) & (rows["op"] == op) & (rows["T"] >= 128)]
        x, y = np.log(sub["T"].astype(float)), np.log(sub["value"])
        slope, intercept = np.polyfit(x, y, 1)
        r2 = 1 - ((y - slope * x - intercept) ** 2).sum() / ((y - y.mean()) ** 2).sum()
        assert got["exponent"] == pytest.approx(slope) and got["r2"] == pytest.approx(r2)
        assert got["n"] == 4


def test_fit_recovers_a_known_exponent_with_separate_intercepts():
    """Two E groups with different constants but the same power 1.5: the pooled fit finds 1.5."""
    rows = [dict(backend="b", op="forward", metric="time", T=t, E=e, dtype="float32", batch=1, heads=8,
                 machine="m", commit="c", value=c * t ** 1.5)
            for e, c in ((16, 1e-6), (128, 9e-6)) for t in (64, 128, 256, 512)]
    fit = fit_scaling(pd.DataFrame(rows), "time", t_min=128)
    assert fit.loc[0, "exponent"] == pytest.approx(1.5) and fit.loc[0, "r2"] == pytest.approx(1.0)
    assert fit.loc[0, "n"] == 6 and fit.loc[0, "t_lo"] == 128


def test_fit_with_one_T_has_no_slope(df):
    fit = fit_scaling(df[df["machine"] == "testbox"], "time", t_min=1024)
    assert fit["exponent"].isna().all() and (fit["n"] > 0).all()


@pytest.mark.parametrize("kwargs, message", [
    (dict(metric="speed"), "metric 'speed'"),
    (dict(metric="time", t_min=0), "t_min must be a positive number"),
])
def test_fit_bad_input(df, kwargs, message):
    with pytest.raises(ValueError, match=message):
        fit_scaling(df, **kwargs)


def test_load_bad_input(tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        load_results(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="no machine folder"):
        load_results(str(tmp_path))
    (tmp_path / "box").mkdir()
    (tmp_path / "box" / "machine.json").write_text("{}")
    (tmp_path / "box" / "abc.json").write_text('{"version": 1}')
    with pytest.raises(ValueError, match="format version 2"):
        load_results(str(tmp_path))


@pytest.mark.slow
def test_import_reports_loads_no_pandas():
    code = "import sys, attnspec.reports, attnspec.reports.asv_results; assert 'pandas' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ELSEWHERE)


# -- the benchmarks' own helpers ---------------------------------------------------------------

def test_grid_env_vars_reject_bad_values(monkeypatch):
    from attnspec.benchmarks import _grid

    monkeypatch.setenv("ATTNSPEC_BENCH_T", "4,abc")
    with pytest.raises(ValueError, match="ATTNSPEC_BENCH_T='4,abc': expected comma-separated integers"):
        _grid._ints("ATTNSPEC_BENCH_T", [4])
    monkeypatch.setenv("ATTNSPEC_BENCH_T", "0,8")
    with pytest.raises(ValueError, match="positive integers"):
        _grid._ints("ATTNSPEC_BENCH_T", [4])
    monkeypatch.setenv("ATTNSPEC_BENCH_T", "8, 16")
    assert _grid._ints("ATTNSPEC_BENCH_T", [4]) == [8, 16]
    monkeypatch.setenv("ATTNSPEC_BENCH_OPS", "forward,backward")
    with pytest.raises(ValueError, match="ATTNSPEC_BENCH_OPS='forward,backward': expected comma-separated values "
                                         "from forward, forward_backward"):
        _grid._words("ATTNSPEC_BENCH_OPS", ["forward"], _grid.OP_NAMES)


def test_backend_names_follow_the_plugin_env_var(monkeypatch):
    from attnspec.benchmarks import _common

    monkeypatch.setenv("ATTNSPEC_BACKENDS", "numpy-naive, my.pkg:attn")
    assert _common.backend_names() == ["numpy-naive", "my.pkg:attn"]
    monkeypatch.delenv("ATTNSPEC_BACKENDS")
    default = _common.backend_names()
    assert "numpy-naive" in default and "numpy-tiled" in default  # NumPy is always installed
    for name in default:  # only built-ins, and no GPU backend on a machine without a GPU device
        assert name in registry.builtin_names()
        if not (os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")):
            assert registry.resolve(name).capabilities.device == "cpu", name


@pytest.mark.slow
def test_default_backends_are_chosen_without_importing_a_framework():
    code = ("import sys; from attnspec.benchmarks import _common; names = _common.backend_names(); "
            "assert 'torch' not in sys.modules and 'jax' not in sys.modules, names; print(names)")
    env = {k: v for k, v in os.environ.items() if k != "ATTNSPEC_BACKENDS"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ELSEWHERE, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def plain_attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """A plug-in function: the registry wraps it as a forward-only backend."""
    raise AssertionError("a declined combination must not be called")


@pytest.mark.slow
def test_thread_pools_are_limited_through_threadpoolctl():
    """OPENBLAS_NUM_THREADS is read only when OpenBLAS loads: the count is set in the library."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    code = ("import numpy, threadpoolctl; from attnspec.benchmarks import _threads; counts = _threads.limit(); "
            "print(counts); assert counts.get('blas') == 1, counts; "
            "assert all(p['num_threads'] == 1 for p in threadpoolctl.threadpool_info()), threadpoolctl.threadpool_info()")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="2", OMP_NUM_THREADS="2")  # NumPy loads with 2 first
    env.pop("ATTNSPEC_THREADS", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=ELSEWHERE, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert threadpoolctl.__version__


def test_declined_combination_is_an_asv_skip():
    """A backend without gradients: NotImplementedError (asv's skip), before loading anything."""
    from attnspec.benchmarks import _common

    with pytest.raises(NotImplementedError, match="computes no gradients"):
        _common.prepared(f"{__name__}:plain_attention", _common.Workload(1, 8, 8, 4, 4, 16), "forward_backward",
                         "float32")


@pytest.mark.parametrize("method", ["traced_peak", "rss_peak"])
def test_memory_methods_see_one_known_allocation(method):
    np = pytest.importorskip("numpy")
    from attnspec.benchmarks import _memory

    n_bytes = 64 * 2 ** 20
    measured = getattr(_memory, method)(lambda: np.ones(n_bytes // 8))  # touches every page
    # tracemalloc is byte-exact; RSS adds the interpreter's own page churn (a few hundred KiB)
    assert n_bytes <= measured <= n_bytes * 1.05


# -- asv itself: two commits, then asv compare ---------------------------------------------------

SLOW_PLUGIN = '''import numpy as np
def attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])  # (..., Lq, Lk)
    w = np.exp(s - s.max(-1, keepdims=True))  # (..., Lq, Lk)
    return (w / w.sum(-1, keepdims=True)) @ v  # (..., Lq, Ev)
'''


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("git", path=ACTIVATED_PATH) is None or shutil.which("asv", path=ACTIVATED_PATH) is None,
                    reason="needs git and asv")
def test_asv_records_two_commits_and_compare_flags_the_regression(tmp_path, monkeypatch):
    """README's workflow on a throwaway repo: a plug-in backend gets 2 ms slower at the 2nd commit.

    The benchmarks measure the installed attnspec (they put no checkout on sys.path), so the
    plug-in module at the repository's top imports in asv's benchmark processes only through
    ASV_PYTHONPATH, which procs.child_env sets to the current folder as `attnspec run` does."""
    from attnspec import procs

    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(os.path.join(ROOT, "asv.conf.json"), repo / "asv.conf.json")
    shutil.copytree(os.path.join(ROOT, "benchmarks"), repo / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "slowplugin.py").write_text(SLOW_PLUGIN)
    for var in [v for v in os.environ if v.startswith(("ATTNSPEC_", "ASV_"))]:
        monkeypatch.delenv(var)
    monkeypatch.chdir(repo)
    env = procs.child_env(HOME=str(tmp_path), PATH=ACTIVATED_PATH, ATTNSPEC_BACKENDS="numpy-naive,slowplugin:attention",
                          ATTNSPEC_BENCH_T="4,8", ATTNSPEC_BENCH_E="16", ATTNSPEC_BENCH_OPS="forward",
                          GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    assert env["ASV_PYTHONPATH"].split(os.pathsep)[0] == str(repo)

    def sh(*cmd):
        done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=100)
        assert done.returncode == 0, f"{cmd}: {done.stdout}\n{done.stderr}"
        return done.stdout

    def commit_and_run(message):
        sh("git", "add", "-A")
        sh("git", "commit", "-qm", message)
        commit = sh("git", "rev-parse", "HEAD").strip()
        sh("asv", "run", "--machine", "box", "--environment", "existing:python", "--set-commit-hash", commit,
           "--bench", "TimeAttention")
        return commit

    sh("git", "init", "-q")
    sh("asv", "machine", "--yes", "--machine", "box")  # HOME is tmp_path: ~/.asv-machine.json stays put
    before = commit_and_run("fast")
    # 2 ms of CPU time more per call (the benchmarks' clock is CPU time: a sleep would not count)
    burn = "    import time; until = time.process_time() + 0.002\n    while time.process_time() < until: pass\n"
    slower = SLOW_PLUGIN.replace("    s = q @", burn + "    s = q @")
    (repo / "slowplugin.py").write_text(slower)
    after = commit_and_run("slow")
    out = sh("asv", "compare", before, after, "--machine", "box", "--factor", "1.1", "--only-changed")
    flagged = [line for line in out.splitlines() if line.startswith("| +") and "'slowplugin:attention'" in line]
    assert len(flagged) == 2, out  # T=4 and T=8; numpy-naive may move with the machine's load
    df = load_results(str(repo / ".asv" / "results"))
    assert set(df["commit"]) == {before, after} and set(df["machine"]) == {"box"}
    plugin_time = df[(df["backend"] == "slowplugin:attention") & (df["metric"] == "time")]
    assert len(plugin_time) == 4  # T = 4 and 8 at both commits: the plug-in imported in asv's processes
