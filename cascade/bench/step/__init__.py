"""The verify engine's step against transformers, torch's floor and the bandwidth limit (`cascade
bench engine`, `tp`, `tree-cost`, `plan-cost`, `gpu`)."""
