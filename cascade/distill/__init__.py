"""``cascade distill``: train a small drafter for a target model by self-distillation."""
