"""ruff's pyflakes checks (undefined names, unused imports, shadowed imports) over the code, and
mypy over the packages typed so far (``[tool.mypy]`` in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    paths = ["cascade", "gateway", "drafter_service", "verifier_service", "tests", "scripts"]
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *paths],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_mypy_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", "/dev/null"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
