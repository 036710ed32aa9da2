"""python -m drafter_service --model DIR [--port 50061] [--redis-url redis://...]
[--allowed-verifiers HOST:PORT,...] [--tls-dir DIR] [--mesh-token-file FILE]
[--speculate off|cache|ahead] [--memory-max-sequences N] [--memory-max-tokens N]
[--no-invariant]"""

import logging

import typer

from cascade.core.forward.packed_backend import UnsupportedModel
from cascade.core.memory.suffix_index import SuffixIndex
from cascade.core.memory.candidates import MemoryLimits

from cascade.pod.cli import model_server_cli, option
from cascade.serving.delay import LinkDelay
from cascade.serving.metrics import DRAFTER, MemoryCollector
from drafter_service.server import build_drafter
from drafter_service.speculation import SpeculationConfig, SpeculationMode
from drafter_service.verifiers import VerifierPolicy

OPTIONS = (
    option("allowed_verifiers", str, typer.Option(
        None, envvar="CASCADE_ALLOWED_VERIFIERS", help="Comma-separated host:port verifiers "
        "this drafter may dial besides those in the registry (--redis-url). With neither, it "
        "dials any address a request names.")),
    option("inject_delay_ms", float, typer.Option(
        0.0, help="Testing: one-way delay added to every message to and from the verifier, "
        "as if it were this far away.")),
    option("inject_jitter_ms", float, typer.Option(
        0.0, help="Testing: uniform jitter (+-) on that delay.")),
    option("speculate", SpeculationMode, typer.Option(
        SpeculationMode.AHEAD.value, envvar="CASCADE_SPECULATE",
        help="Draft while the verifier verifies: 'cache' pre-drafts "
        "the next block for the likeliest outcomes, 'ahead' also sends the best of them to the "
        "verifier before the verdict; 'off' drafts after each verdict.")),
    option("speculate_fanout", int, typer.Option(
        6, help="Guessed next tokens per drafted position.")),
    option("speculate_blocks", int, typer.Option(
        12, help="Blocks pre-drafted per round at most.")),
    option("send_ahead", int, typer.Option(
        12, help="With --speculate ahead: pre-drafted blocks sent before the verdict.")),
    option("miss_draft_tokens", int, typer.Option(
        0, help="When no pre-draft guessed the outcome, draft at most this many tokens while "
        "the verifier waits (0: k).")),
    option("speculate_max_sessions", int, typer.Option(
        4, help="Speculate only while this drafter runs at most this many sessions.")),
    option("memory_max_sequences", int, typer.Option(
        MemoryLimits.max_sequences, help="Finished generations the speculation memory keeps "
        "(the oldest are evicted; 0 turns the memory off on this pod). It follows the "
        "cluster's stream in --redis-url's Redis.")),
    option("memory_max_tokens", int, typer.Option(
        MemoryLimits.max_tokens, help="Tokens the speculation memory keeps (about 40 bytes "
        "each).")),
    option("invariant", bool, typer.Option(
        True, help="Batch-invariant drafter passes: a proposal does not depend on how the "
        "drafter's cache was fed or which guesses were drafted beside it (reproducible "
        "drafts; --no-invariant: the plain pass).")),
)


def build(runner, host, port, grace_s, *, mesh, registry, allowed_verifiers, inject_delay_ms,
          inject_jitter_ms, speculate, speculate_fanout, speculate_blocks, send_ahead,
          miss_draft_tokens, speculate_max_sessions, memory_max_sequences, memory_max_tokens,
          invariant):
    verifiers = VerifierPolicy.from_options(allowed_verifiers, registry)
    _set_invariant(runner, invariant)
    logging.getLogger("drafter").info("dials %s", verifiers.describe())
    try:
        speculation = SpeculationConfig(speculate, speculate_fanout, speculate_blocks, send_ahead,
                                        miss_draft_tokens, speculate_max_sessions)
        memory = (SuffixIndex(MemoryLimits(memory_max_sequences, memory_max_tokens))
                  if memory_max_sequences else None)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if memory is not None:
        DRAFTER.register(MemoryCollector(memory))
    return build_drafter(runner, host, port, grace_s, mesh, verifiers,
                         LinkDelay(inject_delay_ms, inject_jitter_ms), speculation, memory,
                         registry)


def _set_invariant(runner, invariant: bool) -> None:
    """The model drafter's caches in the invariant mode (a feature drafter runs its own pass;
    a model the invariant attention cannot run keeps the plain one)."""
    if not invariant or not hasattr(runner, "set_invariant"):
        return
    try:
        runner.set_invariant()
    except UnsupportedModel as exc:
        logging.getLogger("drafter").warning("plain drafter passes: %s", exc)


cli = model_server_cli("drafter", 50061, "Serve the drafter model: run draft -> verify loops "
                       "for sessions.", build, OPTIONS)

if __name__ == "__main__":
    cli()
