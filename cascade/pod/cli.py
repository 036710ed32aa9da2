"""The command line shared by the drafter and verifier entry points (they differ only in role,
default port and how the service is built around the loaded model)."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from pathlib import Path

import typer

from cascade.core.features.feature_runner import load_model
from cascade.core.parallel.rank_processes import load_sharded
from cascade.core.model.runner import ModelSpec
from cascade.core.model.tensor_parallel import TensorParallelError
from cascade.core.model.weights import check_split
from cascade.pod.process import setup_pod
from cascade.protocol.names import default_model_id
from cascade.serving.mesh import SERVER_NAME_HELP, TLS_DIR_HELP, TOKEN_HELP, mesh_or_exit
from cascade.serving.mesh import refuse_open
from cascade.serving.metrics import serve_metrics
from cascade.serving.process import check_model, serve_forever
from cascade.serving.settings_cli import command_line
from cascade.serving.registry import connect
from cascade.serving.telemetry import setup_telemetry


def option(name: str, annotation: type, default) -> inspect.Parameter:
    """A role's own command-line option (``default`` is a ``typer.Option``)."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=annotation)


def model_server_cli(role: str, default_port: int, summary: str,
                     build: Callable[..., tuple],
                     options: tuple[inspect.Parameter, ...] = ()) -> typer.Typer:
    """``build(runner, host, port, grace_s, mesh=, registry=, **role_options)`` returns
    (GrpcService, object with num_active); ``options`` are the role's own flags, passed to
    ``build`` by name."""
    cli = command_line()

    def main(
        model: str = typer.Option(..., help=f"The {role}'s model: a local folder or a hub name."),
        dtype: str = typer.Option("auto", help="float32, bfloat16, float16 or auto "
                                  "(bfloat16 on a GPU or a CPU that runs it fast, measured; "
                                  "float32 elsewhere)."),
        device: str = typer.Option("cpu", help="torch device, e.g. cpu or cuda:0."),
        host: str = typer.Option("127.0.0.1", help="Address to bind."),
        port: int = typer.Option(default_port, help="Port to bind (0 picks a free one)."),
        advertise: str = typer.Option(None, help="host:port others use to reach this pod."),
        redis_url: str = typer.Option(None, envvar="CASCADE_REDIS_URL", help="Register in "
                                      "this Redis (pod registry); the environment keeps a "
                                      "password out of the process list."),
        grace_s: float = typer.Option(10.0, help="Seconds in-flight streams get when draining."),
        threads: int = typer.Option(0, help="torch threads (0 keeps torch's default)."),
        metrics_port: int = typer.Option(0, help="Serve Prometheus /metrics here (0: off), on "
                                         "--host."),
        model_name: str = typer.Option("", help="The served model's name in metrics' "
                                       "model_name label (default: the target folder's name, "
                                       "as the gateway's --model-name)."),
        target_model: str = typer.Option(None, help="When --model is a feature drafter: the "
                                         "target's folder, whose embedding and head it shares."),
        tls_dir: Path = typer.Option(None, envvar="CASCADE_TLS_DIR", help=TLS_DIR_HELP),
        tls_server_name: str = typer.Option(None, envvar="CASCADE_TLS_SERVER_NAME",
                                            help=SERVER_NAME_HELP),
        mesh_token_file: Path = typer.Option(None, envvar="CASCADE_MESH_TOKEN_FILE",
                                             help=TOKEN_HELP),
        health_port: int = typer.Option(None, envvar="CASCADE_HEALTH_PORT",
                                        help="Also serve gRPC health alone, in plaintext, on "
                                        "this port (for probes when the main port speaks "
                                        "mutual TLS)."),
        allow_open: bool = typer.Option(False, help="Serve without --tls-dir or a mesh token "
                                        "(otherwise refused): for local development."),
        **role_options,
    ) -> None:
        setup_pod(threads)
        mesh = mesh_or_exit(tls_dir, tls_server_name, mesh_token_file)
        refuse_open(mesh.is_authenticated, allow_open,
                    "mesh credentials (--tls-dir or --mesh-token-file)")
        logging.getLogger(role).info("mesh: %s", mesh.describe())
        setup_telemetry(f"cascade-{role}")
        serve_metrics(metrics_port, role, model_name or default_model_id(target_model or model),
                      host)
        runner, served_dtype = _load(role, model, dtype, device, target_model,
                                     role_options.pop("tensor_parallel", 1), threads)
        registry = connect(redis_url) if redis_url else None  # one client per pod
        service, sessions = build(runner, host, port, grace_s, mesh=mesh, registry=registry,
                                  **role_options)
        service.health_port = health_port
        asyncio.run(serve_forever(service, role, registry, advertise, lambda: sessions.num_active,
                                  {"dtype": served_dtype}))

    signature = inspect.signature(main)
    common = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    main.__signature__ = signature.replace(parameters=common + list(options))
    cli.command(help=summary)(main)
    return cli


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
