"""Malformed resume requests against the gateway: ``GET /v1/sessions/{id}/events`` with wild
session ids, ``Last-Event-ID`` headers (any bytes a header can carry) and ``after`` values, and
the gRPC ``Resume`` call with wild session ids and rounds. Never a 5xx or a server fault; every
4xx is OpenAI's error shape naming the field at fault; a refused request never reaches the
generator; a valid one is answered with the rest of the stream."""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import quote

import grpc
import httpx
import pytest
from hypothesis import strategies as st

from cascade.protocol.request.mapping import GenerationRequest
from cascade.protocol.settings import FinishReason, SamplingParams
from cascade.v1 import gateway_pb2
from gateway.sessions.generation import GeneratedChunk
from gateway.http_app import create_app
from gateway.sessions.session_store import SessionLost
from gateway_requests import HTTP_SETTINGS, MODEL, GatewayApi
from harness import SERVER_FAULTS, BackgroundLoop, run_fuzz

SESSION = "s1"
ROUNDS = 3
EXAMPLES = 300

WILD_TEXT = st.one_of(st.text(max_size=24), st.sampled_from(
    ["", " ", "s1", "s1.", ".1", "s1.-1", "s1.1.2", "s1.²", "s1.١", "s1.0x1", "s1. 1",
     "s1.99999999999999999999999", "s2.1", "\x00", "s1.1\x00"]))
HEADER_BYTES = st.one_of(WILD_TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")),
                         WILD_TEXT.map(lambda t: t.encode("latin-1", "replace")),
                         st.binary(max_size=24))
AFTER_VALUES = st.one_of(st.integers(min_value=-5, max_value=10 ** 30).map(str), WILD_TEXT)


class StoredSession:
    """Stands for the orchestrator: one resumable HTTP session of ``ROUNDS`` rounds; records
    every session it is asked to resume."""

    def __init__(self, tokenizer, kind: str = "completion") -> None:
        self.ids = tokenizer("one two three four five six").input_ids
        self.kind, self.asked = kind, []

    async def resume(self, session_id: str, caller: str, after_round: int = 0):
        self.asked.append(session_id)
        if session_id != SESSION:
            raise SessionLost(f"Session {session_id!r} is unknown or expired.")
        view = {"kind": self.kind, "meta": {"id": "cmpl-x", "created": 1, "model": MODEL},
                "stop": [], "include_usage": False, "rounds": False,
                "usage": {"num_prompt": 2, "is_cascade": False}}
        request = GenerationRequest([1, 2], SamplingParams(max_new_tokens=8),
                                    view=json.dumps(view))
        return request, self._chunks()

    async def _chunks(self):
        for number in range(1, ROUNDS + 1):
            finish = FinishReason.LENGTH if number == ROUNDS else None
            yield GeneratedChunk(SESSION, self.ids[number - 1 : number], finish,
                                 round=number)


@dataclass
class HttpResume:
    session_id: str
    last_event_id: bytes | None
    after: str | None

    def path(self) -> str:
        query = "" if self.after is None else f"?after={quote(self.after, safe='')}"
        return f"/v1/sessions/{quote(self.session_id, safe='')}/events{query}"

    def is_valid(self) -> bool:
        """Whether the gateway must answer with the stream: the session is known and the
        rounds named are plain numbers (``after`` may also parse in other spellings)."""
        if self.session_id != SESSION or not (self.after is None or _is_number(self.after)):
            return False
        if not self.last_event_id:
            return True
        session, _, number = self.last_event_id.decode("latin-1").strip().rpartition(".")
        return session == SESSION and _is_number(number)


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


http_resumes = st.builds(HttpResume, st.one_of(st.just(SESSION), WILD_TEXT.filter(bool)),
                         st.one_of(st.none(), st.just(b"s1.1"), HEADER_BYTES),
                         st.one_of(st.none(), st.just("2"), AFTER_VALUES))


async def _get(app, resume: HttpResume) -> httpx.Response:
    headers = [] if resume.last_event_id is None else [(b"last-event-id", resume.last_event_id)]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        return await http.get(resume.path(), headers=headers)


def check_http(background: BackgroundLoop, app, generator: StoredSession,
               resume: HttpResume) -> None:
    asked = len(generator.asked)
    try:
        response = background.run(_get(app, resume))
    except (httpx.InvalidURL, httpx.LocalProtocolError):
        return  # the client itself refuses to send it (a header with CR/LF, say)
    assert response.status_code < 500, (response.status_code, response.text[:300], resume)
    if response.status_code == 200:
        assert len(generator.asked) == asked + 1, resume
        assert response.text.endswith("data: [DONE]\n\n"), response.text[-200:]
        return
    assert not resume.is_valid(), (response.status_code, response.text[:300], resume)
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"], error
    if response.status_code in (400, 422):
        assert len(generator.asked) == asked, "a refused request reached the generator"
        assert error.get("param") in ("Last-Event-ID", "after"), error


@pytest.fixture(scope="module")
def background():
    loop = BackgroundLoop()
    yield loop
    loop.close()


def test_http_resume_refuses_wild_ids_and_rounds_by_name(tokenizer, background):
    generator = StoredSession(tokenizer)
    app = create_app(HTTP_SETTINGS, tokenizer, generator)
    sent = run_fuzz(http_resumes, lambda r: check_http(background, app, generator, r), EXAMPLES)
    assert sent == EXAMPLES


grpc_resumes = st.builds(gateway_pb2.ResumeRequest,
                         session_id=st.one_of(st.just(SESSION), WILD_TEXT),
                         after_round=st.one_of(st.integers(0, ROUNDS + 1),
                                               st.integers(0, 2 ** 32 - 1)))


def check_grpc(api: GatewayApi, request) -> None:
    try:
        replies = list(api.stub.Resume(request, timeout=30.0))
    except grpc.RpcError as error:
        assert error.code() not in SERVER_FAULTS, (error.code(), error.details(), request)
        assert request.session_id != SESSION, f"a known session was refused: {error.details()}"
        expected = (grpc.StatusCode.NOT_FOUND if request.session_id
                    else grpc.StatusCode.INVALID_ARGUMENT)
        assert error.code() == expected, (error.code(), error.details())
        assert error.details().startswith("Invalid 'session_id'" if not request.session_id
                                          else "session_id: "), error.details()
        return
    assert request.session_id == SESSION, request
    rounds = [reply.round for reply in replies]
    assert rounds == [r for r in range(1, ROUNDS + 1) if r > request.after_round]  # none twice


def test_grpc_resume_refuses_wild_sessions_and_skips_seen_rounds(tokenizer):
    api = GatewayApi(tokenizer, StoredSession(tokenizer, kind="grpc"))
    try:
        assert run_fuzz(grpc_resumes, lambda r: check_grpc(api, r), EXAMPLES) == EXAMPLES
    finally:
        api.close()
