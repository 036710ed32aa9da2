"""The gateway's flags are its settings class's fields, declared once."""

import typer
from typer.testing import CliRunner

from cascade.serving.settings_cli import flat_fields
from gateway.__main__ import cli
from gateway.settings import GatewaySettings


def test_every_setting_is_a_flag_with_its_help_default_and_environment_variable():
    params = {p.name: p for p in typer.main.get_command(cli).params}
    fields = dict(flat_fields(GatewaySettings))
    assert set(params) == set(fields) and "tls_dir" in params  # the mesh block's flags too
    for name, field in fields.items():
        option = params[name]
        assert option.help == field.description and option.help, name
        assert option.required == field.is_required(), name
        extra = field.json_schema_extra or {}
        assert option.envvar == extra.get("env"), name
    assert params["playground"].secondary_opts == ["--no-playground"]
    assert params["finished_session_ttl_s"].max == 3600  # bounds reach the flag


def test_a_value_the_settings_refuse_is_a_usage_error_naming_its_flag():
    runner = CliRunner()
    base = ["--model", ".", "--redis-url", "redis://127.0.0.1:1", "--allow-open"]
    for extra, words in ((["--round-timeout-s", "0"], "--round-timeout-s"),
                         (["--draft-method", "guess"], "--draft-method"),
                         (["--grpc-port", "70000"], "--grpc-port")):
        result = runner.invoke(cli, base + extra)
        assert result.exit_code == 2 and words in result.output, result.output
        assert "Traceback" not in result.output


def test_settings_built_by_name_derive_the_orchestrators_and_the_keys():
    settings = GatewaySettings(model="m", redis_url="redis://r", api_keys=" a, b ,,",
                               round_timeout_s=7.0, prefix_sharing="shared")
    assert settings.keys == ("a", "b")
    orchestration = settings.orchestrator("served")
    assert (orchestration.round_timeout_s, orchestration.model_name) == (7.0, "served")
    assert orchestration.prefix_sharing.value == "shared"
