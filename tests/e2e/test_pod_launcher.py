"""Pods forked from the warm fork server behave as processes started with ``python -m``."""

import os
import signal
import subprocess

import pytest

from cascade.tools.pod_launcher import launch


def test_a_pod_gets_its_arguments_environment_cores_log_and_exit_code(tmp_path):
    log = tmp_path / "pod.log"
    pod = launch("launched", ["3", "--flag"], log, {"ONLY_THIS": "1"}, frozenset({0}))
    assert pod.args[1:] == ["-m", "launched", "3", "--flag"]
    assert pod.wait(60) == 3 and pod.returncode == 3
    text = log.read_text()
    assert "argv=['3', '--flag'] env=['ONLY_THIS'] cores=[0]" in text
    assert "exit handler ran" in text  # a normal exit's handlers run in a forked pod too


def test_a_pod_is_titled_and_signalled_like_a_process(tmp_path):
    pod = launch("launched", ["sleep"], tmp_path / "pod.log", dict(os.environ))
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            pod.wait(0.5)
        assert pod.poll() is None
        with open(f"/proc/{pod.pid}/cmdline", "rb") as file:
            title = file.read().replace(b"\0", b" ").decode().split()
        assert title == pod.args
        pod.terminate()
        assert pod.wait(30) == -signal.SIGTERM
    finally:
        pod.kill()
