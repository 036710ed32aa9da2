"""The target's packed step compiled (``--compile off|auto|on``).

``compile_target`` puts ``torch.compile(model, dynamic=True)`` beside the model; the packed pass
(``cascade.core.forward.packed``) calls it instead of the model. The whole forward is one graph: the
norms, rotary embeddings, activations and residuals fuse into a few kernels, and the two things
no compiler should look into are single opaque operations (``cascade.core.forward.graph_ops``): each
layer's packed attention (the step's plan is Python: rows, block tables, spans) and the
products over oneDNN-packed weights, which run the same kernels as eager code. The row count
is a dynamic size, so one graph serves every step; a step never feeds a single token (a filler
row is added, ``packed.MIN_COMPILED_ROWS``), since compiled code specialises a size of 1.

Exactness: the opaque products keep their row rules; the fused kernels reduce each row on its
own (RMSNorm over the hidden size), so the batch-invariant pass stays invariant with compile on
(tests/core/verify/test_compiled.py); compiled and eager logits differ by rounding only.

Start-up: ``warm_up`` compiles before the first request, reporting progress. Inductor keeps
what it built under ``cache_dir(runner)`` (per model, dtype, torch and machine): SmolLM2-135M
on two cores compiles in about 330 s the first time and 75 s on a later start. A pass that
asks for hidden states (a feature drafter's session) is a second graph, compiled when the first
one comes.

Measured on an AVX2 EPYC, two cores, float32 (docs/benchmarks.md): the compiled invariant step
takes 0.85-1.00x the eager one (median 0.93). Inductor's freezing (weights as constants, the packed products
called from the C++ wrapper) took 0.82-0.88x, but a frozen graph is never cached: every start
would compile for minutes, so it is not used.

The in-process loop (``cascade.core.loop``) compiles its target when ``CASCADE_COMPILE`` (the
verifier's flag's variable) asks for it, so any exactness test runs compiled with
``CASCADE_COMPILE=on``.

``auto`` compiles on a GPU only: on a CPU the first compile takes minutes on a few cores, so
it is asked for (``on``). A GPU would gain most from CUDA graphs, which need the attention's
plan as tensors of bucketed shapes (the plan is built in Python per step today): not done.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from cascade.core.verify.engine import Pass
from cascade.core.forward.graph_ops import is_compiled
from cascade.core.paths import cache_root
from cascade.core.verify.step_profile import identity

MODES = ("off", "auto", "on")
_LOG = logging.getLogger("cascade.compile")


def check_mode(mode: str) -> str:
    """``mode``, or ValueError naming the modes."""
    if mode not in MODES:
        raise ValueError(f"compile must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def wanted(mode: str, device: torch.device | str) -> bool:
    """Whether ``mode`` compiles on ``device`` (``auto``: on a GPU)."""
    check_mode(mode)
    return mode == "on" or (mode == "auto" and torch.device(device).type == "cuda")


def compile_target(runner, mode: str) -> bool:
    """Compile ``runner``'s packed step if ``mode`` asks for it on its device (lazily: the
    first passes compile; ``warm_up`` runs them). Returns whether it is compiled."""
    if not wanted(mode, runner.device):
        return False
    if getattr(runner.model, "cascade_leader", None) is not None:
        raise ValueError("--compile does not run a tensor-parallel target yet (its other ranks "
                         "run the eager step); use --compile off with --tensor-parallel")
    if not is_compiled(runner.model):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir(runner))  # read at each use
        runner.model.cascade_compiled = compiled_forward(runner.model)
    return True


@contextlib.contextmanager
def using(model, forward):
    """Within: ``model``'s packed passes call ``forward`` (its compiled form, or None for the
    eager model), whatever ``compile_target`` set (a bench's columns side by side)."""
    before = getattr(model, "cascade_compiled", None)
    model.cascade_compiled = forward
    try:
        yield
    finally:
        model.cascade_compiled = before


def compiled_forward(model):
    """``model`` compiled as ``compile_target`` compiles it (not attached to it). On the CPU
    the generated wrapper is C++ (``cpp_wrapper``): it calls the kernels without a Python
    frame each, about 10 % of a one-row step of SmolLM2-135M."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    return torch.compile(model, dynamic=True, options={"cpp_wrapper": on_cpu})


def cache_dir(runner) -> Path:
    """Where inductor keeps the kernels it built for this model: one folder per model,
    dtype, torch version and machine (``step_profile.identity`` less what a kernel does not
    depend on)."""
    found = identity(runner)
    for key in ("pass", "threads", "revision", "compiled"):
        found.pop(key, None)
    digest = hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "compile" / f"{found['model']}-{digest}"


def warm_up(engine, report: Callable[[str], None] | None = None) -> float:
    """Run the passes that compile ``engine``'s step now: a prefill of several rows, then a
    step of one token (with logits and without hidden states, as the verifier's steps run).
    Returns the seconds it took; ``report`` is told what is compiling."""
    if not is_compiled(engine.runner.model):
        return 0.0
    report = report or _LOG.info
    started, tokens = time.perf_counter(), [i % engine.runner.vocab_size for i in range(9)]
    cache = engine.admit(len(tokens))
    try:
        for end, what in ((8, "a prefill"), (9, "a one-token step")):
            report(f"compiling the target's step: {what} (minutes the first time on a CPU; "
                   f"kept under {os.environ.get('TORCHINDUCTOR_CACHE_DIR', 'inductor cache')})")
            engine.run([Pass(cache, tokens[:end], 1)])
    finally:
        cache.release()
    seconds = time.perf_counter() - started
    report(f"compiled the target's step in {seconds:.1f} s")
    return seconds
