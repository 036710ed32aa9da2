"""Pods forked from a warm process: ``python -m <module> <args>`` without paying the imports.

Most of a pod's start is importing torch and transformers (about 9 s of CPU on a small
machine), and a local cluster starts several pods, and starts them again after a fault.
``launch`` forks each from multiprocessing's fork server, which imported those libraries once
(the first pod pays for them), so a pod is serving in the time its model takes to load.

Each pod is still a process of its own: its pid, its signals, its environment, its log and CPU
cores, and its title in ``ps`` is the command line it stands for. Nothing that starts threads or
opens connections is imported before the fork (torch's and transformers' modules, the model
runner; gRPC is imported by each pod). Pods still running when the launching process exits are
stopped with it (SIGTERM, then SIGKILL), so none outlives a crashed ``cascade up`` or test.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.util  # registers its exit handler first: ours (LIFO) runs before it
import os
import runpy
import signal
import subprocess
import sys
from pathlib import Path

from setproctitle import setproctitle

PRELOAD = ["torch", "transformers", "cascade.core.features.feature_runner",
           "transformers.models.gpt2.modeling_gpt2", "transformers.models.llama.modeling_llama"]
"""Imported once by the fork server: what every pod imports and nothing that runs threads."""

_EXIT_GRACE_S = 5.0
_running: list[PodProcess] = []


class PodProcess:
    """A launched pod, with the part of ``subprocess.Popen``'s interface a cluster uses."""

    def __init__(self, process: multiprocessing.process.BaseProcess, args: list[str]):
        self._process = process
        self.args = args
        """The command line the pod stands for (its title in ``ps``), as ``Popen.args``."""

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """The exit code, or minus the signal that ended it; None while it runs."""
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self._process.name, timeout or 0.0)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def launch(module: str, args: list[str], log_path: Path, env: dict[str, str],
           cores: frozenset[int] | None = None) -> PodProcess:
    """Start ``python -m module *args`` forked from the warm fork server, its output appended
    to ``log_path``, with exactly ``env`` as its environment (pinned to ``cores`` if given)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    command = [sys.executable, "-m", module, *args]
    process = context.Process(target=_run, args=(module, command, str(log_path), env, cores),
                              name=module)
    process.start()
    pod = PodProcess(process, command)
    _running[:] = [p for p in _running if p.poll() is None] + [pod]
    return pod


def _run(module: str, command: list[str], log_path: str, env: dict[str, str],
         cores: frozenset[int] | None) -> None:
    """In the forked pod: its title, log, environment and cores, then the module as main."""
    setproctitle(" ".join(command))  # first: it needs the environment as the process got it
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(env)
    if cores:
        os.sched_setaffinity(0, cores)
    sys.argv = [module, *command[3:]]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:  # a forked child ends in os._exit: run what a normal exit runs (logging's flush,
        atexit._run_exitfuncs()  # a tensor-parallel verifier stopping its ranks)


@atexit.register
def _stop_running() -> None:
    """Stop the pods this process launched that still run (a test or ``cascade up`` that did
    not stop its cluster): multiprocessing would otherwise wait for them at exit."""
    alive = [pod for pod in _running if pod.poll() is None]
    for pod in alive:
        pod.terminate()
    for pod in alive:
        try:
            pod.wait(_EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            pod.kill()
            pod.wait()
