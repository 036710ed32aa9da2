"""python -m drafter_service --model DIR [--port 50061] [--redis-url redis://...]
[--allowed-verifiers HOST:PORT,...] [--tls-dir DIR] [--mesh-token-file FILE]
[--speculate off|cache|ahead] [--memory-max-sequences N] [--memory-max-tokens N]
[--no-invariant]"""

import logging

from cascade.core.forward.packed_backend import UnsupportedModel
from cascade.core.memory.suffix_index import SuffixIndex
from cascade.core.memory.candidates import MemoryLimits

from cascade.pod.cli import model_server_cli
from cascade.serving.mesh.delay import LinkDelay
from cascade.serving.metrics import DRAFTER, MemoryCollector
from drafter_service.server import build_drafter
from drafter_service.settings import DrafterPodSettings
from drafter_service.verifiers import VerifierPolicy

def build(runner, settings: DrafterPodSettings, *, mesh, registry):
    verifiers = VerifierPolicy.from_options(settings.allowed_verifiers, registry)
    _set_invariant(runner, settings.invariant)
    logging.getLogger("drafter").info("dials %s", verifiers.describe())
    memory = (SuffixIndex(MemoryLimits(settings.memory_max_sequences, settings.memory_max_tokens))
              if settings.memory_max_sequences else None)
    if memory is not None:
        DRAFTER.register(MemoryCollector(memory))
    delay = LinkDelay(settings.inject_delay_ms, settings.inject_jitter_ms)
    return build_drafter(runner, settings.host, settings.port, settings.grace_s, mesh, verifiers,
                         delay, settings.speculation(), memory, registry)


def _set_invariant(runner, invariant: bool) -> None:
    """The model drafter's caches in the invariant mode (a feature drafter runs its own pass;
    a model the invariant attention cannot run keeps the plain one)."""
    if not invariant or not hasattr(runner, "set_invariant"):
        return
    try:
        runner.set_invariant()
    except UnsupportedModel as exc:
        logging.getLogger("drafter").warning("plain drafter passes: %s", exc)


cli = model_server_cli("drafter", DrafterPodSettings, build)

if __name__ == "__main__":
    cli()
