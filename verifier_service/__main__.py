"""python -m verifier_service --model DIR [--port 50051] [--redis-url redis://...]"""

from cascade.pod.cli import model_server_cli
from verifier_service.server import build_verifier

cli = model_server_cli("verifier", 50051, "Serve the target model: verify draft blocks, or "
                       "decode alone (k = 0).", build_verifier)

if __name__ == "__main__":
    cli()
