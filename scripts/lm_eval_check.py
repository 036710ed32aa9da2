"""Checks an lm-evaluation-harness run (``--log_samples``) of the local tasks in docs/lm-eval/
against the gateway it evaluated: every document answered, accuracies in [0, 1], each
multiple-choice log-likelihood the gateway's own (the same tokens sent back with ``echo``), each
generation the gateway's greedy completion of the same prompt. Prints one line per problem;
exit status 1 if there is any.

    .venv/bin/python scripts/lm_eval_check.py http://127.0.0.1:8000 runs/lm-eval
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
TASKS = {"cascade_choice": ROOT / "docs/lm-eval/choice.jsonl",
         "cascade_generate": ROOT / "docs/lm-eval/generate.jsonl"}
ABS_TOL = 1e-3
"""Log-likelihoods are compared to this (nats): the same pass computes both, so they agree to
float32 rounding."""


def problems(base_url: str, out_dir: Path) -> list[str]:
    """What is wrong with the run written under ``out_dir`` (empty: nothing)."""
    results = sorted(out_dir.rglob("results_*.json"))
    if not results:
        return [f"no results_*.json under {out_dir}"]
    report = json.loads(results[-1].read_text())
    found = []
    with httpx.Client(base_url=base_url, timeout=120) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        for task, data in TASKS.items():
            samples = _samples(results[-1].parent, task)
            found += _count_problems(task, report, samples, data)
            check = _choice_problems if task == "cascade_choice" else _generate_problems
            found += check(http, model, report["results"].get(task, {}), samples)
    return found


def _samples(folder: Path, task: str) -> list[dict]:
    files = sorted(folder.glob(f"samples_{task}_*.jsonl"))
    return [json.loads(line) for line in files[-1].read_text().splitlines()] if files else []


def _count_problems(task: str, report: dict, samples: list[dict], data: Path) -> list[str]:
    num_docs = len(data.read_text().splitlines())
    counts = report.get("n-samples", {}).get(task, {})
    if counts.get("effective") != num_docs or len(samples) != num_docs:
        return [f"{task}: {len(samples)} samples, n-samples {counts}, {num_docs} documents"]
    return []


def _choice_problems(http: httpx.Client, model: str, metrics: dict,
                     samples: list[dict]) -> list[str]:
    found = [f"cascade_choice: {name} {metrics.get(name)!r} is not in [0, 1]"
             for name in ("acc,none", "acc_norm,none") if not _is_fraction(metrics.get(name))]
    for sample in samples:
        scores = [float(resp[0][0]) for resp in sample["resps"]]
        if len(scores) != len(sample["doc"]["choices"]):
            found.append(f"doc {sample['doc_id']}: {len(scores)} scores for "
                         f"{len(sample['doc']['choices'])} choices")
            continue
        for arguments, score in zip(sample["arguments"].values(), scores):
            expected = _echoed_loglikelihood(http, model, arguments["arg_0"], arguments["arg_1"])
            if not math.isfinite(score) or abs(score - expected) > ABS_TOL:
                found.append(f"doc {sample['doc_id']} {arguments['arg_1']!r}: lm-eval "
                             f"{score}, the gateway's echo {expected}")
        if sample["acc"] != float(scores.index(max(scores)) == sample["doc"]["answer"]):
            found.append(f"doc {sample['doc_id']}: acc {sample['acc']} for scores {scores}")
    return found


def _echoed_loglikelihood(http: httpx.Client, model: str, context: str,
                          continuation: str) -> float:
    """The continuation's log-probability as the gateway computes it, split into tokens as
    lm-eval splits it (the whole encoded, the context's length cut off)."""
    whole = _tokens(http, context + continuation)
    num_context = len(_tokens(http, context))
    body = {"model": model, "prompt": whole, "max_tokens": 0, "echo": True, "logprobs": 1,
            "temperature": 0}
    response = http.post("/v1/completions", json=body)
    response.raise_for_status()
    return sum(response.json()["choices"][0]["logprobs"]["token_logprobs"][num_context:])


def _generate_problems(http: httpx.Client, model: str, metrics: dict,
                       samples: list[dict]) -> list[str]:
    found = [] if _is_fraction(metrics.get("exact_match,first-word")) else [
        f"cascade_generate: exact_match {metrics.get('exact_match,first-word')!r} not in [0, 1]"]
    eos = http.get("/tokenizer_info").json()["eos_token"]
    for sample in samples:
        text = sample["resps"][0][0]
        prompt, options = sample["arguments"]["gen_args_0"].values()
        body = {"model": model, "prompt": _tokens(http, prompt), "temperature": 0,
                "max_tokens": options["max_gen_toks"], "stop": [*options["until"], eos]}
        response = http.post("/v1/completions", json=body)
        response.raise_for_status()
        expected = response.json()["choices"][0]["text"]
        if not text.strip() or text != expected:
            found.append(f"doc {sample['doc_id']}: lm-eval got {text!r}, the gateway "
                         f"answers {expected!r}")
    return found


def _tokens(http: httpx.Client, text: str) -> list[int]:
    """``text`` encoded as lm-eval's remote tokenizer encodes it (no special tokens)."""
    response = http.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
    response.raise_for_status()
    return response.json()["tokens"]


def _is_fraction(value: object) -> bool:
    return isinstance(value, (int, float)) and 0.0 <= value <= 1.0


if __name__ == "__main__":
    found = problems(sys.argv[1], Path(sys.argv[2]))
    print("\n".join(found) or "lm-eval run checked: every sample is the gateway's answer")
    sys.exit(1 if found else 0)
