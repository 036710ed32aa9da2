"""The verifier's step: the engine that verifies many sessions' blocks in one pass, per-sequence
verification, paged KV, the compiled step, the step-cost model and the log-probabilities
returned."""
