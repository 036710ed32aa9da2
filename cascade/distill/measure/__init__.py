"""Measurements on the distillation's held-out prompts: a drafter's acceptance (`cascade models
evaluate`, `cascade bench replay`), chains against trees (`tree-eval`, `tree-drafter-kv`), the
invariant pass against the plain one (`invariance`)."""
