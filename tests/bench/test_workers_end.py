"""A benchmark's worker processes end when the benchmark is killed (``die_with_parent``)."""

import subprocess
import sys
import textwrap
import time

import psutil
import pytest

PARENT = textwrap.dedent("""
    import os, signal, sys, time
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing
    from cascade.bench.machine import die_with_parent

    def work(path):
        open(path, "w").write(str(os.getpid()))
        time.sleep(120)

    if __name__ == "__main__":
        context = multiprocessing.get_context("spawn")
        initializer = die_with_parent if sys.argv[2] == "on" else None
        pool = ProcessPoolExecutor(1, mp_context=context, initializer=initializer)
        pool.submit(work, sys.argv[1])
        while not os.path.exists(sys.argv[1]) or not open(sys.argv[1]).read():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup of any kind
""")


def _worker_after_parent_killed(tmp_path, mode: str) -> psutil.Process:
    script, pid_file = tmp_path / "parent.py", tmp_path / f"worker-{mode}.pid"
    script.write_text(PARENT)
    parent = subprocess.run([sys.executable, str(script), str(pid_file), mode], timeout=120)
    assert parent.returncode == -9
    return psutil.Process(int(pid_file.read_text()))


def _ended(worker: psutil.Process, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if worker.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_benchmark_leaves_no_busy_worker(tmp_path):
    worker = _worker_after_parent_killed(tmp_path, "on")
    assert _ended(worker, 10)
    control = _worker_after_parent_killed(tmp_path, "off")  # without it the worker lives on
    try:
        assert not _ended(control, 2)
    finally:
        control.kill()
