"""Thin gRPC servicer over the SessionTable: protobuf in, core call, protobuf out."""

from __future__ import annotations

import asyncio

from cascade.pod.messages import round_from_verdict
from cascade.session.wire import ends_generation
from cascade.serving.errors import StaleEpoch
from cascade.serving.mesh import OPEN, MeshSecurity
from cascade.v1 import verifier_pb2, verifier_pb2_grpc
from verifier_service.sessions import SessionTable


class Inbox:
    """A Verify stream's requests, read by a task of their own: shadow blocks and draft-ready
    notes are handed to ``on_aside`` as they arrive (also while the verifier decodes the session
    alone and reads nothing else); opens and blocks queue, in order, for ``async for``. A
    failure (a bad shadow, a broken stream) is raised to the reader."""

    def __init__(self, requests, on_aside) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.failure: Exception | None = None
        self.task = asyncio.ensure_future(self._pump(requests, on_aside))

    async def _pump(self, requests, on_aside) -> None:
        try:
            async for request in requests:
                if request.HasField("shadow") or request.HasField("ready"):
                    on_aside(request)
                else:
                    self.queue.put_nowait(request)
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            self.failure = exc
        self.queue.put_nowait(None)

    def __aiter__(self):
        return self

    async def __anext__(self) -> verifier_pb2.VerifyRequest:
        request = await self.queue.get()
        if request is None:
            self.raise_failure()
            raise StopAsyncIteration
        return request

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    def close(self) -> None:
        self.task.cancel()


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    def __init__(self, sessions: SessionTable, mesh: MeshSecurity = OPEN) -> None:
        self.sessions, self.mesh = sessions, mesh

    async def _open(self, msg: verifier_pb2.SessionOpen):
        """Only a session a gateway tagged (with a session key set), then the table's open."""
        self.mesh.check_owner_tag(msg.session_id, msg.epoch, msg.owner_tag)
        return await self.sessions.open(msg)

    async def Verify(self, request_iterator, context):
        session = None

        def on_aside(request: verifier_pb2.VerifyRequest) -> None:
            if session is None:
                raise ValueError("open: send a SessionOpen message before shadow blocks or "
                                 "draft-ready notes")
            if request.HasField("shadow"):
                self.sessions.shadow(session, request.shadow)
            else:
                self.sessions.ready(session, request.ready)

        inbox = Inbox(request_iterator, on_aside)
        try:
            async for request in inbox:
                if request.HasField("open"):
                    session = await self._open(request.open)
                    if session.sequence.feature_layers:
                        for reply in await self.sessions.open_replies(session):
                            yield reply
                    if request.open.plan_drafts:  # how long the first block should be
                        plan = self.sessions.plan_reply(session)
                        yield plan
                        async for alone in self._decode_alone(session, plan, inbox, 0):
                            yield alone
                elif session is None:
                    raise ValueError("open: send a SessionOpen message before draft blocks")
                else:  # None: a block sent ahead on a wrong guess, dropped
                    verdict = await self.sessions.verify(session, request.block)
                    if verdict is not None:
                        yield verdict
                    elif self.sessions.awaits_block(session):  # it goes on catching up
                        verdict = session.last_verdict
                    async for alone in self._decode_alone(session, verdict, inbox):
                        yield alone
        finally:
            inbox.close()
            if session is not None:
                await self.sessions.close(session)

    async def _decode_alone(self, session, verdict, inbox: Inbox,
                            first_round: int | None = None):
        """While the plan says the session's drafts do not pay (a verdict asking for 0 drafted
        tokens), the verifier decodes it alone, round after round, as Decode does; the drafter
        sends no blocks (shadow blocks at most, which the inbox scores as they come) and relays
        these verdicts until one asks for drafts again. Then, until that block comes and while
        other sessions keep the verifier stepping, it goes on decoding the session alone
        (catching-up rounds, ``SessionTable.catches_up``), so the session misses no step for
        its drafter's round trip. ``first_round``: the round to start at (default: the one
        after ``verdict``'s)."""
        if verdict is None:
            return
        next_round = verdict.round + 1 if first_round is None else first_round
        while not ends_generation(verdict):
            inbox.raise_failure()
            if verdict.HasField("next_draft_tokens") and verdict.next_draft_tokens == 0:
                verdict = await self.sessions.verify(session, verifier_pb2.DraftBlock(
                    session_id=session.session_id, epoch=session.epoch, round=next_round,
                    base_len=len(session.sequence.committed)))
            elif inbox.queue.empty() and self.sessions.catches_up(session):
                verdict = await self.sessions.catch_up(session, next_round)
            else:
                return
            next_round = verdict.round + 1
            yield verdict
            if verdict.is_stale:
                return

    async def Decode(self, request, context):
        """Target-only generation: rounds with no drafted tokens until the session finishes."""
        session = await self._open(request.session)
        try:
            round_number = 0
            while not session.sequence.is_finished:
                block = verifier_pb2.DraftBlock(
                    session_id=session.session_id, epoch=session.epoch, round=round_number,
                    base_len=len(session.sequence.committed))
                verdict = await self.sessions.verify(session, block)
                if verdict.is_stale:
                    raise StaleEpoch(f"session {session.session_id} was taken over by a newer "
                                     "epoch")
                yield round_from_verdict(verdict, drafted=(), draft_us=0, round_us=0)
                round_number += 1
        finally:
            await self.sessions.close(session)
