"""The register of findings (docs/findings.md): every reproducer runs standalone and shows its finding.

Each script in docs/findings/ imports only its library and NumPy; it exits 0 when the finding
reproduces, 1 when it does not any more (the library changed: the register must be updated), 77
when its library or device is missing here (a skip, with the script's reason), 2 when it crashed.
Only 0 passes; a finding that depends on the CPU's kernels and does not reproduce on this CPU is
a skip that says so, never a pass.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINDINGS = os.path.join(ROOT, "docs", "findings")
REGISTER = os.path.join(ROOT, "docs", "findings.md")
SCRIPTS = sorted(f for f in os.listdir(FINDINGS) if f.endswith(".py") and not f.startswith("_"))
# where a finding depends on the machine (the CPU's kernels): "not reproduced" may mean this CPU
# takes another path, so it is a skip naming that, not a failure (and never a pass)
MACHINE_DEPENDENT = {"torch_bmm_bf16_nan.py": "it depends on the CPU's bfloat16 kernels (oneDNN, AMX/AVX-512)",
                     "openvino_bf16_sink_nan_leak.py": "it depends on the CPU plugin's bfloat16 kernels (measured on "
                                                       "an Intel Xeon with AMX)"}


def test_the_register_lists_every_reproducer_and_nothing_else():
    text = Path(REGISTER).read_text(encoding="utf-8")
    linked = set(re.findall(r"\(findings/(\w+\.py)\)", text))
    assert linked == set(SCRIPTS), (sorted(linked - set(SCRIPTS)), sorted(set(SCRIPTS) - linked))


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_reproducer_uses_its_library_and_numpy_only(script):
    source = Path(os.path.join(FINDINGS, script)).read_text(encoding="utf-8")
    assert "attnspec" not in source.replace("docs/findings.md", "")


def _run(script, cwd=FINDINGS):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERAS_BACKEND", "PYTHONPATH"))}
    done = subprocess.run([sys.executable, script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return done, (done.stdout.strip().splitlines() or [done.stderr.strip()[-400:]])[-1]


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_the_finding_reproduces(script):
    done, said = _run(script)
    if done.returncode == 77:
        pytest.skip(said)
    if script in MACHINE_DEPENDENT and done.returncode == 1 and said.startswith("NOT REPRODUCED"):
        pytest.skip(f"{script} does not reproduce on this CPU ({MACHINE_DEPENDENT[script]}): {said}")
    assert done.returncode == 0, f"{script}: {said}\n{done.stderr[-2000:]}"
    assert said.startswith("REPRODUCED: ")


@pytest.mark.parametrize("body, status, says", [
    ("need('attnspec_no_such_library')", 77, "SKIPPED: attnspec_no_such_library is not installed"),
    ("need('broken_library')", 2, "No module named 'attnspec_no_such_dependency'"),
    ("raise RuntimeError('the script itself failed')", 2, "RuntimeError: the script itself failed"),
    ("verdict(False, 'gone')", 1, "NOT REPRODUCED"),
])
def test_only_the_library_missing_is_a_skip_and_a_crash_is_no_verdict(tmp_path, body, status, says):
    # a library that is installed but fails to import (here: a dependency missing) must not read as
    # "missing here" (77), and a crash must not read as "no longer reproduces" (1)
    (tmp_path / "_common.py").write_text(Path(os.path.join(FINDINGS, "_common.py")).read_text(encoding="utf-8"))
    (tmp_path / "broken_library.py").write_text("import attnspec_no_such_dependency\n")
    (tmp_path / "case.py").write_text(f"from _common import need, verdict\n{body}\n")
    done, _ = _run("case.py", cwd=tmp_path)
    assert done.returncode == status, (done.stdout, done.stderr[-2000:])
    assert says in done.stdout + done.stderr
