"""Tracing, set up once per process: ``setup_telemetry(service_name)``.

Exporters follow the standard OpenTelemetry environment: OTLP over gRPC when
OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, the console when
CASCADE_TRACE_CONSOLE=1. gRPC servers and channels are instrumented so that the W3C trace context
travels in metadata: one generation is one trace across gateway, drafter and verifier, with a
span per protocol step (``draft``, ``verify``, ``commit``). With no exporter configured,
tracing stays off (the no-op tracer, gRPC not instrumented).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

tracer = trace.get_tracer("cascade")
_instrumented = False


def instrument_grpc() -> None:
    """Patch grpc.aio servers and channels created from now on (idempotent)."""
    global _instrumented
    if _instrumented:
        return
    from opentelemetry.instrumentation.grpc import (
        GrpcAioInstrumentorClient,
        GrpcAioInstrumentorServer,
        filters,
    )

    # Not the health service: probes are noise in traces, and the instrumentation breaks its
    # Watch stream (it takes the servicer's coroutine for an async iterator).
    GrpcAioInstrumentorServer(filter_=filters.negate(filters.health_check())).instrument()
    GrpcAioInstrumentorClient().instrument()
    _instrumented = True


def _processors(environ: Mapping[str, str]) -> list[SpanProcessor]:
    processors: list[SpanProcessor] = []
    if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        processors.append(BatchSpanProcessor(OTLPSpanExporter()))
    if environ.get("CASCADE_TRACE_CONSOLE") == "1":
        processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
    return processors


def setup_telemetry(service_name: str, environ: Mapping[str, str] | None = None,
                    extra: Sequence[SpanProcessor] = ()) -> TracerProvider | None:
    """Install a tracer provider for this process (named by OTEL_SERVICE_NAME if set) and
    instrument gRPC, when spans have somewhere to go; else leave tracing off (returns None).

    Off means the no-op tracer: recording spans nobody exports and wrapping every gRPC message
    cost about 0.4 ms per speculative round on loopback (docs/benchmarks.md)."""
    environ = os.environ if environ is None else environ
    processors = [*_processors(environ), *extra]
    if not processors:
        return None
    name = environ.get("OTEL_SERVICE_NAME", service_name)
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    for processor in processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    instrument_grpc()
    return provider


def current_context() -> otel_context.Context:
    return otel_context.get_current()


def start_span(name: str, parent: otel_context.Context | None, **attributes):
    """A span with an explicit parent context: async generators resume in other contexts, so
    the protocol-step spans never rely on the implicit current span."""
    return tracer.start_as_current_span(name, context=parent, attributes=attributes)
