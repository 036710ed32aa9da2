"""Teacher data: the target answers prompts, and its distribution at every answer position is kept.

One chunk = one batch of prompts answered with Hugging Face ``generate`` (KV cache, left
padding). For each answer token the teacher's top-``keep`` log-probabilities (temperature 1) are
stored, so the drafter learns the whole distribution, not just the emitted token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch



@dataclass
class Sequence:
    tokens: list[int]
    """Prompt (chat template applied) followed by the answer."""
    start: int
    """Index of the first answer token."""
    top_ids: torch.Tensor
    """[answer_len, keep] int32: the teacher's most likely next tokens at each answer position."""
    top_logp: torch.Tensor
    """[answer_len, keep] float16: their log-probabilities."""


@torch.inference_mode()
def answer(model, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int,
           temperature: float, keep: int = 32, seed: int = 0) -> list[Sequence]:
    """Answer a batch of tokenized prompts; greedy when temperature is 0."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in prompt_ids)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    torch.manual_seed(seed)
    sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0} \
        if temperature > 0 else {"do_sample": False}
    out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=pad,
                         **sampling)
    logits = torch.stack(out.logits, dim=1).float()  # [batch, steps, vocab]
    top_logp, top_ids = torch.log_softmax(logits, -1).topk(keep, dim=-1)
    return [_sequence(prompt, out.sequences[row, width:].tolist(), top_ids[row], top_logp[row],
                      tokenizer.eos_token_id) for row, prompt in enumerate(prompt_ids)]


def _sequence(prompt: list[int], answer_ids: list[int], top_ids, top_logp, eos: int) -> Sequence:
    length = answer_ids.index(eos) + 1 if eos in answer_ids else len(answer_ids)
    return Sequence(prompt + answer_ids[:length], len(prompt),
                    top_ids[:length].to(torch.int32), top_logp[:length].to(torch.float16))
