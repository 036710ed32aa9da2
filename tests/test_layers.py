"""The layering rules: which packages may import which (pyproject's import-linter contracts,
checked on the source), and what the gateway and the core really load in a fresh interpreter."""

import pkgutil
import subprocess
import sys
from pathlib import Path

from importlinter.cli import EXIT_STATUS_SUCCESS

import cascade.core

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_hold():
    """Run in its own interpreter: import-linter changes the logging setup of the process."""
    check = ("import sys; from importlinter.cli import lint_imports; "
             "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, "
             "no_logo=True))")
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                            cwd=ROOT)
    assert result.returncode == EXIT_STATUS_SUCCESS, (
        f"an import breaks a layering contract:\n{result.stdout}{result.stderr}")


def _loaded_after(imports: list[str]) -> set[str]:
    statements = "; ".join(f"import {name}" for name in imports)
    check = f"import sys; {statements}; print(' '.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def test_the_gateway_process_loads_no_torch_and_no_model_code():
    loaded = _loaded_after(["gateway.__main__"])
    assert "gateway.server" in loaded  # the entry point really pulled the gateway in
    assert "torch" not in loaded
    assert not any(name.startswith("transformers.models.") for name in loaded)


def test_the_core_loads_no_grpc():
    modules = [m.name for m in pkgutil.walk_packages(cascade.core.__path__, "cascade.core.")]
    assert "cascade.core.verify.verification" in modules and "cascade.core.proposers.model" in modules
    loaded = _loaded_after(modules)
    assert "grpc" not in loaded and "cascade.v1" not in loaded


def test_every_module_imports():
    """A module no test loads (a benchmark, an entry point) still imports: a name moved out
    from under it fails here, not in a user's hands."""
    packages = ["cascade", "gateway", "drafter_service", "verifier_service"]
    check = ("import importlib, pkgutil\n"
             f"for name in {packages!r}:\n"
             "    package = importlib.import_module(name)\n"
             "    for m in pkgutil.walk_packages(package.__path__, name + '.'):\n"
             "        importlib.import_module(m.name)\n")
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr
