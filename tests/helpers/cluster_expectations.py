"""What a tiny cluster's answers must be (the target's own greedy decoding of the same prompt),
and the session records it leaves in Redis, for the end-to-end tests."""

import torch

from models import hf_greedy, penalized

PROMPTS = [
    "def main():", "import os\n", "class Config:", "The quick brown fox", "for i in range(",
    "return self.", "# Compute the", "if __name__ ==", "with open(path) as f:", "x = [1, 2,",
]
MAX_TOKENS = 12


def expected_tokens(cluster, prompt: str, max_tokens: int = MAX_TOKENS) -> list[int]:
    tokenizer = cluster.target.tokenizer
    ids = hf_greedy(cluster.target, tokenizer(prompt).input_ids, max_tokens)
    eos = tokenizer.eos_token_id
    return ids[: ids.index(eos) + 1] if eos in ids else ids


async def clear_sessions(cluster) -> None:
    async for key in cluster.client.scan_iter(match="cascade:session:*"):
        await cluster.client.delete(key)


async def stored_tokens(cluster) -> list[list[int]]:
    keys = sorted([k async for k in cluster.client.scan_iter(match="cascade:session:*:tokens")])
    return [[int(t) for t in await cluster.client.lrange(k, 0, -1)] for k in keys]


def penalized_greedy(cluster, prompt_ids: list[int], num_new: int, presence: float,
                     frequency: float, repetition: float) -> list[int]:
    """The slow reference: one target forward per token, the penalties applied to its last
    logits from the tokens before it, the argmax."""
    generated: list[int] = []
    with torch.no_grad():
        for _ in range(num_new):
            logits = cluster.target.model(torch.tensor([prompt_ids + generated])).logits[0, -1]
            logits = penalized(logits, prompt_ids, generated, presence, frequency, repetition)
            generated.append(int(logits.argmax()))
    return generated
