"""`cascade bench compare` and the focused benchmarks (gRPC floor, prompt lookup on copy-heavy prompts):
every method on the same prompts and pair, side by side in one run."""
