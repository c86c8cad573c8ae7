"""The examples and the main job run, as smoke tests (each in a fresh interpreter)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(script):
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"quickstart.py", "njit_gemv.py"}


def test_main_job():
    r = subprocess.run([sys.executable, "-m", "numba_qk", "--rows", "64", "--check-rows", "8"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "all checks bit-exact: OK" in r.stdout
    assert "16/16 records bit-identical" in r.stdout


def test_main_job_rejects_bad_arguments():
    r = subprocess.run([sys.executable, "-m", "numba_qk", "--rows", "0"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 2 and "--rows" in r.stderr
