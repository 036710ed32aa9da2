"""`cascade bench compare`: every method (target-only, transformers' assisted generation, the in-
process loop, the services) on the same prompts, side by side."""
