"""Resuming a stream on any gateway: ``GET /v1/sessions/{session_id}/events`` with the standard
``Last-Event-ID`` header (``<session id>.<round>``, the id of the last event received) or
``?after=<round>``. The reply is the rest of the same response: the same chunk shapes, response
id and options, starting right after that round; the session continues on this gateway if its
own gateway died (gateway.sessions.orchestrator, ``resume``).
"""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.responses import Response

from cascade.protocol.limits import shortened
from gateway.openai import echo, responses
from gateway.auth import ApiKeys
from gateway.openai.errors import APIError, bad_request
from gateway.openai.events import StreamView, events
from gateway.limits import KeyLimits
from gateway.sessions.session_store import SessionLost
from gateway.openai.streaming import EventStreamResponse, text_deltas


def resume_after(session_id: str, last_event_id: str | None, after: int | None) -> int:
    """The last round the client has (0: none), from Last-Event-ID or ``after``."""
    if last_event_id:
        sid, _, number = last_event_id.strip().rpartition(".")
        if sid != session_id or not (number.isascii() and number.isdigit()):  # not '²', '١'
            raise bad_request(f"Invalid Last-Event-ID {shortened(last_event_id)!r}: "
                              f"expected '{shortened(session_id)}.<round>' as sent in the stream's id: lines.",
                              param="Last-Event-ID")
        return int(number)
    if after is not None and after < 0:
        raise bad_request("Invalid 'after': a round number, 0 or more.", param="after")
    return after or 0


def install_resume(app: FastAPI, tokenizer, generator, keys: ApiKeys, limits: KeyLimits) -> None:
    """The resume route: only the key that started a session may resume it (others get the
    404 an unknown id gets), and a resumed stream holds one of that key's session slots."""

    @app.get("/v1/sessions/{session_id}/events")
    async def resume_events(session_id: str, http: Request, after: int | None = None) -> Response:
        seen = resume_after(session_id, http.headers.get("last-event-id"), after)
        if not hasattr(generator, "resume"):
            raise APIError(501, "This gateway cannot resume sessions.", type="server_error")
        caller = keys.identity(http.headers.get("authorization"))
        slot = limits.reserve(caller)
        try:
            view, chunks = await _stored_stream(generator, session_id, caller, seen)
        except BaseException:
            slot.release()
            raise
        deltas = echo.resumed(text_deltas(limits.counted(slot, chunks), tokenizer, view.stop,
                                          view.rounds, seen_rounds=seen), view, seen, tokenizer)
        return EventStreamResponse(events(view, deltas, resumed=seen > 0), on_close=slot.release)


async def _stored_stream(generator, session_id: str, caller: str, seen: int):
    """(its stream view, its chunk stream) of an HTTP session ``caller`` started, whose client
    has ``seen`` rounds."""
    try:
        request, chunks = await generator.resume(session_id, caller, seen)
    except SessionLost as exc:
        raise APIError(404, str(exc), param="session_id", code="session_not_found") from exc
    if json.loads(request.view or "{}").get("kind") not in responses.FORMATS:
        await chunks.aclose()
        raise APIError(409, f"Session {session_id} was not started through the HTTP API; "
                       "resume it with the gRPC Resume call.", code="not_an_http_session")
    return StreamView.from_json(request.view), chunks
