"""Every benchmark is a ``cascade bench`` subcommand generated from its settings class: each
flag documented, each bad value a usage error naming what to fix (no benchmark runs here)."""

import pytest
from typer.testing import CliRunner

from cascade.cli.bench import BENCHES
from cascade.cli.main import app
from cascade.serving.settings_cli import flag, flat_fields

RUNNER = CliRunner()


@pytest.mark.parametrize("name, settings, run", BENCHES, ids=[b[0] for b in BENCHES])
def test_every_flag_is_documented_in_the_commands_help(name, settings, run):
    assert settings.__doc__ and run.__doc__, name
    result = RUNNER.invoke(app, ["bench", name, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for field_name, field in flat_fields(settings):
        assert field.description, (name, field_name)
        assert flag(field_name) in text, (name, field_name)


@pytest.mark.parametrize("args, says", [
    (["compare", "--k", "99"], "less than or equal to 32"),
    (["load", "--only", "nonsense"], "unknown modes ['nonsense']"),
    (["cascades", "--alpha", "2"], "--alpha must be in [0, 1]"),
    (["rtt", "--modes", "sideways"], "'off', 'cache' or 'ahead'"),
    (["engine", "--rows", "1,x"], "--rows"),
])
def test_a_bad_value_is_a_usage_error_that_says_what_to_fix(args, says):
    result = RUNNER.invoke(app, ["bench", *args], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split()), result.output
