"""python -m drafter_service --model DIR [--port 50051] [--redis-url redis://...]"""

from __future__ import annotations

import typer

from cascade.runner import ModelRunner, ModelSpec
from cascade.serving.app import run, serve_forever, setup_process
from drafter_service.server import build_drafter

cli = typer.Typer(add_completion=False)


@cli.command()
def main(
    model: str = typer.Option(..., help="Drafter model: a local folder or a hub name."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    device: str = typer.Option("cpu", help="torch device, e.g. cpu or cuda:0."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(50061, help="Port to bind (0 picks a free one)."),
    advertise: str = typer.Option(None, help="host:port others use to reach this pod."),
    redis_url: str = typer.Option(None, help="Register in this Redis (heartbeat keys)."),
    grace_s: float = typer.Option(10.0, help="Seconds in-flight streams get when draining."),
    threads: int = typer.Option(0, help="torch threads (0 keeps torch's default)."),
) -> None:
    """Serve the drafter model: run draft -> verify loops for sessions."""
    setup_process(threads)
    runner = ModelRunner.load(ModelSpec(model, dtype, device))
    service, servicer = build_drafter(runner, host, port, grace_s)
    run(serve_forever(service, "drafter", redis_url, advertise, lambda: servicer.num_active))


if __name__ == "__main__":
    cli()
