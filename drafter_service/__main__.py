"""python -m drafter_service --model DIR [--port 50061] [--redis-url redis://...]"""

from cascade.pod.cli import model_server_cli
from drafter_service.server import build_drafter

cli = model_server_cli("drafter", 50061, "Serve the drafter model: run draft -> verify loops "
                       "for sessions.", build_drafter)

if __name__ == "__main__":
    cli()
