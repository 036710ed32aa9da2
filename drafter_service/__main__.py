"""python -m drafter_service --model DIR [--port 50061] [--redis-url redis://...]
[--allowed-verifiers HOST:PORT,...] [--tls-dir DIR] [--mesh-token-file FILE]"""

import logging

import typer

from cascade.pod.cli import model_server_cli, option
from cascade.serving.delay import LinkDelay
from drafter_service.server import build_drafter
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
)


def build(runner, host, port, grace_s, *, mesh, registry, allowed_verifiers, inject_delay_ms,
          inject_jitter_ms):
    verifiers = VerifierPolicy.from_options(allowed_verifiers, registry)
    logging.getLogger("drafter").info("dials %s", verifiers.describe())
    return build_drafter(runner, host, port, grace_s, mesh, verifiers,
                         LinkDelay(inject_delay_ms, inject_jitter_ms))


cli = model_server_cli("drafter", 50061, "Serve the drafter model: run draft -> verify loops "
                       "for sessions.", build, OPTIONS)

if __name__ == "__main__":
    cli()
