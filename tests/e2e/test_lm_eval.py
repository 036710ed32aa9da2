"""lm-evaluation-harness against a real local cluster (the SmolLM2 pair, every service its own
process, as `cascade up` runs them): lm-eval's `local-completions` model on the gateway's
/v1/completions with the `remote` tokenizer (the gateway's /tokenize, no model folder on the
client), on the two local tasks of docs/lm-eval/ (a multiple-choice task: log-likelihoods from
echo; a generate_until task). Every answer must be the gateway's own for the same request."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed: "
                                      "pip install -e '.[eval]'")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("lm_eval_check",
                                              ROOT / "scripts" / "lm_eval_check.py")
lm_eval_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lm_eval_check)


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory):
    from cascade.tools.local_cluster import LocalCluster
    from cascade.tools.cluster_config import ClusterConfig
    from cascade.tools.pairs import default_pair

    target, drafter = default_pair(None, None, "smollm2")
    config = ClusterConfig(target, drafter, http_port=0, grpc_port=0,
                           workdir=tmp_path_factory.mktemp("cluster"))
    cluster = LocalCluster(config).start()
    try:
        yield cluster.http_url
    finally:
        cluster.stop()


def lm_eval(gateway_url: str, model: str, out: Path) -> subprocess.CompletedProcess:
    """The README's command, run where it is run (the repository root: the tasks' data paths
    are relative to it), with no hub to reach."""
    model_args = f"model={model},base_url={gateway_url}/v1/completions,tokenizer_backend=remote"
    command = [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions",
               "--model_args", model_args, "--include_path", "docs/lm-eval",
               "--tasks", *lm_eval_check.TASKS, "--output_path", str(out), "--log_samples"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(out / "datasets")}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def test_lm_eval_answers_are_the_gateways_own(gateway_url, tmp_path):
    import httpx

    model = httpx.get(f"{gateway_url}/v1/models", timeout=10).json()["data"][0]["id"]
    result = lm_eval(gateway_url, model, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "Using remote tokenizer" in result.stderr  # not a tokenizer from the hub
    for task in lm_eval_check.TASKS:
        assert f"|{task}" in result.stdout, result.stdout  # its row in lm-eval's table
    assert lm_eval_check.problems(gateway_url, tmp_path) == []
