"""``cascade up``'s settings: its own (the pair, the ports, how many drafters, Redis replicas)
and the services' fields it passes on, declared there and reused here, so their help, bounds
and checks are the services' own; its command line is generated from the class."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, DirectoryPath, Field

from cascade.core.paths import cache_root
from cascade.pod.settings import Dtype, PodSettings
from cascade.serving.memory_stream import MemoryMode
from cascade.serving.settings_cli import borrowed, to_flags
from cascade.tools.cluster_config import ClusterConfig
from cascade.tools.pairs import PairName, PairSettings
from cascade.tools.redis_server import is_bindable
from gateway.settings import DraftMethod, GatewaySettings
from verifier_service.settings import CompileMode, VerifierPodSettings

GATEWAY_FIELDS = ("speculation_memory", "draft_method")
VERIFIER_FIELDS = ("invariant", "compile", "tensor_parallel")
"""The services' settings ``cascade up`` takes and passes on (the ports and the dtype it passes
itself)."""


class UpSettings(BaseModel):
    """Start Redis, a verifier, drafters and the gateway; Ctrl-C (or SIGTERM) stops them
    all."""

    model_config = ConfigDict(frozen=True)

    target: DirectoryPath | None = borrowed(PairSettings, "target")
    drafter: DirectoryPath | None = borrowed(PairSettings, "drafter")
    pair: PairName = borrowed(PairSettings, "pair")
    drafters: int = Field(1, ge=1, description="Number of drafter processes.")
    port: int = Field(8000, ge=0, le=65535, description="Gateway HTTP port (0: a free one).")
    grpc_port: int = Field(50050, ge=0, le=65535, description="Gateway gRPC port (0: a free "
                           "one).")
    dtype: Dtype = borrowed(PodSettings, "dtype")
    invariant: bool = borrowed(VerifierPodSettings, "invariant")
    compile: CompileMode = borrowed(VerifierPodSettings, "compile")
    tensor_parallel: int = borrowed(VerifierPodSettings, "tensor_parallel")
    speculation_memory: MemoryMode = borrowed(GatewaySettings, "speculation_memory")
    draft_method: DraftMethod = borrowed(GatewaySettings, "draft_method")
    redis_replicas: int = Field(0, ge=0, description="Redis replicas beside the primary, with "
                                "three sentinels that fail over to one of them (0: one Redis).")
    workdir: Path = Field(default_factory=lambda: cache_root() / "local", description="Folder "
                          "for the processes' logs (each start keeps the previous run's as "
                          "*.log.1), Redis's data and the mesh certificates (default: local/ "
                          "in $XDG_CACHE_HOME/cascade, else ~/.cache/cascade).")

    def check_ports(self) -> None:
        """ValueError naming a port something else holds (before the pair is prepared)."""
        for flag, number in (("--port", self.port), ("--grpc-port", self.grpc_port)):
            if number and not is_bindable(number):
                raise ValueError(f"{flag} {number} is in use; stop what holds it, or pass "
                                 f"{flag} 0 for a free one")

    def cluster(self, target: Path, drafter: Path) -> ClusterConfig:
        """The local cluster of ``target`` and ``drafter`` (the pair's folders), its split
        checked before anything starts (ValueError: what to fix; the ports: ``check_ports``,
        before the pair is prepared)."""
        if self.tensor_parallel > 1:
            from cascade.core.model.weights import check_split

            check_split(str(target), self.tensor_parallel)  # a TensorParallelError: ValueError
        return ClusterConfig(target, drafter, num_drafters=self.drafters, http_port=self.port,
                             grpc_port=self.grpc_port, dtype=self.dtype, workdir=self.workdir,
                             gateway_args=to_flags(self, GatewaySettings, GATEWAY_FIELDS),
                             redis_replicas=self.redis_replicas,
                             verifier_args=to_flags(self, VerifierPodSettings, VERIFIER_FIELDS))
