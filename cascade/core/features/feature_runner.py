"""Running a feature drafter: load it beside its target's embedding, keep one cache per sequence.

A ``FeatureCache`` speaks the same language as the model runner's ``SequenceCache``
(``forward_to(committed)`` then ``extend([token])``, each returning a ``ForwardOutput``), so the
model proposer drafts with either. Its entries are addressed by position: entry t holds the
drafter's key and value for the input (g_t, x_{t+1}). Entries built from the target's features
are kept across rounds; entries built from the drafter's own outputs (the drafted tail, or
positions whose target features have not arrived yet) are dropped at the next ``forward_to``.
Token trees are fed through ``tree_grower`` (``cascade.core.features.feature_tree``), one depth per pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from cascade.core.features.feature_drafter import FeatureDrafter, load_config, save_config
from cascade.core.features.feature_tree import FeatureTreeGrower
from cascade.core.model.runner import ForwardOutput, ModelRunner, ModelSpec, common_prefix_len
from cascade.core.model.vocab_map import VOCAB_MAP_FILE, VocabMap

FEATURE_KIND = "feature"


def is_feature_drafter(folder: Path) -> bool:
    config = Path(folder) / "config.json"
    return config.exists() and json.loads(config.read_text()).get("kind") == FEATURE_KIND


def _target_embedding(target: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(input embedding, output head) [vocab, d] float32 read from the target's safetensors."""
    tensors = {}
    for path in sorted(Path(target).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                if key.endswith(("embed_tokens.weight", "wte.weight", "lm_head.weight")):
                    tensors[key.rsplit(".", 2)[-2]] = f.get_tensor(key).float()
    embed = tensors.get("embed_tokens", tensors.get("wte"))
    if embed is None:
        raise FileNotFoundError(f"no input embedding found in {target}")
    return embed, tensors.get("lm_head", embed)


def load_model(spec: ModelSpec, target: str | None = None) -> ModelRunner | FeatureRunner:
    """The runner for a model folder: a feature drafter (which reads ``target``'s embedding)
    or any transformers causal LM."""
    if not is_feature_drafter(Path(spec.name_or_path)):
        return ModelRunner.load(spec)
    if not target:
        raise ValueError(f"{spec.name_or_path} is a feature drafter: give the target's folder "
                         "too (--target-model), whose embedding and head it shares")
    return FeatureRunner.load(Path(spec.name_or_path), Path(target))


class FeatureRunner:
    """A feature drafter in eval mode, with the target's embedding and head."""

    def __init__(self, drafter: FeatureDrafter, vocab_map: VocabMap, max_length: int) -> None:
        self.drafter = drafter.eval()
        self.vocab_map = vocab_map
        self.max_length = max_length
        self.tokenizer = None

    @classmethod
    def load(cls, folder: Path, target: Path) -> FeatureRunner:
        folder, target = Path(folder), Path(target)
        config = load_config(json.loads((folder / "config.json").read_text()))
        vocab_map = VocabMap.load(folder)
        if vocab_map is None:
            raise FileNotFoundError(f"{folder} has no {VOCAB_MAP_FILE}")
        embed, head = _target_embedding(target)
        drafter = FeatureDrafter(config, embed, head, vocab_map.to_target)
        load_weights(drafter, folder)
        target_config = json.loads((target / "config.json").read_text())
        max_length = target_config.get("max_position_embeddings") or target_config["n_positions"]
        return cls(drafter, vocab_map, int(max_length))

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.drafter.c.feature_layers

    @property
    def vocab_size(self) -> int:
        return self.vocab_map.target_vocab_size

    def new_cache(self, scope: str = "") -> FeatureCache:
        """``scope`` is unused: a feature drafter's caches share no prefixes."""
        return FeatureCache(self)


class FeatureCache:
    """The drafter's state for one sequence: target features by position, and KV entries."""

    wants_target_features = True

    def __init__(self, runner: FeatureRunner) -> None:
        self.runner = runner
        self.features = torch.zeros(0, runner.drafter.fuse.in_features)  # [F, layers * d]
        self.keys = self.values = None  # [H, entries, hd]
        self.entry_tokens: list[int] = []
        """x_{t+1} of every entry t."""
        self.num_target_entries = 0
        self.outputs = torch.zeros(0, runner.drafter.c.hidden_size)  # [entries, d]: each a_t

    def observe(self, start: int, hidden: torch.Tensor) -> None:
        """Target features [n, layers * d] for positions start .. start + n - 1."""
        if start > len(self.features):
            raise ValueError(f"features from position {start} leave a gap after "
                             f"{len(self.features)}")
        self.features = torch.cat([self.features[:start], hidden.float()])
        self.num_target_entries = min(self.num_target_entries, start)

    @torch.inference_mode()
    def forward_to(self, committed: list[int], num_logits: int = 1) -> ForwardOutput:
        """Entries for positions 0 .. len(committed) - 2; logits for the next token."""
        assert num_logits == 1, "a feature drafter predicts one position at a time"
        keep = min(self.num_target_entries, common_prefix_len(self.entry_tokens, committed[1:]))
        self.truncate(keep)
        ready = min(len(self.features), len(committed) - 1)
        if ready > keep:
            fused = self.runner.drafter.fuse_features(self.features[keep:ready])
            self._add(fused, committed[keep + 1 : ready + 1])
        self.num_target_entries = max(keep, ready)
        for t in range(max(ready, keep), len(committed) - 1):  # no target features yet
            self._add(self.outputs[-1:], committed[t + 1 : t + 2])
        return self._output()

    @torch.inference_mode()
    def extend(self, token_ids: list[int], num_logits: int = 0) -> ForwardOutput:
        """One drafted token: its entry uses the drafter's own output as the feature."""
        assert len(token_ids) == 1 and len(self.outputs), "forward_to first"
        self._add(self.outputs[-1:], token_ids)
        return self._output()

    def tree_grower(self, base: int) -> FeatureTreeGrower:
        """Feeds a token tree after the ``base`` committed tokens (``forward_to`` them first)."""
        return FeatureTreeGrower(self, base)

    @torch.inference_mode()
    def add_entries(self, features: torch.Tensor, next_tokens: list[int],
                    positions: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """Entries for features [n, d] and tokens [n] at ``positions`` [n], each seeing the
        entries ``visible`` [n, entries + n] marks; returns their logits [n, vocab]."""
        self._add(features, next_tokens, positions, visible)
        return self._logits(self.outputs[-len(next_tokens):])

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` entries."""
        if self.keys is not None:
            self.keys, self.values = self.keys[:, :length], self.values[:, :length]
        del self.entry_tokens[length:]
        self.outputs = self.outputs[:length]

    def _add(self, features: torch.Tensor, next_tokens: list[int],
             positions: torch.Tensor | None = None, visible: torch.Tensor | None = None) -> None:
        """New entries for features [n, d] and tokens [n], at the next positions attending to
        the cache causally unless ``positions`` [n] and ``visible`` [n, entries + n] say
        otherwise."""
        drafter, start = self.runner.drafter, len(self.entry_tokens)
        tokens = torch.tensor([next_tokens])
        x = drafter.step_input(features[None], tokens)  # [1, n, d]
        if positions is None:
            positions = torch.arange(start, start + len(next_tokens))
        q, k, v = drafter.layer.qkv(x, positions)
        k, v = drafter.layer.expand_kv(k)[0], drafter.layer.expand_kv(v)[0]
        self.keys = k if self.keys is None else torch.cat([self.keys, k], 1)
        self.values = v if self.values is None else torch.cat([self.values, v], 1)
        if visible is None:
            visible = torch.arange(self.keys.shape[1])[None, :] <= positions[:, None]
        attended = F.scaled_dot_product_attention(q[0], self.keys, self.values,
                                                  attn_mask=visible)  # [H, n, hd]
        self.outputs = torch.cat([self.outputs, drafter.layer.finish(x, attended[None])[0]])
        self.entry_tokens += next_tokens

    def _output(self) -> ForwardOutput:
        if not len(self.outputs):  # a one-token context: nothing to predict from
            return ForwardOutput(torch.zeros(1, self.runner.vocab_size))
        return ForwardOutput(self._logits(self.outputs[-1:]))

    def _logits(self, outputs: torch.Tensor) -> torch.Tensor:
        """Drafter outputs a [n, d] -> logits over the target's vocabulary [n, vocab]."""
        local = self.runner.drafter.head(outputs)  # [n, V']
        return self.runner.vocab_map.expand(torch.cat(
            [local, local.new_full((len(local), 1), float("-inf"))], -1))


def load_weights(drafter: FeatureDrafter, folder: Path) -> None:
    """The folder's own weights into ``drafter`` (the embedding and head are the target's)."""
    from safetensors.torch import load_file

    weights = {k: v.float() for k, v in load_file(folder / "model.safetensors").items()}
    missing, unexpected = drafter.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - {"vocab_ids"}:
        raise ValueError(f"{folder} is not a feature drafter this code can load: missing "
                         f"{missing}, unexpected {unexpected}")


def write_feature_drafter(drafter: FeatureDrafter, vocab_map: VocabMap, out: Path,
                          target_name: str) -> None:
    """The drafter folder: its own weights in float16 (the embedding and head stay with the
    target), its vocabulary and its config (``kind: feature``)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().to("cpu", torch.float16).contiguous()
               for k, v in drafter.state_dict().items() if k != "vocab_ids"}
    save_file(weights, str(out / "model.safetensors"))
    vocab_map.save(out)
    meta = {**save_config(drafter.c), "target": target_name, "torch_dtype": "float16"}
    (out / "config.json").write_text(json.dumps(meta, indent=1))
