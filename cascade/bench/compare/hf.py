"""Hugging Face transformers generation as the benchmark's anchor: ``generate()`` alone and with
``assistant_model`` (assisted generation), traced with a streamer and a forward-call counter."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
from transformers.generation.streamers import BaseStreamer

from cascade.bench.measure import Trace, fastest


@dataclass(frozen=True)
class HfSetting:
    k: int
    """num_assistant_tokens (the starting value under the heuristic schedule)."""
    schedule: str = "constant"
    confidence: float = 0.0
    """assistant_confidence_threshold; 0 turns the early stop off."""

    @property
    def label(self) -> str:
        return f"{self.k} tokens, {self.schedule}, confidence {self.confidence:g}"


HF_DEFAULT = HfSetting(20, "constant", 0.4)
"""transformers' defaults for an assistant model."""
HF_CANDIDATES = (HF_DEFAULT, HfSetting(2), HfSetting(3), HfSetting(4), HfSetting(6),
                 HfSetting(4, "heuristic"), HfSetting(20, "constant", 0.2))
"""Settings tried on the first prompts; the fastest is reported as HF's best."""


def unpacked(model):
    """``model`` as transformers runs it, for the baseline a user would run: a copy whose
    products are plain ``nn.Linear`` ones (a runner packs its model's weights,
    ``cascade.core.forward.packed_weights``; a deep copy unpacks them)."""
    return copy.deepcopy(model)


def restricted_to_full_vocab(runner):
    """The drafter as a model over the target's full vocabulary (what ``generate`` expects):
    a restricted-vocabulary drafter maps inputs to its rows and spreads its logits back, -inf
    elsewhere. A full-vocabulary drafter is returned as it is."""
    model, vocab = unpacked(runner.model), runner.vocab_map
    if vocab is None:
        return model
    inner = model.forward

    def forward(input_ids=None, **kwargs):
        output = inner(input_ids=vocab.to_local[input_ids], **kwargs)
        logits = output.logits
        full = logits.new_full((*logits.shape[:-1], vocab.target_vocab_size), float("-inf"))
        output.logits = full.index_copy_(-1, vocab.to_target, logits[..., : vocab.unknown])
        return output

    model.forward = forward
    model.config.vocab_size = vocab.target_vocab_size
    return model


class _Recorder(BaseStreamer):
    """Timestamps each round's tokens; drafted = assistant forward calls since the last round."""

    def __init__(self, trace: Trace, started: float, calls: list[int]) -> None:
        self.trace, self.started, self.calls = trace, started, calls
        self.prompt_seen, self.seen_calls = False, 0

    def put(self, value) -> None:
        if not self.prompt_seen:  # generate() streams the prompt first
            self.prompt_seen = True
            return
        tokens = value.reshape(-1).tolist()
        self.trace.chunk(time.perf_counter() - self.started, tokens)
        drafted, self.seen_calls = self.calls[0] - self.seen_calls, self.calls[0]
        self.trace.round(drafted, min(len(tokens) - 1, drafted))

    def end(self) -> None:
        pass


def _configure(assistant, setting: HfSetting) -> None:
    config = assistant.generation_config
    config.num_assistant_tokens = setting.k
    config.num_assistant_tokens_schedule = setting.schedule
    config.assistant_confidence_threshold = setting.confidence


def hf_trace(target, assistant, prompt, job, sampling: bool, setting: HfSetting | None) -> Trace:
    trace, calls = Trace(prompt.domain), [0]
    hook = None
    if assistant is not None:
        _configure(assistant, setting)
        hook = assistant.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    eos = target.generation_config.eos_token_id
    sample = dict(do_sample=True, temperature=job.temperature, top_k=0, top_p=1.0) if sampling \
        else dict(do_sample=False, temperature=None, top_k=None, top_p=None)
    torch.manual_seed(job.seed)
    input_ids = torch.tensor([prompt.token_ids])
    started = time.perf_counter()
    try:
        target.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                        assistant_model=assistant, max_new_tokens=job.max_new_tokens,
                        eos_token_id=eos, pad_token_id=eos, **sample,
                        streamer=_Recorder(trace, started, calls))
    finally:
        if hook is not None:
            hook.remove()
    trace.elapsed_s = time.perf_counter() - started
    return trace


def pick_best_hf(target, assistant, job, sampling: bool, tick=None) -> HfSetting:
    """The candidate setting with the most tokens/s on the first (up to) two prompts."""
    return fastest(HF_CANDIDATES, lambda setting, prompt: hf_trace(
        target, assistant, prompt, job, sampling, setting), job.prompts[:2], tick)
