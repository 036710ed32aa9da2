"""What every fuzz test shares: servers on a background event loop, hypothesis settings for the
CI and the long runs, and the checks every error answer must pass.

The servers under test (grpc.aio, FastAPI) run on one asyncio loop in a thread of their own;
hypothesis drives plain synchronous clients against them, one request per example, so each
example is a real request over loopback and a crashed server shows as a failed follow-up.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SLOW_EXAMPLES_SCALE = 10
"""The long (marked slow) runs send this many times more requests than the CI ones."""

SERVER_FAULTS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
                 grpc.StatusCode.DEADLINE_EXCEEDED}
"""What a malformed request must never produce: an unmapped exception, or a hang."""


def fuzz_settings(max_examples: int) -> settings:
    """Derandomized (the same requests on every run, so CI is stable), no deadline (the
    machine is shared), no example database (no state between runs)."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=True)


def run_fuzz(strategy: st.SearchStrategy, check: Callable[[Any], None],
             max_examples: int) -> int:
    """Runs ``check`` on examples of ``strategy``; returns how many requests were sent."""
    sent = [0]

    @fuzz_settings(max_examples)
    @given(strategy)
    def fuzz(example: Any) -> None:
        sent[0] += 1
        check(example)

    fuzz()
    return sent[0]


class BackgroundLoop:
    """An asyncio event loop on its own thread, for servers that synchronous clients call."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine, timeout: float = 60.0) -> Any:
        """Runs ``coroutine`` on the loop and waits for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def assert_names_a_field(details: str, fields: re.Pattern) -> None:
    """An INVALID_ARGUMENT's details start with (or quote) the path of the field at fault."""
    assert fields.search(details), f"the error names no field: {details!r}"


def field_pattern(*names: str) -> re.Pattern:
    """Matches a message naming one of ``names`` as a path (``proposals[2].probs: ...``) or in
    quotes (``Invalid value for 'top_p'``)."""
    alternatives = "|".join(re.escape(name) for name in names)
    return re.compile(rf"^(?:{alternatives})(?:\[\d+\])?(?:\.\w+)*:|'(?:{alternatives})\b")
