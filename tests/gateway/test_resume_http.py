"""The resume endpoint's contract at the HTTP layer (the whole path, with a gateway killed, is
in tests/e2e/test_resume.py): ids on round events, the rest of the stream after Last-Event-ID,
and clear errors for a bad id, an unknown session, or a gRPC session."""

import json

import httpx

from cascade.protocol.request.mapping import GenerationRequest
from cascade.protocol.settings import FinishReason, SamplingParams
from gateway.sessions.generation import GeneratedChunk
from gateway.http_app import create_app
from gateway.settings import HttpSettings
from gateway.sessions.session_store import SessionLost
from http_fixtures import MODEL, SETTINGS


class Stored:
    """A generator whose one session has three stored rounds (resume replays them)."""

    def __init__(self, tokenizer, view: str) -> None:
        ids = tokenizer("one two three four five six").input_ids
        self.rounds = [ids[:2], ids[2:4], ids[4:]]
        self.view = view

    async def resume(self, session_id, caller, after_round=0):
        if session_id != "s1" or caller != "anonymous":
            raise SessionLost(f"no session {session_id!r}")
        request = GenerationRequest([1, 2], SamplingParams(max_new_tokens=8), view=self.view)
        return request, self._chunks()

    async def _chunks(self):
        for i, ids in enumerate(self.rounds, start=1):
            finish = FinishReason.LENGTH if i == len(self.rounds) else None
            yield GeneratedChunk("s1", ids, finish, round=i, is_replayed=True)


def view() -> str:
    return json.dumps({"kind": "completion", "meta": {"id": "cmpl-x", "created": 1, "model": MODEL},
                       "stop": [], "include_usage": False, "rounds": False,
                       "usage": {"num_prompt": 2, "is_cascade": False}})


async def get(tokenizer, generator, path: str, **headers) -> httpx.Response:
    transport = httpx.ASGITransport(app=create_app(SETTINGS, tokenizer, generator))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        return await http.get(path, headers=headers)


async def test_resuming_after_a_round_sends_exactly_the_rest(tokenizer):
    stored = Stored(tokenizer, view())
    whole = await get(tokenizer, stored, "/v1/sessions/s1/events")
    ids = [line[4:] for line in whole.text.split("\n") if line.startswith("id: ")]
    assert ids == ["s1.1", "s1.2", "s1.3"]
    rest = await get(tokenizer, stored, "/v1/sessions/s1/events", **{"Last-Event-ID": "s1.1"})
    texts = [json.loads(line[6:])["choices"][0]["text"] for line in rest.text.split("\n")
             if line.startswith("data: {")]
    assert "".join(texts) == tokenizer.decode(stored.rounds[1] + stored.rounds[2])
    assert all(json.loads(line[6:])["id"] == "cmpl-x" for line in rest.text.split("\n")
               if line.startswith("data: {"))
    assert rest.text.endswith("data: [DONE]\n\n")


async def test_bad_ids_unknown_sessions_and_grpc_sessions_get_clear_errors(tokenizer):
    stored = Stored(tokenizer, view())
    bad = await get(tokenizer, stored, "/v1/sessions/s1/events", **{"Last-Event-ID": "s2.1"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "Last-Event-ID"
    unknown = await get(tokenizer, stored, "/v1/sessions/nope/events")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "session_not_found"
    grpc_made = Stored(tokenizer, json.dumps({"kind": "grpc", "stop": []}))
    other = await get(tokenizer, grpc_made, "/v1/sessions/s1/events")
    assert other.status_code == 409 and "Resume" in other.json()["error"]["message"]
    negative = await get(tokenizer, stored, "/v1/sessions/s1/events?after=-1")
    assert negative.status_code == 400


async def test_resuming_after_the_final_round_sends_nothing_twice(tokenizer):
    """A client whose stream broke after the final event, before [DONE], resumes with the last
    id: it gets the end marker and no text it already has."""
    stored = Stored(tokenizer, view())
    rest = await get(tokenizer, stored, "/v1/sessions/s1/events", **{"Last-Event-ID": "s1.3"})
    assert rest.status_code == 200
    assert [line for line in rest.text.split("\n") if line] == ["data: [DONE]"]


class Recorded:
    """Stands for the orchestrator: generates scripted rounds (each with its event id) and
    resumes that session as it does, every stored round again, with the request it stored."""

    def __init__(self, rounds: list[list[int]], finish: FinishReason) -> None:
        self.rounds, self.finish, self.request = rounds, finish, None

    async def generate(self, request):
        self.request = request
        for chunk in self._chunks(is_replayed=False):
            yield chunk

    async def resume(self, session_id, caller, after_round=0):
        if session_id != "s1" or self.request is None:
            raise SessionLost(f"no session {session_id!r}")
        return self.request, self._replayed()

    async def _replayed(self):
        for chunk in self._chunks(is_replayed=True):
            yield chunk

    def _chunks(self, is_replayed: bool) -> list[GeneratedChunk]:
        last = len(self.rounds)
        return [GeneratedChunk("s1", ids, self.finish if i == last else None, round=i,
                               is_replayed=is_replayed)
                for i, ids in enumerate(self.rounds, start=1)]


def sse_events(text: str) -> list[str]:
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    return text.split("\n\n")[:-1]


async def assert_every_resume_is_the_rest(tokenizer, generator, path: str, body: dict) -> None:
    """Resumed from the start or after any event id, the stream is exactly the rest of the
    original one (the same events, then [DONE])."""
    settings = HttpSettings(model_name=MODEL, context_length=4096, max_tokens_limit=32)
    transport = httpx.ASGITransport(app=create_app(settings, tokenizer, generator))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        original = sse_events((await http.post(path, json={**body, "stream": True})).text)
        ids = [event.split("\n")[0][4:] for event in original if event.startswith("id: ")]
        assert ids, original
        for seen in [None, *ids]:
            headers = {} if seen is None else {"Last-Event-ID": seen}
            resumed = await http.get("/v1/sessions/s1/events", headers=headers)
            assert resumed.status_code == 200, (seen, resumed.text)
            rest = original if seen is None else original[
                next(i for i, e in enumerate(original) if e.startswith(f"id: {seen}\n")) + 1:]
            assert sse_events(resumed.text) == rest, seen


async def test_resuming_a_finished_tool_call_stream_sends_the_rest(tokenizer):
    """A tool call is streamed whole with the last round's id: resumed after it, only [DONE]
    is left (EventSource reconnects after every complete stream)."""
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    ids = tokenizer(call).input_ids + [tokenizer.eos_token_id]
    generator = Recorded([ids[:5], ids[5:12], ids[12:]], FinishReason.STOP)
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    await assert_every_resume_is_the_rest(tokenizer, generator, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [weather], "max_tokens": 32})


async def test_a_resumed_echo_stream_is_the_rest_of_the_original(tokenizer):
    """The prompt comes first, as in the original; with max_tokens 0 the one generated token
    stays hidden."""
    ids = tokenizer(" and more words").input_ids
    for max_tokens, rounds in ((8, [ids[:2], ids[2:]]), (0, [ids[:1]])):
        generator = Recorded(rounds, FinishReason.LENGTH)
        await assert_every_resume_is_the_rest(tokenizer, generator, "/v1/completions", {
            "model": MODEL, "prompt": "Hello  there", "echo": True, "max_tokens": max_tokens,
            "stream_options": {"include_usage": True}})
