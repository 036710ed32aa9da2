"""Request processors: what shapes the target's logits before any acceptance rule decides.

Applied by the verifier to every row of a block (``SequenceVerifier._processed``), in order:
logit_bias added; the penalties (repetition over the prompt and what was generated before the
position, presence and frequency over what was generated before it, bad_words); stop tokens at
-inf where min_tokens forbids them; the tokens the grammar forbids (``cascade.core.sample.grammar``).
"Before the position" includes the drafted tokens on the way to it: a chain's earlier drafts, a
tree node's ancestors (``histories``). So the output is the target's under the same processors.

The model drafter shapes its q with the same function (``shape``, one row per drafted
position, ``cascade.core.proposers.shaping``): a draft the processors forbid would be rejected
and waste the rest of its block. Any q keeps the lossless rules exact; a shaped q is accepted
more often.

``fill`` is jump-forward: the tokens the target must emit whatever its logits, because the
grammar allows only them; the verifier appends them after its own token, the drafter to its
block, neither running its model for them.
"""

from __future__ import annotations

import torch

from cascade.core.blocks import Draft
from cascade.core.sample.grammar import GrammarMatcher
from cascade.core.trees import path_to
from cascade.protocol.settings import SamplingParams


def processed(logits: torch.Tensor, draft: Draft, params: SamplingParams, committed: list[int],
              prompt_len: int, grammar: GrammarMatcher | None) -> torch.Tensor:
    """``logits`` ([rows, vocab], one row per position of ``draft``'s block, the root's first)
    as the processors shape them, after ``committed`` (the prompt's ``prompt_len`` tokens, then
    the generated ones). A copy when anything changes: the logits themselves stay raw for
    logprobs. Without processors nothing is computed."""
    rows = histories(draft)  # [rows] the drafted tokens before each row's position
    allowed = grammar.allowed(rows) if grammar is not None else None
    return shape(logits, rows, params, committed[:prompt_len], committed[prompt_len:], allowed)


def is_shaping(params: SamplingParams, num_generated: int) -> bool:
    """Whether any processor may change a row after ``num_generated`` generated tokens (the
    grammar aside: its mask is the caller's)."""
    may_stop_early = bool(params.stop_token_ids) and not params.stops_allowed_at(num_generated)
    return bool(params.logit_bias or params.has_penalties or may_stop_early)


def shape(logits: torch.Tensor, row_histories: list[list[int]], params: SamplingParams,
          prompt: list[int], generated: list[int], allowed: torch.Tensor | None
          ) -> torch.Tensor:
    """``logits`` ([rows, vocab]) shaped by the processors at each row's position: after
    ``prompt``, ``generated`` and the row's ``row_histories[r]`` (drafted tokens); ``allowed``
    ([rows, vocab] bool, or None) the grammar's mask of each row. A copy when anything
    changes."""
    first = len(generated)
    if not (is_shaping(params, first) or allowed is not None):
        return logits
    shaped = logits.clone()
    if params.logit_bias:
        ids, biases = zip(*params.logit_bias)
        shaped[:, torch.tensor(ids)] += torch.tensor(biases, dtype=shaped.dtype)
    if params.has_penalties:
        penalize(shaped, row_histories, params, prompt, generated)
    if params.stop_token_ids and not params.stops_allowed_at(first):
        early = [r for r, h in enumerate(row_histories)
                 if not params.stops_allowed_at(first + len(h))]
        if early:
            shaped[torch.tensor(early).unsqueeze(-1),
                   torch.tensor(params.stop_token_ids).unsqueeze(0)] = float("-inf")
    if allowed is not None:
        shaped.masked_fill_(~allowed.to(shaped.device), float("-inf"))
    return shaped


def penalize(rows: torch.Tensor, row_histories: list[list[int]], p: SamplingParams,
             prompt: list[int], generated: list[int]) -> None:
    """``rows`` ([rows, vocab], in place) with the penalties of the tokens before each row's
    position: the generated tokens counted once, each row's drafted ones on top.

    Only the columns of tokens in the prompt or before the position change, so the penalties
    are computed on those alone (gathered, penalised, written back): the same float operations
    as on the whole row, on a few hundred columns instead of the vocabulary (the drafter runs
    this at every drafted position)."""
    before_all = torch.tensor(generated, dtype=torch.long)  # [generated]
    in_prompt = (torch.tensor(prompt, dtype=torch.long).unique() if p.repetition_penalty != 1.0
                 else before_all[:0])  # [distinct prompt tokens]
    for r, history in enumerate(row_histories):
        before = torch.cat([before_all, torch.tensor(history, dtype=torch.long)])
        seen, seen_counts = before.unique(return_counts=True)  # [n] sorted, [n]
        ids = torch.cat([seen, in_prompt]).unique()  # [m] sorted: every column that changes
        counts = torch.zeros(len(ids), dtype=rows.dtype)
        counts[torch.searchsorted(ids, seen)] = seen_counts.to(rows.dtype)
        values = rows[r, ids]  # [m]
        if p.repetition_penalty != 1.0:
            values = torch.where(values > 0, values / p.repetition_penalty,
                                 values * p.repetition_penalty)
        rows[r, ids] = values - p.presence_penalty * (counts > 0) - p.frequency_penalty * counts
        banned = banned_tokens(p.bad_words, generated + history)
        if banned:
            rows[r, torch.tensor(banned)] = float("-inf")


def fill(grammar: GrammarMatcher, params: SamplingParams, generated: list[int], limit: int
         ) -> list[int]:
    """Jump-forward: the tokens after ``generated`` that the target must emit whatever its
    logits, at most ``limit``. ``grammar`` is at the end of ``generated`` and stays there.

    A token qualifies when the grammar allows only it at its position (so the processed p is
    a point mass there: greedy, sampling and every acceptance rule choose it) and no other
    processor sends it to -inf (a bad word's last token, a stop token before min_tokens),
    where the target's p would have no finite logit and the pass must decide."""
    def may_take(run: list[int], token: int) -> bool:
        ended = bool(run) and run[-1] in params.stop_token_ids  # nothing follows a stop token
        return not ended and may_fill(params, generated + run, token)

    return grammar.forced_run(limit, may_take)


def may_fill(params: SamplingParams, before: list[int], token: int) -> bool:
    """Whether a token the grammar forces after ``before`` (the generated tokens) keeps a
    finite logit under the other processors: not a bad word's last token, not a stop token
    before min_tokens."""
    if token in params.stop_token_ids and not params.stops_allowed_at(len(before)):
        return False
    return not params.bad_words or token not in banned_tokens(params.bad_words, before)


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
