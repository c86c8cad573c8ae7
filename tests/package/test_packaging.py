"""The built wheel holds every subpackage and module of the source tree (package discovery)."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_contains_every_module(tmp_path):
    pytest.importorskip("setuptools")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {r.stderr.strip().splitlines()[-1:]}")
    wheel = next(tmp_path.glob("numba_qk-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "numba_qk").rglob("*.py")}
    assert sources, "no sources found"
    missing = sorted(sources - names)
    assert not missing, f"not in the wheel: {missing}"


def test_pyproject_uses_package_discovery():
    text = (ROOT / "pyproject.toml").read_text()
    assert "[tool.setuptools.packages.find]" in text and 'packages = [' not in text
