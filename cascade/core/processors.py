"""Request processors: what shapes the target's logits before any acceptance rule decides.

Applied by the verifier to every row of a block (``SequenceVerifier._processed``), in order:
logit_bias added; the penalties (repetition over the prompt and what was generated before the
position, presence and frequency over what was generated before it, bad_words); stop tokens at
-inf where min_tokens forbids them; the tokens the grammar forbids (``cascade.core.grammar``).
"Before the position" includes the drafted tokens on the way to it: a chain's earlier drafts, a
tree node's ancestors (``histories``). So the output is the target's under the same processors.
"""

from __future__ import annotations

import torch

from cascade.core.blocks import Draft
from cascade.core.grammar import GrammarMatcher
from cascade.core.trees import path_to
from cascade.protocol.settings import SamplingParams


def processed(logits: torch.Tensor, draft: Draft, params: SamplingParams, committed: list[int],
              prompt_len: int, grammar: GrammarMatcher | None) -> torch.Tensor:
    """``logits`` ([rows, vocab], one row per position of ``draft``'s block, the root's first)
    as the processors shape them, after ``committed`` (the prompt's ``prompt_len`` tokens, then
    the generated ones). A copy when anything changes: the logits themselves stay raw for
    logprobs. Without processors nothing is computed."""
    generated = committed[prompt_len:]
    first = len(generated)
    may_stop_early = bool(params.stop_token_ids) and not params.stops_allowed_at(first)
    if not (params.logit_bias or params.has_penalties or may_stop_early or grammar):
        return logits
    rows = histories(draft)  # [rows] the drafted tokens before each row's position
    shaped = logits.clone()
    if params.logit_bias:
        ids, biases = zip(*params.logit_bias)
        shaped[:, torch.tensor(ids)] += torch.tensor(biases, dtype=shaped.dtype)
    if params.has_penalties:
        penalize(shaped, rows, params, committed[:prompt_len], generated)
    early = [r for r, h in enumerate(rows) if may_stop_early
             and not params.stops_allowed_at(first + len(h))]
    if early:
        shaped[torch.tensor(early).unsqueeze(-1),
               torch.tensor(params.stop_token_ids).unsqueeze(0)] = float("-inf")
    if grammar is not None:
        grammar.apply(shaped, rows)
    return shaped


def penalize(rows: torch.Tensor, row_histories: list[list[int]], p: SamplingParams,
             prompt: list[int], generated: list[int]) -> None:
    """``rows`` ([rows, vocab], in place) with the penalties of the tokens before each row's
    position: the generated tokens counted once, each row's drafted ones on top."""
    vocab = rows.shape[-1]
    base = torch.bincount(torch.tensor(generated, dtype=torch.long),
                          minlength=vocab)[:vocab].to(rows.dtype)  # [vocab]
    in_prompt = torch.zeros(vocab, dtype=torch.bool)
    in_prompt[torch.tensor(prompt, dtype=torch.long)] = True
    for r, history in enumerate(row_histories):
        counts = base + torch.bincount(torch.tensor(history, dtype=torch.long),
                                       minlength=vocab)[:vocab].to(rows.dtype)
        row = rows[r]
        if p.repetition_penalty != 1.0:
            row = torch.where(in_prompt | (counts > 0),
                              torch.where(row > 0, row / p.repetition_penalty,
                                          row * p.repetition_penalty), row)
        row = row - p.presence_penalty * (counts > 0) - p.frequency_penalty * counts
        banned = banned_tokens(p.bad_words, generated + history)
        if banned:
            row[torch.tensor(banned)] = float("-inf")
        rows[r] = row


def histories(draft: Draft) -> list[list[int]]:
    """The drafted tokens before each row's position: a chain's earlier drafts; a tree's root
    row none, a node's row its path."""
    if draft.parents is None:
        return [draft.tokens[:r] for r in range(draft.num_tokens + 1)]
    return [[]] + [[draft.tokens[i] for i in path_to(draft.parents, node)]
                   for node in range(draft.num_tokens)]


def banned_tokens(bad_words: tuple[tuple[int, ...], ...], before: list[int]) -> list[int]:
    """The last token of each bad word whose other tokens end ``before``."""
    return [w[-1] for w in bad_words
            if len(w) == 1 or (len(before) >= len(w) - 1 and before[len(before) - len(w) + 1:]
                               == list(w[:-1]))]
