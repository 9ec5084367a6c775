"""The register of findings (docs/findings.md): every reproducer runs standalone and shows its finding.

Each script in docs/findings/ imports only its library and NumPy; it exits 0 when the finding
reproduces, 1 when it does not any more (the library changed: the register must be updated), 77
when its library or device is missing here (a skip, with the script's reason).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINDINGS = os.path.join(ROOT, "docs", "findings")
REGISTER = os.path.join(ROOT, "docs", "findings.md")
SCRIPTS = sorted(f for f in os.listdir(FINDINGS) if f.endswith(".py") and not f.startswith("_"))
# where a finding depends on the machine (the CPU's kernels): the script must run to a verdict,
# reproduced or not, and say which
MACHINE_DEPENDENT = {"torch_bmm_bf16_nan.py"}


def test_the_register_lists_every_reproducer_and_nothing_else():
    text = open(REGISTER, encoding="utf-8").read()
    linked = set(re.findall(r"\(findings/(\w+\.py)\)", text))
    assert linked == set(SCRIPTS), (sorted(linked - set(SCRIPTS)), sorted(set(SCRIPTS) - linked))


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_reproducer_uses_its_library_and_numpy_only(script):
    source = open(os.path.join(FINDINGS, script), encoding="utf-8").read()
    assert "attnspec" not in source.replace("docs/findings.md", "")


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_the_finding_reproduces(script):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERAS_BACKEND", "PYTHONPATH"))}
    done = subprocess.run([sys.executable, script], cwd=FINDINGS, env=env, capture_output=True, text=True, timeout=300)
    said = (done.stdout.strip().splitlines() or [done.stderr.strip()[-400:]])[-1]
    if done.returncode == 77:
        pytest.skip(said)
    if script in MACHINE_DEPENDENT:
        assert done.returncode in (0, 1) and said.startswith(("REPRODUCED", "NOT REPRODUCED")), done.stderr[-2000:]
        print(said)
        return
    assert done.returncode == 0, f"{script}: {said}\n{done.stderr[-2000:]}"
    assert said.startswith("REPRODUCED: ")
