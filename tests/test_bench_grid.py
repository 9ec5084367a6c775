"""The benchmark grids (benchmarks/_grid.py), workloads, skips and thread pinning.

The grid module reads its environment variables when imported, as asv's processes do, so
each grid is checked in a fresh interpreter - started outside the checkout: the installed
attnspec (attnspec.benchmarks) is what is measured.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ELSEWHERE = tempfile.gettempdir()  # a folder outside the checkout: only the installed attnspec imports

GRID_DUMP = ("import json; from attnspec.benchmarks import _grid as g; "
             "from attnspec.benchmarks import bench_attention, bench_decode, "
             "bench_masks, bench_memory; "
             "left = lambda kind, **k: g.left_out(kind, **k) is not None; "
             "print(json.dumps(dict(T=g.T_VALUES, E=g.E_VALUES, ops=g.OPS, dtypes=g.DTYPES, half=g.HALF_DTYPES, "
             "half_T=g.HALF_T, half_ops=g.HALF_OPS, memory_T=g.MEMORY_T, memory_ops=g.MEMORY_OPS, lk=g.DECODE_LK, "
             "lq=g.DECODE_LQ, decode_dtypes=g.DECODE_DTYPES, hkv=g.GROUPED_HKV, grouped_lk=g.GROUPED_LK, "
             "grouped_lq=g.GROUPED_LQ, masks=g.MASKS, mask_T=g.MASK_T, "
             "half_params=bench_attention.TimeHalfPrecision.params[3:], "
             "grouped_params=bench_decode.TimeGroupedDecode.params[3:], "
             "left_decode_bf16_lq4=left('decode', Lq=4, dtype='bfloat16'), "
             "left_decode_bf16=left('decode', Lq=1, dtype='bfloat16'), "
             "left_window_256=[t for t in g.MASK_T if left('masked', T=t, mask='window-256')], "
             "left_causal=[t for t in g.MASK_T if left('masked', T=t, mask='causal')], "
             "mask_params=bench_masks.TimeMasked.params[5:8], budget=g.BACKEND_BUDGET_SECONDS)))")


def grid(**env) -> dict:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSPEC_BENCH")}
    full_env.update(ATTNSPEC_BACKENDS="numpy-naive", **env)
    done = subprocess.run([sys.executable, "-c", GRID_DUMP], cwd=ELSEWHERE, env=full_env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_default_grid_is_the_missions_range_with_16_bit_corners():
    g = grid()
    assert g["T"] == [4, 64, 256, 1024, 2048] and g["E"] == [64]  # T = 4 .. 2048, the fit range at 3 sizes
    assert g["dtypes"] == ["float32"] and g["ops"] == ["forward", "forward_backward"]
    # 16-bit: forward at T = 4, 256, 2048, its own class (no left-out corners in the product)
    assert g["half"] == ["bfloat16", "float16"] and g["half_T"] == [4, 256, 2048] and g["half_ops"] == ["forward"]
    assert g["memory_T"] == [256, 1024, 2048] and g["memory_ops"] == ["forward"]
    assert g["lq"] == [1, 4] and g["lk"] == [256, 2048] and g["decode_dtypes"] == ["float32", "bfloat16", "float16"]
    assert g["left_decode_bf16_lq4"] and not g["left_decode_bf16"]  # 16-bit decode: one token
    # grouped heads: one token against the largest cache (what the report's table compares)
    assert g["grouped_params"] == [[2, 1], [1], [2048], [64], ["float32"], ["process"]]
    assert g["masks"] == ["causal", "window-256"] and g["mask_T"] == [256, 1024, 2048]
    assert g["mask_params"] == [["causal", "window-256"], ["forward"], ["float32"]]
    # a 256-key window at T = 256 hides what causal hides: the same problem, timed once (as causal)
    assert g["left_window_256"] == [256] and g["left_causal"] == []


@pytest.mark.slow
def test_the_budget_can_be_set_or_switched_off():
    assert grid()["budget"] == 60.0 and grid(ATTNSPEC_BENCH_GRID="full")["budget"] is None
    assert grid(ATTNSPEC_BENCH_BUDGET="90")["budget"] == 90.0 and grid(ATTNSPEC_BENCH_BUDGET="0")["budget"] is None
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSPEC_BENCH")}
    done = subprocess.run([sys.executable, "-c", GRID_DUMP], cwd=ELSEWHERE, capture_output=True, text=True,
                          env={**env, "ATTNSPEC_BENCH_BUDGET": "-5"})
    assert done.returncode != 0 and "ATTNSPEC_BENCH_BUDGET='-5': expected seconds per backend" in done.stderr


@pytest.mark.slow
def test_full_grid_leaves_nothing_out():
    g = grid(ATTNSPEC_BENCH_GRID="full")
    assert g["T"] == [2 ** i for i in range(2, 12)] and g["E"] == [16, 64, 128] and g["half_T"] == g["T"]
    assert max(g["lk"]) >= 8192 and g["memory_ops"] == ["forward", "forward_backward"] and g["hkv"] == [4, 2, 1]
    assert g["grouped_lk"] == g["lk"] and g["grouped_lq"] == [1, 4]
    assert g["left_window_256"] == [] and not g["left_decode_bf16_lq4"]
    assert not g["left_decode_bf16_lq4"]
    assert g["mask_params"][2] == ["float32", "bfloat16", "float16"]


@pytest.mark.slow
def test_an_axis_given_explicitly_is_measured_in_full():
    g = grid(ATTNSPEC_BENCH_HALF="bfloat16", ATTNSPEC_BENCH_T="8,32", ATTNSPEC_BENCH_LK="64,128")
    assert g["half"] == ["bfloat16"] and g["T"] == [8, 32] and g["memory_T"] == [8, 32] and g["half_T"] == [8, 32]
    assert g["grouped_lk"] == [64, 128]


@pytest.mark.slow
@pytest.mark.parametrize("env, message", [
    (dict(ATTNSPEC_BENCH_GRID="huge"), "ATTNSPEC_BENCH_GRID='huge': expected one of quick, default, full"),
    (dict(ATTNSPEC_BENCH_MASKS="causal,window"), "ATTNSPEC_BENCH_MASKS='causal,window': expected causal or window-N"),
    (dict(ATTNSPEC_BENCH_DTYPES="float8"), "ATTNSPEC_BENCH_DTYPES='float8': expected comma-separated values from"),
    (dict(ATTNSPEC_BENCH_HALF="float32"), "ATTNSPEC_BENCH_HALF='float32': expected comma-separated values from"),
    (dict(ATTNSPEC_BENCH_LK="0"), "ATTNSPEC_BENCH_LK='0': expected positive integers"),
])
def test_bad_grid_settings_are_named(env, message):
    full_env = dict(os.environ, **env)
    done = subprocess.run([sys.executable, "-c", "import attnspec.benchmarks._grid"], cwd=ELSEWHERE, env=full_env,
                          capture_output=True, text=True)
    assert done.returncode != 0 and message in done.stderr, done.stderr


# -- workloads and skips (in this process: the default grid) --------------------------------------

def test_workload_fields_are_the_problem_asked_for():
    from attnspec.benchmarks._common import Workload

    assert Workload(1, 8, 2, 1, 2048, 64, "decode").fields() == {"enable_gqa": True}
    speculative = Workload(1, 8, 8, 4, 2048, 64, "decode")
    assert speculative.is_causal and speculative.fields() == {"causal_alignment": "bottom_right"}
    window = Workload(1, 8, 8, 512, 512, 64, "window-256")
    assert window.fields() == {"window": (255, 0)} and not window.is_causal
    assert Workload(1, 8, 8, 512, 512, 64, "causal").is_causal


def test_undeclared_features_are_skips_before_any_framework_loads():
    """A plain function declares no grouped heads and no window: asv's skip, with the reason."""
    from attnspec.benchmarks import _common

    name = f"{__name__}:plain_attention"
    with pytest.raises(NotImplementedError, match="does not declare 'gqa'"):
        _common.prepared(name, _common.Workload(1, 8, 1, 1, 64, 16, "decode"), "forward", "float32")
    with pytest.raises(NotImplementedError, match="does not declare 'window'"):
        _common.prepared(name, _common.Workload(1, 8, 8, 64, 64, 16, "window-16"), "forward", "float32")
    with pytest.raises(NotImplementedError, match="does not declare 'causal_bottom_right'"):
        _common.prepared(name, _common.Workload(1, 8, 8, 4, 64, 16, "decode"), "forward", "float32")


def plain_attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    raise AssertionError("a declined combination must not be called")


def test_declared_features_run_and_time_the_problem():
    """numpy-naive declares everything: a grouped, speculative decode step is prepared and runs."""
    from attnspec.benchmarks import _common

    p = _common.prepared("numpy-naive", _common.Workload(1, 8, 2, 4, 64, 16, "decode"), "forward", "float32")
    out = p.run()
    assert out.shape == (1, 8, 4, 16) and p.call_seconds > 0


def test_a_call_predicted_too_slow_for_the_grid_is_skipped_with_the_prediction(monkeypatch):
    from attnspec.benchmarks import _common

    monkeypatch.setattr(_common, "MAX_CALL_SECONDS", 1e-9)
    with pytest.raises(NotImplementedError, match=r"predicted .* s per call from T=256 \(x\(T/256\)\^2\)"):
        _common.prepared("numpy-naive", _common.Workload(1, 8, 8, 512, 512, 16), "forward", "float16")


def test_calls_over_the_budget_leave_the_backend_out_of_the_rest_of_the_run(monkeypatch, tmp_path):
    """The combination that used the budget up is kept; the run's later ones skip, saying why."""
    from attnspec.benchmarks import _common

    monkeypatch.setattr(_common, "BACKEND_BUDGET_SECONDS", 1e-9)
    monkeypatch.setenv("ASV_ENV_TYPE", "existing")  # the account is kept inside asv runs only
    monkeypatch.setattr(_common, "_run_folder", lambda: str(tmp_path))
    monkeypatch.setattr(_common, "_CACHE", {})  # as in a fresh asv process
    kept = _common.prepared("numpy-tiled", _common.Workload(1, 2, 2, 8, 8, 16), "forward", "float32")
    assert kept.run().shape == (1, 2, 8, 16) and _common._spent("numpy-tiled") > 0
    with pytest.raises(NotImplementedError, match=r"its calls took .* left out of the rest of this run"):
        _common.prepared("numpy-tiled", _common.Workload(1, 2, 2, 16, 16, 16), "forward", "float32")
    assert _common._over_budget("numpy-naive") is None  # each backend has its own account
    _common.spend("numpy-naive", 1.5)
    _common.spend("numpy-naive", 2.0)
    assert _common._spent("numpy-naive") == 3.5  # the account adds up over the run's processes


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="a live asv server is told from an ended one on Linux")
def test_a_runs_first_account_removes_the_folders_of_ended_runs_only(monkeypatch, tmp_path):
    """Each asv run's account is a folder in the temporary folder, named by its server's pid and
    start time; nothing removed them (three a default `attnspec run`, one an `asv run`)."""
    from attnspec.benchmarks import _common

    monkeypatch.setenv("ASV_ENV_TYPE", "existing")  # the account is kept inside asv runs only
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    me, started = os.getpid(), _common._started(os.getpid())
    folders = {"ended": f"{ended.stdout.strip()}-1", "pid reused": f"{me}-{int(started) + 1}", "live": f"{me}-{started}"}
    for name in folders.values():
        (tmp_path / (_common.RUN_FOLDER_PREFIX + name)).mkdir()
    (tmp_path / "someone-elses").mkdir()
    _common.spend("numpy-naive", 1.0)  # this process's parent is the run's server here
    assert (tmp_path / (_common.RUN_FOLDER_PREFIX + folders["live"])).is_dir()
    assert not (tmp_path / (_common.RUN_FOLDER_PREFIX + folders["ended"])).exists()
    assert not (tmp_path / (_common.RUN_FOLDER_PREFIX + folders["pid reused"])).exists()
    assert (tmp_path / "someone-elses").is_dir() and os.path.isdir(_common._run_folder())
    assert _common._spent("numpy-naive") == 1.0


@pytest.mark.parametrize("compiles", [True, False])
def test_a_slow_first_call_is_followed_by_a_warm_one_where_the_backend_compiles(monkeypatch, compiles):
    """A compile of seconds is not the call's time (it sized asv's samples and was charged three
    times for torch.compile'd flex's 0.2 ms calls); a slow call of a backend that does not
    compile is not made twice (NumPy at T = 2048)."""
    from attnspec.benchmarks import _common

    monkeypatch.setattr(_common, "_CACHE", {})
    times = iter([2.5, 2e-4])
    monkeypatch.setattr(_common, "_first_call", lambda run: next(times))
    monkeypatch.setattr(_common.get_backend("numpy-tiled"), "compiles_per_shape", compiles, raising=False)
    p = _common.prepared("numpy-tiled", _common.Workload(1, 2, 2, 8, 8, 16), "forward", "float32")
    assert p.call_seconds == (2e-4 if compiles else 2.5)


def test_the_budget_is_kept_in_asvs_fork_server_which_passes_no_asv_variable(monkeypatch):
    """asv 0.6 runs an existing environment's benchmarks in processes forked from its server,
    without ASV_ENV_TYPE: the command line tells (the budget never applied in `attnspec run`)."""
    from attnspec.benchmarks import _common

    monkeypatch.delenv("ASV_ENV_TYPE", raising=False)
    monkeypatch.setattr(sys, "argv", ["/site-packages/asv/benchmark.py", "run_server", "/repo/benchmarks", "/tmp/x"])
    assert _common._under_asv()
    monkeypatch.setattr(sys, "argv", ["/usr/bin/pytest", "tests"])
    assert not _common._under_asv()  # a test or script keeps no account


# -- threads ----------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jax") is None or not hasattr(os, "sched_setaffinity"),
                    reason="needs jax and Linux CPU affinity")
def test_the_xla_pin_binds_one_thread():
    """What the benchmarks do before JAX's client exists: one thread does a jitted matmul's work."""
    code = ("import jax, jax.numpy as jnp; from attnspec.benchmarks import _threads; _threads.pin_xla(); "
            "a = jnp.ones((1024, 1024)); f = jax.jit(lambda x: x @ x); f(a).block_until_ready(); "
            "print(_threads.busy_threads(lambda: f(a).block_until_ready(), 0.5))")
    env = dict(os.environ, ATTNSPEC_THREADS="1")
    done = subprocess.run([sys.executable, "-c", code], cwd=ELSEWHERE, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) == 1
    unpinned = subprocess.run([sys.executable, "-c", code.replace("_threads.pin_xla(); ", "")], cwd=ELSEWHERE, env=env,
                              capture_output=True, text=True, timeout=120)
    if len(os.sched_getaffinity(0)) > 1:  # the measurement can tell: without the pin XLA uses every core
        assert int(unpinned.stdout.split()[-1]) > 1, unpinned.stderr


@pytest.mark.slow
def test_frameworks_are_preloaded_only_in_asvs_fork_server():
    """Importing the benchmarks package loads no framework, except as asv's `run_server`."""
    code = ("import sys; sys.argv = ['benchmark.py'] + sys.argv[1:]; import attnspec.benchmarks; "
            "print(sorted(m for m in ('torch', 'jax') if m in sys.modules))")
    env = dict(os.environ, ATTNSPEC_BACKENDS="numpy-naive,torch-math,jax-naive")
    plain = subprocess.run([sys.executable, "-c", code, "discover"], cwd=ELSEWHERE, env=env, capture_output=True,
                           text=True)
    assert plain.returncode == 0 and plain.stdout.strip() == "[]", plain.stderr
    server = subprocess.run([sys.executable, "-c", code, "run_server"], cwd=ELSEWHERE, env=env, capture_output=True,
                            text=True)
    installed = [m for m in ("jax", "torch") if importlib.util.find_spec(m) is not None]
    assert server.returncode == 0 and json.loads(server.stdout.strip().replace("'", '"')) == installed, server.stderr
    from attnspec.benchmarks import _threads

    assert _threads.frameworks_of(["numpy-naive", "torch-math", "jax-naive", "torch-sdpa-cpu"]) == ["torch", "jax"]
    assert _threads.frameworks_of(["my.pkg:attn"]) == installed[::-1]  # never the plug-in's own module


LAZY_PACKAGES = ("transformers", "flax", "keras", "IPython", "treescope")  # large trees a load() reaches into


@pytest.mark.slow
@pytest.mark.parametrize("name", ["transformers-sdpa", "transformers-gpt-oss", "flax-linen", "flax-nnx",
                                  "keras-numpy", "keras-jax", "keras-torch"])
def test_a_forked_combination_imports_nothing_the_fork_server_could_have(name, tmp_path):
    """After the fork server's preload, a combination's setup (load, prepare, first and warm call)
    imports no module of the zoo's packages: every forked combination would import it again
    (transformers' model files took ~1 s a combination before PRELOAD_EXTRA named them)."""
    from attnspec.benchmarks import _threads

    missing = [f for f in _threads.frameworks_of([name]) if importlib.util.find_spec(f) is None]
    if missing:
        pytest.skip(f"{name}: {', '.join(missing)} not installed")
    code = ("import os, sys; os.environ.setdefault('KERAS_BACKEND', 'numpy'); "
            "from attnspec.benchmarks import _common, _threads; "
            f"_threads.preload([{name!r}]); before = set(sys.modules); "
            f"_common.prepared({name!r}, _common.Workload(1, 8, 8, 16, 16, 64, 'none'), 'forward', 'float32'); "
            f"print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in {LAZY_PACKAGES!r}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ELSEWHERE, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path)))  # JAX's cache
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", f"imported in the forked combination: {done.stdout}"


@pytest.mark.slow
def test_the_benchmarks_measure_the_installed_attnspec_and_leave_sys_path_alone():
    """No checkout is put on sys.path (in an "existing" asv environment either): what asv measures
    is the attnspec the interpreter has installed."""
    code = ("import sys; before = list(sys.path); import attnspec.benchmarks._common as c, attnspec; "
            "print(sys.path == before, attnspec.__file__)")
    env = dict(os.environ, ASV_ENV_TYPE="existing", ATTNSPEC_BACKENDS="numpy-naive")
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=ELSEWHERE, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    unchanged, where = done.stdout.split()
    assert unchanged == "True"
    import attnspec

    assert where == attnspec.__file__  # the installed package (here: this checkout, installed editable)


def test_a_runtime_no_backend_loads_is_a_skip_in_setup(monkeypatch):
    """Threads.setup raises NotImplementedError (asv's skip) for a runtime threadpoolctl does not see;
    raised in track_threads it would be an asv failure."""
    from attnspec.benchmarks import _threads, bench_machine

    monkeypatch.setattr(_threads, "limit", lambda: {"blas": 1})
    bench = bench_machine.Threads()
    bench.setup("blas")
    assert bench.track_threads("blas") == 1
    with pytest.raises(NotImplementedError, match=r"no openmp runtime loaded \(threadpoolctl sees \['blas'\]\)"):
        bench.setup("openmp")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("asv") is None or shutil.which("git") is None, reason="needs asv and git")
def test_asv_skips_the_openmp_count_of_numpy_alone(tmp_path, monkeypatch):
    """ATTNSPEC_BACKENDS=numpy-naive loads no OpenMP runtime: asv records its thread count as
    skipped (n/a, NaN in the results file), not failed (null); the run exits 0."""
    from attnspec import asvtool, procs

    for var in [v for v in os.environ if v.startswith(("ATTNSPEC_", "ASV_"))]:
        monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # asv's machine file: tmp_path/.asv-machine.json
    config, results_dir = asvtool.write_config(asvtool.grid_folder("default"))
    env = procs.child_env(ATTNSPEC_BACKENDS="numpy-naive")

    def asv(*args):
        done = subprocess.run(asvtool.command(*args, "--config", config), cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=240)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    asv("machine", "--yes", "--machine", "box")
    out = asv("run", "--machine", "box", "--environment", f"existing:{sys.executable}", "--set-commit-hash",
              procs.git_head(), "--bench", r"^bench_machine\.Threads\.")
    assert "failed" not in out.lower(), out
    (path,) = [p for p in os.listdir(os.path.join(results_dir, "box")) if p != "machine.json"]
    with open(os.path.join(results_dir, "box", path)) as f:
        result, params = json.load(f)["results"]["bench_machine.Threads.track_threads"][:2]
    counts = dict(zip((json.loads(p.replace("'", '"')) for p in params[0]), result, strict=True))
    assert counts["blas"] == 1  # NumPy's BLAS, pinned to one thread
    assert isinstance(counts["openmp"], float) and math.isnan(counts["openmp"]), counts  # skipped; None = failed
    assert results_dir.startswith(str(tmp_path))  # under the current folder, not attnspec's


# -- a plug-in's own asv suite (the asv run itself: tests/test_asv_workflow.py) ----------------------

def test_plugin_suite_writes_a_config_asv_reads(tmp_path):
    from attnspec.benchmarks import plugin_suite

    written = plugin_suite.write(str(tmp_path), "mykernel:attention", requirements=["torch==2.13.0"])
    conf = json.loads((tmp_path / "asv.conf.json").read_text())
    assert conf["benchmark_dir"] == "benchmarks" and conf["environment_type"] == "virtualenv"  # asv's default folder
    assert conf["matrix"] == {"req": {"pip+torch==2.13.0": [""]}} and conf["launch_method"] == "forkserver"
    # attnspec reaches asv's environment by its install command, after the plug-in's own wheel
    source, words = plugin_suite.route()
    assert conf["install_command"][1] == f"in-dir={{env_dir}} python -m pip install {source}"
    assert source.endswith("[bench]") and ("folder" in words or "package index" in words)
    module = (tmp_path / "benchmarks" / "bench_attnspec.py").read_text()
    assert "'mykernel:attention'" in module and "from attnspec.benchmarks.bench_decode import TimeDecode" in module
    assert len(written) == 3
    compile(module, "bench_attnspec.py", "exec")


@pytest.mark.parametrize("kwargs, message", [
    (dict(backend=""), "backend must be a backend name"),
    (dict(repo="/nonexistent/folder"), "repo '/nonexistent/folder' is not a folder"),
])
def test_plugin_suite_bad_input_is_named(tmp_path, kwargs, message):
    from attnspec.benchmarks import plugin_suite

    args = dict(repo=str(tmp_path), backend="mykernel:attention") | kwargs
    with pytest.raises(ValueError, match=message):
        plugin_suite.write(args["repo"], args["backend"])


def test_plugin_suite_never_overwrites_without_force(tmp_path, capsys):
    from attnspec.benchmarks import plugin_suite

    (tmp_path / "asv.conf.json").write_text("{}  // mine")
    assert plugin_suite.main(["mykernel:attention", "--repo", str(tmp_path)]) == 2
    assert "already exist(s): pass --force to replace" in capsys.readouterr().err
    assert (tmp_path / "asv.conf.json").read_text() == "{}  // mine"
    assert plugin_suite.main(["mykernel:attention", "--repo", str(tmp_path), "--force"]) == 0


def test_a_workload_needing_a_feature_the_backend_declares_broken_is_skipped_with_the_reason():
    """keras-numpy declares grouped heads (its docstring) and a deviation there (they raise): the
    grouped decode benchmark is skipped with the declared reason, not failed; ungrouped it runs."""
    from attnspec.backends.registry import resolve
    from attnspec.benchmarks import _common

    keras_numpy = resolve("keras-numpy")  # the adapter's class: no framework imported
    grouped, plain = _common.Workload(hq=8, hkv=2, lq=1, lk=256), _common.Workload(hq=8, hkv=8, lq=1, lk=256)
    why = _common._declines(keras_numpy, grouped, "forward", "float32")
    assert why and "declares a deviation with 'gqa'" in why and "operands could not be broadcast" in why
    assert _common._declines(keras_numpy, plain, "forward", "float32") is None
    assert _common._declines(resolve("numpy-naive"), grouped, "forward", "float32") is None
