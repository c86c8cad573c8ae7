"""The examples and the main job run, as smoke tests: the main job as ``python -m numba_qk`` in
a fresh interpreter, the examples as ``__main__`` scripts in this one (``runpy``: a fresh
interpreter per example cost ~2 s of CPU each in the default run, for nothing the main job's
run does not already show)."""

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(script, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [str(script)])
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        assert e.code in (None, 0), e.code
    assert capsys.readouterr().out.strip()


def test_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"quickstart.py", "njit_gemv.py"}


def test_main_job():
    r = subprocess.run([sys.executable, "-m", "numba_qk", "--rows", "64", "--check-rows", "8"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "all checks bit-exact: OK" in r.stdout
    assert "16/16 records bit-identical" in r.stdout


def test_main_job_rejects_bad_arguments(run_cli):
    code, _, err = run_cli("--rows", "0")
    assert code == 2 and "--rows" in err
