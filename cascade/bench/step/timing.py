"""Timing for the engine benchmark (``cascade.bench.step.engine``): calls prepared untimed, the
device fenced on both sides, columns interleaved round by round, failures kept by column, and
progress over every cell."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

Prepare = Callable[[], Callable[[], object]]
"""Sets up one timed call untimed and returns it."""
Sync = Callable[[], None]
"""Waits for the device's queued work before the clock is read (``device.synchronizer``)."""
OnProgress = Callable[[str, int, int], None]
"""``progress(description, done, total)``: what is being measured, out of how many cells."""


def median_ms(prepare: Callable[[], Callable[[], object]], repeats: int,
               sync: Sync = lambda: None) -> tuple[float, float]:
    """``prepare()`` sets up one call untimed and returns it; the first call is a warm-up.
    Returns (median ms of the other ``repeats``, the warm-up's ms)."""
    medians, warm_up = interleaved({"only": prepare}, repeats, sync)
    return medians["only"], warm_up["only"]


def interleaved(prepares: dict[str, Callable[[], Callable[[], object]]], repeats: int,
                 sync: Sync = lambda: None, errors: dict[str, str] | None = None
                 ) -> tuple[dict[str, float], dict[str, float]]:
    """Each column's warm-up call, then ``repeats`` rounds timing one call of every column in
    turn (so a machine that slows down for a while slows every column alike). Returns (median
    ms per column, warm-up ms per column). ``sync`` fences the device on both sides of a call
    (the untimed preparation's work neither counts nor is left queued). Given ``errors``, a
    column that raises is dropped from the results and its error kept there by name."""
    times: dict[str, list[float]] = {name: [] for name in prepares}
    for _ in range(repeats + 1):
        for name in list(times):
            try:
                times[name].append(_timed_ms(prepares[name], sync))
            except Exception as exc:  # noqa: BLE001 - the column stays empty, the run goes on
                if errors is None:
                    raise
                errors.setdefault(name, describe(exc))
                del times[name]
    return ({name: statistics.median(t[1:]) for name, t in times.items()},
            {name: t[0] for name, t in times.items()})


def _timed_ms(prepare: Callable[[], Callable[[], object]], sync: Sync) -> float:
    """Milliseconds of one call that ``prepare()`` set up, the device fenced on both sides."""
    call = prepare()
    sync()
    started = time.perf_counter()
    call()
    sync()
    return 1000 * (time.perf_counter() - started)


def describe(exc: BaseException) -> str:
    """An error in one line: its type and first line."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def set_up(setups: dict[str, Callable[[], Prepare]], errors: dict[str, str]
            ) -> dict[str, Prepare]:
    """Each column's ``prepare`` (its untimed setup run now), but for those whose setup
    raises (their first error kept in ``errors``)."""
    prepares = {}
    for name, setup in setups.items():
        try:
            prepares[name] = setup()
        except Exception as exc:  # noqa: BLE001 - the column stays empty, the run goes on
            errors.setdefault(name, describe(exc))
    return prepares


class Counter:
    """Progress over every cell of the run."""

    def __init__(self, progress: OnProgress, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def note(self, prefix: str) -> Callable[[str], None]:
        """A cell's announcer for descriptions that begin with ``prefix``."""
        def announce(column: str, cells: int = 1) -> None:
            self.progress(f"{prefix}: {column}", self.done, self.total)
            self.done += cells

        return announce
