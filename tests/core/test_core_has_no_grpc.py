import subprocess
import sys

CORE = ["acceptance", "acceptance_reference", "sampling", "runner", "drafting", "verification",
        "loop", "types", "wire"]


def test_core_modules_do_not_import_grpc():
    imports = "; ".join(f"import cascade.{name}" for name in CORE)
    check = f"import sys; {imports}; print('grpc' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
