"""Thin gRPC servicer over the SessionTable: a Verify stream per session, pumped through
``cascade.session.VerifierSession`` (``VerifyPump`` performs its actions, ``Inbox`` reads the
requests); Decode for target-only generation."""

from __future__ import annotations

import asyncio

from cascade.pod.messages import round_from_verdict
from cascade.session import actions as act
from cascade.session import events as ev
from cascade.session.verifier import VerifierSession
from cascade.serving.errors import StaleEpoch
from cascade.serving.mesh.security import OPEN, MeshSecurity
from cascade.v1 import verifier_pb2, verifier_pb2_grpc
from verifier_service.sessions import OpenSession, SessionTable


class Inbox:
    """A Verify stream's requests, read by a task of their own: shadow blocks and draft-ready
    notes are handed to ``on_aside`` as they arrive (also while the verifier decodes the session
    alone and reads nothing else); opens and blocks queue, in order, for ``next``. A
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

    async def next(self) -> verifier_pb2.VerifyRequest | None:
        """The next open or block (None: the stream ended)."""
        request = await self.queue.get()
        if request is None:
            self.raise_failure()
        return request

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    def close(self) -> None:
        self.task.cancel()


class VerifyPump:
    def __init__(self, sessions, open_session, machine: VerifierSession) -> None:
        """``open_session``: checks an open and admits it (the servicer's ``_open``)."""
        self.sessions, self.open_session, self.machine = sessions, open_session, machine
        self.session: OpenSession | None = None
        """The table's session, once admitted."""

    @property
    def admitted(self) -> OpenSession:
        """The admitted session (the machine asks for no other action before ``Admit``)."""
        if self.session is None:
            raise RuntimeError("no session admitted on this stream yet")
        return self.session

    async def perform(self, action, inbox):
        """Do ``action``; returns the event it answers with (None: none)."""
        match action:
            case act.Read():
                request = await inbox.next()
                return ev.Ended() if request is None else ev.classify_request(request)
            case act.Admit(msg):
                self.session = await self.open_session(msg)
                return ev.Admitted()
            case act.Plan():
                return ev.Planned(self.sessions.plan_reply(self.admitted))
            case act.Verify(block):
                return await self._verify(block)
            case act.DecodeAlone(round_number):
                inbox.raise_failure()
                return ev.Verified(await self.sessions.verify(
                    self.admitted, self.admitted.undrafted(round_number)))
            case act.CatchUp(round_number):
                inbox.raise_failure()
                if not inbox.queue.empty() or not self.sessions.catches_up(self.admitted):
                    return ev.Idle()
                return ev.Verified(await self.sessions.catch_up(self.admitted, round_number))
            case act.Fail(reason):
                raise ValueError(reason)
        raise TypeError(f"no such action: {action!r}")

    def aside(self, request: verifier_pb2.VerifyRequest) -> None:
        """A shadow block or ready note, read as it comes (the inbox's task)."""
        for action in self.machine.on(ev.classify_request(request)):
            match action:
                case act.Score(msg):
                    self.sessions.shadow(self.admitted, msg)
                case act.NoteReady(msg):
                    self.sessions.ready(self.admitted, msg)
                case act.Fail(reason):
                    raise ValueError(reason)

    async def _verify(self, block: verifier_pb2.DraftBlock) -> ev.Verified:
        """The block's verdict; a dropped block (None) while the session catches up goes on
        from the verdict that asked for it."""
        verdict = await self.sessions.verify(self.admitted, block)
        if verdict is None and self.sessions.awaits_block(self.admitted):
            return ev.Verified(self.admitted.last_verdict, new=False)
        return ev.Verified(verdict)


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    def __init__(self, sessions: SessionTable, mesh: MeshSecurity = OPEN) -> None:
        self.sessions, self.mesh = sessions, mesh

    async def _open(self, msg: verifier_pb2.SessionOpen):
        """Only a session a gateway tagged (with a session key set), then the table's open."""
        self.mesh.check_owner_tag(msg.session_id, msg.epoch, msg.owner_tag)
        return await self.sessions.open(msg)

    async def Verify(self, request_iterator, context):
        """The pump around ``cascade.session.VerifierSession``: requests read (shadows and
        ready notes beside the rest, ``Inbox``), the machine's actions performed, replies
        yielded, until the drafter closes its side."""
        pump = VerifyPump(self.sessions, self._open, VerifierSession())
        inbox = Inbox(request_iterator, pump.aside)
        try:
            actions = pump.machine.start()
            while actions:
                answers = []
                for action in actions:
                    if isinstance(action, act.Reply):
                        yield action.msg
                    elif isinstance(action, act.ReplyFeatures):
                        for reply in await self.sessions.open_replies(pump.admitted):
                            yield reply
                    elif (answer := await pump.perform(action, inbox)) is not None:
                        answers.append(answer)
                actions = [then for answer in answers for then in pump.machine.on(answer)]
        finally:
            inbox.close()
            if pump.session is not None:
                await self.sessions.close(pump.session)

    async def Decode(self, request, context):
        """Target-only generation: rounds with no drafted tokens until the session finishes."""
        session = await self._open(request.session)
        try:
            round_number = 0
            while not session.sequence.is_finished:
                verdict = await self.sessions.verify(session, session.undrafted(round_number))
                if verdict.is_stale:
                    raise StaleEpoch(f"session {session.session_id} was taken over by a newer "
                                     "epoch")
                yield round_from_verdict(verdict, drafted=(), draft_us=0, round_us=0)
                round_number += 1
        finally:
            await self.sessions.close(session)
