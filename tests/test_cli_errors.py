"""The command line's mistakes end in one line saying what to fix, not a traceback, and before
anything starts."""

import socket

from typer.testing import CliRunner

from cascade.cli.main import app

RUNNER = CliRunner()


def test_a_bad_dtype_is_refused_before_anything_starts():
    result = RUNNER.invoke(app, ["up", "--dtype", "float64"])
    assert result.exit_code == 2
    assert "--dtype: must be one of auto, float32, bfloat16, float16" in result.output


def test_a_port_in_use_is_named_with_what_to_do():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = RUNNER.invoke(app, ["demo", "--port", str(port)])
    assert result.exit_code == 2
    assert f"--port {port} is in use" in result.output and "--port 0" in result.output


def test_generate_without_a_gateway_says_so_in_one_line():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening
    result = RUNNER.invoke(app, ["generate", "hi", "--gateway", address, "--no-baseline"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "error:" in result.output and "UNAVAILABLE" in result.output
    assert "cascade up" in result.output


def test_a_missing_model_folder_is_named_by_every_command(tmp_path):
    """Not transformers' complaint about hub repository names, from deep in a traceback."""
    from gateway.__main__ import cli as gateway_cli
    from verifier_service.__main__ import cli as verifier_cli

    missing = str(tmp_path / "no-such-model")
    for cli, args in ((app, ["models", "evaluate", "--target", missing, "--drafter", missing]),
                      (app, ["bench", "compare", "--target", missing]),
                      (app, ["bench", "engine", "--target", missing]),
                      (app, ["bench", "rtt", "--target", missing]),
                      (gateway_cli, ["--model", missing, "--redis-url", "redis://127.0.0.1:1",
                                     "--allow-open"]),
                      (verifier_cli, ["--model", missing, "--allow-open"])):
        result = RUNNER.invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output and missing in result.output, result.output


def test_a_target_that_does_not_split_is_refused_before_any_rank_starts(tiny_pair_dirs):
    """The tiny target has 4 heads: 3 ranks cannot split it; the verifier and `cascade up`
    say so (and what divides) before starting anything."""
    from verifier_service.__main__ import cli as verifier_cli

    target, drafter = tiny_pair_dirs
    for cli, args in ((verifier_cli, ["--model", str(target), "--allow-open",
                                      "--tensor-parallel", "3"]),
                      (app, ["up", "--target", str(target), "--drafter", str(drafter),
                             "--tensor-parallel", "3"])):
        result = RUNNER.invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)
        assert "4 attention heads and 4 key/value heads: --tensor-parallel 3 must divide " \
               "both" in " ".join(result.output.split()), result.output
