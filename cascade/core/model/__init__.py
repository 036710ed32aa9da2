"""One model: where its weights come from, its dtype, its KV-cached runner, its tensor-parallel
split, a drafter's restricted vocabulary and batched continuations of one prefix."""
