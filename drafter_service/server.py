"""Build the drafter's gRPC service around a loaded drafter model."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import redis.asyncio as redis

from cascade.core.sample import grammar
from cascade.core.model.runner import ModelRunner
from cascade.core.memory.suffix_index import SuffixIndex
from cascade.pod.process import model_executor
from cascade.serving.channels import ChannelPool
from cascade.serving.mesh.delay import LinkDelay
from cascade.serving.memory_stream import MemoryFeed
from cascade.serving.mesh.security import OPEN, MeshSecurity
from cascade.serving.server import GrpcService, ServiceBinding
from cascade.serving.watchdog import ExecutorWatchdog
from cascade.v1 import drafter_pb2, drafter_pb2_grpc
from drafter_service.servicer import DrafterServicer
from drafter_service.speculation import SpeculationConfig
from drafter_service.verifiers import VerifierPolicy

SERVICE_NAME = drafter_pb2.DESCRIPTOR.services_by_name["Drafter"].full_name


def build_drafter(runner: ModelRunner, host: str = "127.0.0.1", port: int = 0,
                  grace_s: float = 10.0, mesh: MeshSecurity = OPEN,
                  verifiers: VerifierPolicy | None = None, delay: LinkDelay = LinkDelay(),
                  speculation: SpeculationConfig = SpeculationConfig(),
                  memory: SuffixIndex | None = None, registry: redis.Redis | None = None
                  ) -> tuple[GrpcService, DrafterServicer]:
    """The drafter dials verifiers through ``mesh`` and only those ``verifiers`` allows;
    ``delay`` is injected on its messages to them (tests, benchmarks); ``speculation``: drafting
    while the verifier verifies; ``memory``: the speculation memory, fed from the cluster's
    stream in ``registry``'s Redis when one is given."""
    grammar.prepare(runner)
    executor = model_executor()
    servicer = DrafterServicer(runner, executor, ChannelPool(mesh), verifiers, delay,
                               speculation, memory)
    binding = ServiceBinding(drafter_pb2_grpc.add_DrafterServicer_to_server, servicer,
                             SERVICE_NAME)
    service = GrpcService([binding], host, port, grace_s, ExecutorWatchdog(executor), mesh)
    if memory is not None and registry is not None:
        service.companions.append(memory_feed(memory, registry))
    return service, servicer


def memory_feed(memory: SuffixIndex, registry: redis.Redis) -> MemoryFeed:
    """Follows the cluster's stream of finished generations into ``memory``, indexing on a
    thread of its own (never the model's)."""
    indexer = ThreadPoolExecutor(1, thread_name_prefix="memory-index")

    def index_batch(batch: list[tuple[str, list[int]]]) -> None:
        for scope, tokens in batch:
            memory.add(tokens, scope)

    return MemoryFeed(registry, index_batch, indexer)
