"""Progress of a time-budgeted training run: a live bar with the time left on a terminal;
elsewhere (a log file, a pod's log, ``nohup``) a plain line per update, at most one every
``every_s`` seconds, since a live bar shows nothing there until the run ends."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn


class RunProgress:
    def __init__(self, budget_s: float, done_s: float = 0.0, console: Console | None = None,
                 every_s: float = 30.0) -> None:
        self.budget_s, self.done_s, self.every_s = budget_s, done_s, every_s
        self.console = console or Console()
        self.bar: Progress | None = None
        self.last_line = float("-inf")

    def __enter__(self) -> RunProgress:
        if self.console.is_terminal:
            columns = [TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn()]
            self.bar = Progress(*columns, console=self.console)
            self.bar.start()
            self.task = self.bar.add_task("distilling", total=self.budget_s,
                                          completed=self.done_s)
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

    def update(self, done_s: float, description: str) -> None:
        self.done_s = done_s
        if self.bar is not None:
            self.bar.update(self.task, completed=done_s, description=description)
            return
        finished = done_s >= self.budget_s
        if finished or time.monotonic() - self.last_line >= self.every_s:
            self.last_line = time.monotonic()
            self.console.print(self.line(description), soft_wrap=True, highlight=False)

    def line(self, description: str) -> str:
        share = min(1.0, self.done_s / self.budget_s) if self.budget_s else 1.0
        left = max(0.0, self.budget_s - self.done_s)
        return (f"{share:.0%} {_clock(self.done_s)} done, {_clock(left)} left: "
                f"{description}")


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"
