"""python -m verifier_service --model DIR [--port 50051] [--redis-url redis://...]
[--kv-tokens N] [--max-batch-tokens N] [--max-wait-ms MS] [--no-batching] [--no-invariant]
[--no-share-prefixes] [--tensor-parallel N] [--compile off|auto|on]"""

import dataclasses

import typer

from cascade.pod.cli import model_server_cli
from cascade.serving.mesh.security import load_session_key
from verifier_service.server import build_verifier
from verifier_service.settings import VerifierPodSettings


def build(runner, settings: VerifierPodSettings, *, mesh, registry):
    try:
        mesh = dataclasses.replace(mesh, session_key=load_session_key(settings.session_key_file))
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--session-key-file") from exc
    return build_verifier(runner, settings.host, settings.port, settings.grace_s,
                          settings.verifier(), mesh)


cli = model_server_cli("verifier", VerifierPodSettings, build)

if __name__ == "__main__":
    cli()
