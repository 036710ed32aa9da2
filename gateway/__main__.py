"""python -m gateway --model DIR --redis-url redis://... [--port 8000] [--grpc-port 50050]

The flags are ``GatewaySettings``' fields (``--help`` lists them)."""

from __future__ import annotations

import asyncio
import logging

from cascade.serving.mesh.security import refuse_open
from cascade.serving.process import check_model, setup_logging
from cascade.serving.settings_cli import settings_command
from cascade.serving.telemetry import setup_telemetry
from gateway.server import serve
from gateway.settings import GatewaySettings


def main(settings: GatewaySettings) -> None:
    setup_logging()
    check_model(settings.model)
    refuse_open(bool(settings.keys), settings.allow_open, "API keys (CASCADE_API_KEYS)")
    mesh = settings.mesh.security(settings.session_key_file)
    logging.getLogger("gateway").info("dials pods with %s", mesh.describe())
    setup_telemetry("cascade-gateway")
    asyncio.run(serve(settings, mesh))


cli = settings_command(GatewaySettings, main, name="gateway")

if __name__ == "__main__":
    cli()
