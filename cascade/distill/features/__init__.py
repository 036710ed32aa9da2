"""A feature drafter's distillation: its data from the target's hidden states, the replay pool, the
training run and its loss."""
