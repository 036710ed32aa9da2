"""A run's progress reaches a log that is not a terminal: one plain line per update (rate
limited), with the share done and the time left."""

import io

from rich.console import Console

from cascade.distill.progress import RunProgress


def test_a_log_file_gets_plain_lines_with_the_time_left():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with RunProgress(budget_s=600, done_s=60, console=console, every_s=0) as progress:
        progress.update(150, "agreement 0.40")
        progress.update(600, "agreement 0.45")
    lines = out.getvalue().splitlines()
    assert lines == ["25% 0:02:30 done, 0:07:30 left: agreement 0.40",
                     "100% 0:10:00 done, 0:00:00 left: agreement 0.45"]


def test_lines_are_rate_limited_but_the_last_one_is_always_written():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with RunProgress(budget_s=100, console=console, every_s=3600) as progress:
        for done in (10, 20, 30, 100):
            progress.update(done, f"at {done}")
    assert [line.split(": ")[-1] for line in out.getvalue().splitlines()] == ["at 10", "at 100"]
