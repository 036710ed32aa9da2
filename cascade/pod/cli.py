"""The command line shared by the drafter and verifier entry points (they differ only in role,
default port and how the service is built around the loaded model)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import typer

from cascade.core.features.feature_runner import load_model
from cascade.core.parallel.rank_processes import load_sharded
from cascade.core.model.runner import ModelSpec
from cascade.core.model.tensor_parallel import TensorParallelError
from cascade.core.model.weights import check_split
from cascade.pod.process import setup_pod
from cascade.protocol.names import default_model_id
from cascade.pod.settings import PodSettings
from cascade.serving.mesh.security import refuse_open
from cascade.serving.metrics import serve_metrics
from cascade.serving.process import check_model, serve_forever
from cascade.serving.settings_cli import settings_command
from cascade.serving.registry import connect
from cascade.serving.telemetry import setup_telemetry


def model_server_cli(role: str, settings_type: type[PodSettings],
                     build: Callable[..., tuple]) -> typer.Typer:
    """The role's command line, generated from ``settings_type``; ``build(runner, settings,
    mesh=, registry=)`` returns (GrpcService, object with num_active)."""

    def main(settings: PodSettings) -> None:
        setup_pod(settings.threads)
        mesh = settings.mesh.security()
        refuse_open(mesh.is_authenticated, settings.allow_open,
                    "mesh credentials (--tls-dir or --mesh-token-file)")
        logging.getLogger(role).info("mesh: %s", mesh.describe())
        setup_telemetry(f"cascade-{role}")
        model = settings.model
        serve_metrics(settings.metrics_port, role,
                      settings.model_name or default_model_id(settings.target_model or model),
                      settings.host)
        runner, served_dtype = _load(role, model, settings.dtype, settings.device,
                                     settings.target_model,
                                     getattr(settings, "tensor_parallel", 1), settings.threads)
        redis_url = settings.mesh.redis_url
        registry = connect(redis_url) if redis_url else None  # one per pod
        service, sessions = build(runner, settings, mesh=mesh, registry=registry)
        service.health_port = settings.health_port
        asyncio.run(serve_forever(service, role, registry, settings.advertise,
                                  lambda: sessions.num_active, {"dtype": served_dtype}))

    return settings_command(settings_type, main)


def _load(role: str, model: str, dtype: str, device: str, target_model: str | None,
          tensor_parallel: int = 1, threads: int = 0):
    """(runner, the dtype it runs in), the choice logged; a model folder that is not there, a
    dtype not known, or a model that does not split over ``tensor_parallel`` ranks ends the
    process with one line saying so."""
    check_model(model)
    check_model(target_model, "--target-model")
    try:
        spec = ModelSpec(model, dtype, device)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--dtype") from exc
    logging.getLogger(role).info("loading %s in %s (--dtype %s) on %s", model, spec.dtype, dtype,
                                 device)
    if tensor_parallel == 1:
        return load_model(spec, target_model), spec.dtype
    try:
        check_split(model, tensor_parallel)
    except TensorParallelError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tensor-parallel") from exc
    return load_sharded(spec, tensor_parallel, threads), spec.dtype
