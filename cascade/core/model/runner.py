"""The KV-cached model runner: one Hugging Face causal LM, one cache per sequence.

A ``SequenceCache`` is addressed by position: it holds the KV entries of ``tokens`` and nothing
else (but a token tree's nodes, kept past them until the next round: ``keep_grown``).
``extend`` feeds new tokens and returns their ``ForwardOutput`` (logits, and the hidden states
of the layers asked for); ``rollback`` truncates to a committed length (the rejected tail
of a draft is simply forgotten); ``forward_to`` makes the cache hold exactly a given token
sequence in one forward pass, reusing the longest common prefix.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import AutoTokenizer, DynamicCache, PreTrainedModel

from cascade.core.forward import packed_weights
from cascade.core.forward.dense import DenseCall, dense_call
from cascade.core.forward.invariance_probe import probe_invariance
from cascade.core.forward.row_rules import Invariance
from cascade.core.forward.packed_backend import enable
from cascade.core.forward.row_rope import rope_switch
from cascade.core.model.tensor_parallel import Shard, local_products
from cascade.core.model.vocab_map import VocabMap
from cascade.core.model.weights import DTYPES, ModelSpec, load_causal_lm
from cascade.core.kv.kv_store import KVShape
from cascade.core.kv.prefix_share import (ENDED_BYTES, EndedCaches, HeldTokens, adopt_prefix,
                                       common_prefix_len)

_PROBE_LOCK = threading.Lock()


class ForwardOutput(NamedTuple):
    """What one forward pass returns for the positions asked for."""

    logits: torch.Tensor
    """[n, vocab] float32 (the target's vocabulary, also for a restricted-vocabulary drafter)."""
    hidden_states: tuple[torch.Tensor, ...] = ()
    """One [n, hidden] tensor per requested layer, in the model's dtype. Layer indices follow
    transformers' ``hidden_states`` output: 0 is the embeddings, -1 the last layer."""
    leading: tuple | None = None
    """The m positions before ``logits``', each scored for the token after it
    (``TokenLogprobs``: the engine's ``Pass.num_leading``, a prompt's log-probabilities);
    None when none were asked for."""


class ModelRunner:
    """A causal LM in eval mode plus its tokenizer (if any); hands out per-sequence caches."""

    def __init__(self, model: PreTrainedModel, tokenizer=None,
                 vocab_map: VocabMap | None = None) -> None:
        self.model = model.eval()
        packed_weights.pack(self.model)  # oneDNN products on the CPU: faster, row-invariant
        self.tokenizer = tokenizer
        self.vocab_map = vocab_map
        self.device = next(model.parameters()).device
        self.live_caches: weakref.WeakSet[SequenceCache] = weakref.WeakSet()
        """Its sequences' caches: a new one copies the prefix another holds
        (``cascade.core.kv.prefix_share.adopt_prefix``)."""
        self.shared_tokens = 0
        """Positions its caches copied instead of feeding, since it was loaded."""
        self.ended = EndedCaches(ENDED_BYTES // max(KVShape.of(model).bytes_per_token, 1))
        """Caches of ended sequences, kept while room allows: a new cache of the same scope
        copies the prefix one holds too (the next turn of a chat, an agent's next step)."""
        self.rope_switch = rope_switch(model)
        """Where its rotary frequencies change with the row's length (None: they do not): a
        position's keys then depend on the pass that fed it, so its caches share no prefix."""
        self.invariance: Invariance | None = None
        """The model's probed row rules (``cascade.core.forward.row_rules.probe``), once asked for."""
        self.invariant = False
        """Whether its own caches (``SequenceCache``, ``Branches``) run the batch-invariant
        forward, so what it computes for a position does not depend on how it was fed."""

    def probed_invariance(self) -> Invariance:
        with _PROBE_LOCK:
            if self.invariance is None:
                with local_products():  # this rank's kernels (a sharded slice: its own)
                    self.invariance = probe_invariance(self.model)
            return self.invariance

    def set_invariant(self, on: bool = True) -> None:
        if on:
            enable(self.model)
            self.probed_invariance()
        self.invariant = on

    def dense_call(self, rows, width: int, batches: list[int] | None = None):
        """The context of one invariant ``DynamicCache`` forward (``dense.DenseCall``)."""
        return dense_call(DenseCall(rows, width, self.invariance.attention,
                                    self.invariance.pad_limit, batches))

    @classmethod
    def load(cls, spec: ModelSpec, slice_of: Shard | None = None,
             random_weights: bool = False) -> "ModelRunner":
        """The model of ``spec`` (``weights.load_causal_lm``: whole, a rank's slice, or random)
        with its tokenizer (none with random weights)."""
        model = load_causal_lm(spec.name_or_path, DTYPES[spec.dtype], spec.device, slice_of,
                               random_weights)
        if random_weights:
            return cls(model)
        tokenizer = AutoTokenizer.from_pretrained(spec.name_or_path)
        return cls(model, tokenizer, VocabMap.load(Path(spec.name_or_path)))

    @property
    def vocab_size(self) -> int:
        """Width of the logits (may exceed the tokenizer's length)."""
        if self.vocab_map is not None:
            return self.vocab_map.target_vocab_size
        head = self.model.get_output_embeddings()
        return getattr(head, "out_features", None) or head.weight.shape[0]

    @property
    def max_length(self) -> int:
        config = self.model.config
        return getattr(config, "max_position_embeddings", None) or config.n_positions

    @property
    def num_layers(self) -> int:
        """Decoder layers (transformers' hidden_states has num_layers + 1 entries)."""
        return self.model.config.num_hidden_layers

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                cache_position: torch.Tensor, cache: DynamicCache, **kwargs):
        """One pass over [B, S] ids of the target's vocabulary (mapped to a restricted drafter's
        own) at ``positions`` [B, S], into the cache slots ``cache_position`` [S]; ``kwargs``
        go to the model (attention_mask, logits_to_keep, ...)."""
        if getattr(self.model, "cascade_leader", None) is not None:
            raise RuntimeError("a tensor-parallel target runs only through the verify engine "
                               "(its other ranks follow the engine's passes)")
        if self.vocab_map is not None:
            input_ids = self.vocab_map.to_local[input_ids]
        device = self.device
        kwargs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in kwargs.items()}
        return self.model(input_ids=input_ids.to(device), position_ids=positions.to(device),
                          cache_position=cache_position.to(device), cache=cache,
                          use_cache=True, **kwargs)

    def target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[n, model vocab] -> [n, target vocab] float32 on the CPU."""
        logits = logits.float().cpu()
        return logits if self.vocab_map is None else self.vocab_map.expand(logits)

    def new_cache(self, scope: str = "") -> "SequenceCache":
        return SequenceCache(self, scope)


class SequenceCache:
    """The KV cache of one sequence; ``tokens`` are exactly the positions it holds."""

    def __init__(self, runner: ModelRunner, scope: str = "") -> None:
        self.runner, self.scope = runner, scope
        """``scope``: whose caches it may copy a prompt prefix from (``adopt_prefix``)."""
        # Full history on every layer (no config): a sliding-window layer's own cache drops
        # old positions and cannot be rolled back once past its window; the model's masks
        # still apply each layer's window.
        self.cache = DynamicCache()
        self._held = HeldTokens()
        weakref.finalize(self, runner.ended.keep, scope, self._held, self.cache)
        self.grown: dict[tuple[int, ...], int] = {}
        """Token-tree nodes the cache holds past ``tokens`` (``keep_grown``): each node's path
        of tokens after them -> its slot after them."""
        runner.live_caches.add(self)

    @property
    def tokens(self) -> list[int]:
        return self._held.tokens

    @tokens.setter
    def tokens(self, value: list[int]) -> None:
        self._held.tokens = value

    def keep_grown(self, paths: dict[tuple[int, ...], int]) -> None:
        """Keep a token tree's fed nodes (``paths``: ``grown``) past ``tokens`` until the
        cache is next used: ``forward_to`` and ``hold`` then move the entries of the nodes on
        the path they are given into place (the accepted path: not fed again), and every use
        drops the rest. No paths: drop them now."""
        self.grown = paths
        if not paths:
            self._settle([])

    @torch.inference_mode()
    def _settle(self, token_ids: list[int]) -> None:
        """Drop the grown nodes, first moving those on ``token_ids``' path after ``tokens``
        into the slots right after them (their positions: a node at depth d sits at
        len(tokens) + d - 1), so the cache holds ``tokens`` plus that path again."""
        grown, self.grown = self.grown, {}
        base, slots = len(self.tokens), []
        if grown and token_ids[:base] == self.tokens:
            while base + len(slots) < len(token_ids):
                slot = grown.get(tuple(token_ids[base: base + len(slots) + 1]))
                if slot is None:
                    break
                slots.append(slot)
        keep = base + len(slots)
        if slots != list(range(len(slots))):
            source = torch.tensor([base + s for s in slots], device=self.runner.device)
            for layer in self.cache.layers:
                layer.keys[:, :, base:keep] = layer.keys.index_select(2, source)
                layer.values[:, :, base:keep] = layer.values.index_select(2, source)
        excess = self.cache.get_seq_length() - keep
        if excess > 0:
            self.cache.crop(-excess)
        self.tokens.extend(token_ids[base:keep])

    @torch.inference_mode()
    def extend(self, token_ids: list[int], num_logits: int = 0,
               hidden_layers: tuple[int, ...] = (), num_hidden: int | None = None
               ) -> ForwardOutput:
        """Feed tokens; returns the logits of the last ``num_logits`` positions (0 = all) and
        the hidden states of ``hidden_layers`` for the last ``num_hidden`` (default: the same
        positions as the logits; 0 = all)."""
        assert token_ids, "extend needs at least one token"
        self._settle([])
        start, count = len(self.tokens), len(token_ids)
        if self.runner.invariant:
            logits, states = self._forward_invariant(token_ids, num_logits, bool(hidden_layers))
        else:
            positions = torch.arange(start, start + count)
            output = self.runner.forward(torch.tensor([token_ids]), positions[None], positions,
                                         self.cache, logits_to_keep=num_logits,
                                         output_hidden_states=bool(hidden_layers))
            logits, states = output.logits[0], [h[0] for h in output.hidden_states or ()]
        self.tokens.extend(token_ids)
        logits = self.runner.target_logits(logits)
        num_hidden = num_logits if num_hidden is None else num_hidden
        rows = slice(-num_hidden if num_hidden else None, None)
        hidden = tuple(states[i][rows].cpu() for i in hidden_layers)
        return ForwardOutput(logits, hidden)

    def _forward_invariant(self, token_ids: list[int], num_logits: int, hidden: bool):
        """The same pass, batch-invariant: filler tokens bring the rows to the model's rule
        (their cache entries are dropped after), attention is canonical. Returns the kept
        logits and each layer's hidden states [count, d]."""
        rules = self.runner.invariance
        start, count = len(self.tokens), len(token_ids)
        width = rules.linear.pad(count)
        positions = torch.arange(start, start + width)
        keep = torch.arange(count - num_logits if num_logits else 0, count)
        wanted = len(keep)
        keep = torch.cat([keep, keep[-1:].expand(rules.linear.pad(wanted) - wanted)])
        ids = torch.tensor([token_ids + [0] * (width - count)])
        with self.runner.dense_call([(list(range(start + count)),
                                      [(i, start + i) for i in range(count)])], width):
            output = self.runner.forward(ids, positions[None], positions, self.cache,
                                         logits_to_keep=keep, output_hidden_states=hidden)
        if width > count:
            self.cache.crop(count - width)
        return output.logits[0, :wanted], [h[0, :count] for h in output.hidden_states or ()]

    def rollback(self, length: int) -> None:
        """Forget every position at or after ``length``."""
        self._settle([])
        excess = len(self.tokens) - length
        if excess > 0:
            self.cache.crop(-excess)  # transformers 5.x: a negative count removes tokens
            del self.tokens[length:]

    def hold(self, token_ids: list[int]) -> None:
        """Make the cache hold exactly ``token_ids`` (feeding only what it lacks)."""
        self._settle(token_ids)
        if not self.tokens:
            adopt_prefix(self, token_ids, len(token_ids))
        reuse = common_prefix_len(self.tokens, token_ids)
        self.rollback(reuse)
        if reuse < len(token_ids):
            self.extend(token_ids[reuse:], num_logits=1)

    def forward_to(self, token_ids: list[int], num_logits: int = 1,
                   hidden_layers: tuple[int, ...] = (), num_hidden: int | None = None
                   ) -> ForwardOutput:
        """Make the cache hold exactly ``token_ids`` in one forward pass and return the output
        (logits [num_logits, vocab], hidden states) of its last ``num_logits`` positions.

        The longest prefix already cached is reused; at least the last ``num_logits`` tokens are
        (re)fed so their logits exist.
        """
        assert 1 <= num_logits <= len(token_ids), "need logits for 1..len(token_ids) positions"
        self._settle(token_ids)
        if not self.tokens and not hidden_layers:
            adopt_prefix(self, token_ids, len(token_ids) - num_logits)
        reuse = min(common_prefix_len(self.tokens, token_ids), len(token_ids) - num_logits)
        self.rollback(reuse)
        return self.extend(token_ids[reuse:], num_logits, hidden_layers, num_hidden)
