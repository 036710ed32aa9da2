"""python -m verifier_service --model DIR [--port 50051] [--redis-url redis://...]
[--kv-tokens N] [--max-batch-tokens N] [--max-wait-ms MS] [--no-batching] [--no-invariant]
[--no-share-prefixes] [--tensor-parallel N] [--compile off|auto|on]"""

import dataclasses
from pathlib import Path

import typer

from cascade.core.verify.compiled import check_mode
from cascade.pod.cli import model_server_cli, option
from cascade.serving.mesh import SESSION_KEY_HELP, load_session_key
from verifier_service.scheduler import VerifierSettings
from verifier_service.server import build_verifier

_DEFAULTS = VerifierSettings()


def _compile_mode(value: str) -> str:
    try:
        return check_mode(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


OPTIONS = (
    option("kv_tokens", int, typer.Option(
        0, help="KV budget in tokens shared by all sessions, in blocks of 64 (0: 40 % of the "
        "memory available at start-up, at most 64 full-length sequences).")),
    option("max_batch_tokens", int, typer.Option(
        _DEFAULTS.max_batch_tokens, help="Most tokens one engine step feeds.")),
    option("max_wait_ms", float, typer.Option(
        _DEFAULTS.max_wait_ms, help="How long a free model thread waits for the last step's "
        "sessions to send their next blocks before stepping without them.")),
    option("batching", bool, typer.Option(
        True, help="Verify blocks from many sessions in one pass (--no-batching: one block "
        "per pass).")),
    option("invariant", bool, typer.Option(
        True, help="Batch-invariant passes: a position's logits are bit-identical whatever "
        "else the pass holds, so greedy output equals the target's own one-token decoding for "
        "any draft length, batch or load (--no-invariant: the plain pass, up to 10 % faster "
        "in bfloat16, 50 % in float32 at one session without speculation).")),
    option("share_prefixes", bool, typer.Option(
        True, help="A new session takes the keys and values of the prompt prefix a live or "
        "ended session of its scope holds (n choices of one prompt, a chat's next turn, a "
        "common system prompt) instead of computing them again (--no-share-prefixes: every "
        "session computes its whole prompt).")),
    option("admission_wait_s", float, typer.Option(
        _DEFAULTS.admission_wait_s, help="How long a session waits for KV memory before "
        "RESOURCE_EXHAUSTED.")),
    option("max_kv_share", float, typer.Option(
        _DEFAULTS.max_kv_share, min=0.01, max=1.0, help="Most of the KV budget one API key's "
        "sessions may hold while another key's sessions wait for memory (1: no share).")),
    option("compile", str, typer.Option(
        _DEFAULTS.compile, callback=_compile_mode, envvar="CASCADE_COMPILE",
        help="Compile the target's step with torch.compile (one graph per step, attention "
        "and packed products opaque): on, off, or auto (on a GPU only). The first start "
        "compiles for minutes on a few CPU cores (progress logged), later starts reuse the "
        "kernels cached per model, dtype and machine; measured 0-15 % faster per step on a "
        "CPU (docs/benchmarks.md).")),
    option("tensor_parallel", int, typer.Option(
        1, min=1, envvar="CASCADE_TENSOR_PARALLEL", help="Split the target over this many "
        "ranks (processes this pod starts; one GPU each with --device cuda): attention heads "
        "and MLP columns by the model's tensor-parallel plan, the KV cache by heads. The "
        "target's attention and key/value heads must divide by it.")),
    option("session_key_file", Path, typer.Option(
        None, envvar="CASCADE_SESSION_KEY_FILE", help=SESSION_KEY_HELP)),
)


def build(runner, host, port, grace_s, *, mesh, registry, kv_tokens, max_batch_tokens,
          max_wait_ms, batching, invariant, share_prefixes, admission_wait_s, max_kv_share,
          compile, session_key_file):
    settings = VerifierSettings(kv_tokens or None, admission_wait_s, max_batch_tokens,
                                max_wait_ms, batching, invariant, share_prefixes, max_kv_share,
                                compile)
    try:
        mesh = dataclasses.replace(mesh, session_key=load_session_key(session_key_file))
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    return build_verifier(runner, host, port, grace_s, settings, mesh)


cli = model_server_cli("verifier", 50051, "Serve the target model: verify draft blocks from "
                       "many sessions in batched passes, or decode alone (k = 0).", build,
                       OPTIONS)

if __name__ == "__main__":
    cli()
