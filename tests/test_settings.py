"""Every service's flags are its settings class's fields, declared once: the command lines are
generated from the classes, and the deployment guide names only flags they have."""

import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cascade.cli.main import app
from cascade.cli.up import UpSettings
from cascade.serving.settings_cli import flag, flat_fields
from drafter_service.__main__ import cli as drafter_cli
from drafter_service.settings import DrafterPodSettings
from gateway.__main__ import cli as gateway_cli
from cascade.serving.mesh.security import MeshSettings
from gateway.settings import GatewaySettings
from verifier_service.__main__ import cli as verifier_cli
from verifier_service.settings import VerifierPodSettings

ROOT = Path(__file__).resolve().parent.parent
SERVICES = [(gateway_cli, GatewaySettings), (drafter_cli, DrafterPodSettings),
            (verifier_cli, VerifierPodSettings)]
COMMANDS = SERVICES + [(app, UpSettings)]
OTHER_TOOLS = {"--build-arg", "--requirepass"}
"""Flags docs/deploy.md gives to docker and redis-server."""


def _params(cli) -> dict:
    command = typer.main.get_command(cli)
    command = command.commands["up"] if cli is app else command
    return {p.name: p for p in command.params}


@pytest.mark.parametrize("cli, settings", COMMANDS, ids=["gateway", "drafter", "verifier", "up"])
def test_every_setting_is_a_flag_with_its_help_default_and_environment_variable(cli, settings):
    params = _params(cli)
    fields = dict(flat_fields(settings))
    assert set(params) == set(fields)
    assert cli is app or "tls_dir" in params  # the services' shared mesh block
    for name, field in fields.items():
        option = params[name]
        assert option.help == field.description and option.help, name
        assert option.required == field.is_required(), name
        assert option.envvar == (field.json_schema_extra or {}).get("env"), name
        assert option.opts == [flag(name)], name
    assert all(p.secondary_opts == ["--no-" + p.opts[0][2:]] for p in params.values()
               if p.is_bool_flag)


def test_bounds_reach_the_flags():
    params = {p.name: p for p in typer.main.get_command(gateway_cli).params}
    assert params["finished_session_ttl_s"].max == 3600
    params = {p.name: p for p in typer.main.get_command(verifier_cli).params}
    assert (params["max_kv_share"].min, params["max_kv_share"].max) == (0.01, 1.0)


def test_a_value_the_settings_refuse_is_a_usage_error_naming_its_flag():
    runner = CliRunner()
    cases = ((gateway_cli, ["--redis-url", "redis://127.0.0.1:1", "--round-timeout-s", "0"],
              "--round-timeout-s"),
             (gateway_cli, ["--redis-url", "redis://127.0.0.1:1", "--draft-method", "guess"],
              "--draft-method"),
             (gateway_cli, ["--redis-url", "redis://127.0.0.1:1", "--grpc-port", "70000"],
              "--grpc-port"),
             (verifier_cli, ["--compile", "maybe"], "--compile"),
             (drafter_cli, ["--speculate-fanout", "0"], "--speculate-fanout"))
    for cli, extra, named in cases:
        result = runner.invoke(cli, ["--model", ".", "--allow-open", *extra])
        assert result.exit_code == 2 and named in result.output, result.output
        assert "Traceback" not in result.output


def test_the_deployment_guide_names_only_flags_the_services_have():
    flags = {flag(name) for _, settings in COMMANDS for name, _ in flat_fields(settings)}
    flags |= {"--no-" + f[2:] for f in flags}
    named = set(re.findall(r"`(--[a-z0-9-]+)", (ROOT / "docs" / "deploy.md").read_text()))
    assert named - OTHER_TOOLS <= flags, named - OTHER_TOOLS - flags


def test_settings_built_by_name_derive_what_the_services_run_with():
    gateway = GatewaySettings(model="m", mesh=MeshSettings(redis_url="redis://r"),
                              api_keys=" a, b ,,", round_timeout_s=7.0, prefix_sharing="shared")
    assert gateway.keys == ("a", "b")
    orchestration = gateway.orchestrator("served")
    assert (orchestration.round_timeout_s, orchestration.model_name) == (7.0, "served")
    assert orchestration.prefix_sharing.value == "shared"
    verifier = VerifierPodSettings(model="m", kv_tokens=0, max_kv_share=0.5).verifier()
    assert (verifier.kv_tokens, verifier.max_kv_share) == (None, 0.5)
    drafter = DrafterPodSettings(model="m", speculate="cache", send_ahead=3)
    assert (drafter.speculation().mode.value, drafter.speculation().send_ahead) == ("cache", 3)


def test_cascade_up_passes_the_services_settings_it_takes_by_their_flags(tmp_path):
    """``cascade up``'s fields that are a service's are passed on as that service's flags,
    only where they differ from the service's default."""
    up = UpSettings(port=0, grpc_port=0, invariant=False, compile="auto",
                    speculation_memory="shared", workdir=tmp_path)
    cluster = up.cluster(tmp_path, tmp_path)
    assert cluster.gateway_args == ("--speculation-memory", "shared")
    assert cluster.verifier_args == ("--no-invariant", "--compile", "auto")
    assert UpSettings(port=0, grpc_port=0).cluster(tmp_path, tmp_path).verifier_args == ()


def test_the_flags_reference_is_current():
    from cascade.cli.flags_doc import PAGE, page

    assert PAGE.read_text() == page(), "run python -m cascade.cli.flags_doc"
