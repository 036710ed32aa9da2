"""A small gRPC client of the gateway, used by ``cascade generate``: streams one generation and
summarises it (acceptance, tokens/s, per-round protocol overhead)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from cascade.protocol.stats import SpecStats
from cascade.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc


@dataclass
class GenerationSummary:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)
    first_token_s: float = 0.0
    elapsed_s: float = 0.0
    overhead_us: list[int] = field(default_factory=list)
    """Per drafted round: its wall time at the drafter minus verification and the drafting
    done after the previous verdict (a block drafted during verification cost the round
    nothing; a round the verifier decoded alone has no round trip and is left out)."""

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def num_rounds(self) -> int:
        return self.stats.num_target_passes

    @property
    def num_undrafted(self) -> int:
        """Rounds that verified no draft (the verifier decoded them alone)."""
        return self.num_rounds - self.stats.num_drafts

    def observe(self, response: gateway_pb2.GenerateResponse) -> None:
        self.text += response.text
        self.token_ids += response.token_ids
        stats = response.stats
        self.stats.observe_round(stats, len(response.token_ids))
        if stats.round_us and stats.num_drafted:
            hidden = stats.speculation in (common_pb2.SPECULATION_CACHE_HIT,
                                           common_pb2.SPECULATION_AHEAD_HIT)
            drafting = 0 if hidden else stats.draft_us
            self.overhead_us.append(stats.round_us - drafting - stats.verify_us)


RESUMABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
             grpc.StatusCode.RESOURCE_EXHAUSTED}
"""Statuses after which the stream is resumed on the next gateway (a dead gateway's stream
ends UNAVAILABLE; a session still held by it answers RESOURCE_EXHAUSTED)."""


def stream_generation(address: str | Sequence[str], prompt: str, max_tokens: int,
                      num_draft_tokens: int, temperature: float = 0.0, seed: int = 0,
                      chat: bool = True,
                      on_response: Callable[[gateway_pb2.GenerateResponse], None] | None = None,
                      timeout_s: float = 600.0, cascade_rule: str | None = None,
                      cascade_alpha: float = 0.0, schedule: str = "",
                      max_resumes: int = 5, tree_nodes: int | None = None,
                      tree_expansion: str = "",
                      acceptance: str = "", idle_timeout_s: float | None = None,
                      on_resume: Callable[[grpc.RpcError], None] | None = None,
                      draft_method: str = "") -> GenerationSummary:
    """One generation through the gateway; ``cascade_rule`` makes it a speculative cascade,
    ``schedule`` is the request's draft_schedule ("auto", "fixed" or "adaptive"; empty: the
    gateway's default), ``tree_nodes`` its draft_tree_nodes (None: the gateway's default),
    ``tree_expansion`` its draft_tree_expansion (empty: "dynamic"),
    ``acceptance`` its rule family ("lossless", "keyed"; empty: the default), ``draft_method``
    its drafting method (empty: the gateway's default). ``address``: one gateway or several
    (``host:port,host:port``): when a stream breaks, it is resumed on the next one after the
    last round received, up to ``max_resumes`` times; a stream that sends nothing for
    ``idle_timeout_s`` (a hung gateway) is cancelled and resumed the same way; ``on_resume``
    hears each error a resume follows."""
    cascade = {"acceptance": "cascade", "cascade_rule": cascade_rule,
               "cascade_alpha": cascade_alpha} if cascade_rule else {"acceptance": acceptance}
    request = gateway_pb2.GenerateRequest(prompt=prompt, num_draft_tokens=num_draft_tokens,
                                          chat=chat, max_tokens=max_tokens,
                                          temperature=temperature, seed=seed, **cascade,
                                          draft_schedule=schedule, draft_tree_nodes=tree_nodes,
                                          draft_tree_expansion=tree_expansion,
                                          draft_method=draft_method)
    gateways = address.split(",") if isinstance(address, str) else list(address)
    summary, position = GenerationSummary(), _Position(idle_timeout_s=idle_timeout_s)
    started = time.perf_counter()
    for attempt in range(max_resumes + 1):
        try:
            with grpc.insecure_channel(gateways[attempt % len(gateways)].strip()) as channel:
                for response in position.call(gateway_pb2_grpc.GatewayStub(channel), request,
                                              timeout_s):
                    if summary.num_rounds == 0:
                        summary.first_token_s = time.perf_counter() - started
                    summary.observe(response)
                    if on_response:
                        on_response(response)
            break
        except grpc.RpcError as exc:
            if exc.code() not in RESUMABLE or attempt == max_resumes:
                raise
            if on_resume:
                on_resume(exc)
            time.sleep(min(2.0, 0.1 * 2 ** attempt))
    summary.elapsed_s = time.perf_counter() - started
    return summary


@dataclass
class _Position:
    """Where a stream is: its session and last round, so a broken stream resumes after it."""

    session_id: str = ""
    round: int = 0
    idle_timeout_s: float | None = None

    def call(self, stub, request, timeout_s: float):
        stream = (stub.Resume(gateway_pb2.ResumeRequest(session_id=self.session_id,
                                                        after_round=self.round),
                              timeout=timeout_s)
                  if self.session_id else stub.Generate(request, timeout=timeout_s))
        watchdog = _Watchdog(stream, self.idle_timeout_s) if self.idle_timeout_s else None
        try:
            for response in stream:
                self.session_id, self.round = response.session_id, response.round or self.round
                if watchdog:
                    watchdog.kick()
                yield response
        finally:
            if watchdog:
                watchdog.stop()


class _Watchdog:
    """Cancels ``call`` when ``kick`` has not been called for ``idle_s`` seconds."""

    def __init__(self, call, idle_s: float) -> None:
        self.call, self.idle_s = call, idle_s
        self.last, self.done = time.monotonic(), threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def kick(self) -> None:
        self.last = time.monotonic()

    def stop(self) -> None:
        self.done.set()

    def _watch(self) -> None:
        while not self.done.wait(min(1.0, self.idle_s / 4)):
            if time.monotonic() - self.last > self.idle_s:
                self.call.cancel()
                return
