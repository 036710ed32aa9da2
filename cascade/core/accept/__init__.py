"""What a verifier keeps from a draft: the acceptance rules (chains, batches, trees, speculative
cascades), their slow references, and the checks a draft passes before it is fed."""
