"""The Triton example (docs/examples/triton_attention.py), checked by the suite under Triton's interpreter.

TRITON_INTERPRET=1 runs the kernels on the CPU with NumPy, so the example is checked wherever
triton is installed (the [triton] extra); on CUDA tools/gpu_check.sh runs the suite on it compiled.
The interpreter's tl.dot multiplies bfloat16 bit patterns (Triton 3.9), so interpreted the
example declares float16 and float32 only.  One subprocess, 2 problems a property, every
property but edge_shapes_match_reference: its fixed grid of 73 problems (head dims to 512) is most
of the interpreted run's time (~400 s of ~490 s on a loaded 2-core machine); CUDA runs it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed: the Triton example's adapter needs it")
pytest.importorskip("triton", reason="triton is not installed (pip install 'attnspec[triton]'): the example "
                                     "kernel docs/examples/triton_attention.py is not checked")

ROOT = Path(__file__).resolve().parents[1]
SPEC = "docs.examples.triton_attention:TritonAttention"
CHECKED = ("float16", "float32")  # bfloat16: not on the interpreter (its tl.dot), checked on CUDA only


def test_interpreted_the_example_declares_no_bfloat16(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from docs.examples.triton_attention import TritonAttention
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    backend = TritonAttention()
    assert backend.capabilities.dtypes == CHECKED and backend.capabilities.device == "cpu"
    assert any("bfloat16" in note for note in backend.semantics.notes)
    assert backend.env_vars == ("TRITON_INTERPRET",)  # a reproducer of an interpreted run sets it again
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "bfloat16" in TritonAttention().capabilities.dtypes  # compiled for CUDA: every 16-bit dtype


@pytest.mark.slow
def test_the_suite_accepts_the_triton_example_interpreted(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "ATTNSPEC_"))}
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update(TRITON_INTERPRET="1", ATTNSPEC_PROFILE="ci", ATTNSPEC_SEED="29",
               PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH")))))
    out = tmp_path / "triton.json"
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "attnspec.properties", "-q", "-p", "no:cacheprovider",
           "--backend", SPEC, "--attnspec-examples", "2", "--attnspec-no-shrink", "-k", "not edge_shapes",
           "--attnspec-json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())["conformance"]
    bad = [(r["property"], r["dtype"], r["status"], (r.get("message") or "")[:300]) for r in rows
           if r["status"] in ("failed", "error")]
    assert not bad and done.returncode == 0, (bad, done.stdout[-3000:])
    for dtype in CHECKED:  # the forward and the backward were both checked, in each dtype
        passed = {r["property"] for r in rows if r["dtype"] == dtype and r["status"] == "passed"}
        assert {"matches_reference", "gradients_match_reference"} <= passed, (dtype, sorted(passed))
    assert not [r for r in rows if r["dtype"] == "bfloat16"]
