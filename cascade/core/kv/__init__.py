"""KV memory: the verifier's block store and its default budget, and prompt prefixes computed once
(on the verifier's store and in a drafter's model cache)."""
