"""The core: exact speculative decoding with torch and transformers, and nothing of serving.

Packages from the bottom up: ``kv`` (KV memory), ``forward`` (the packed, batch-invariant pass),
``model`` (loading and running one model), ``parallel`` (tensor-parallel ranks), ``sample``
(sampling, processors, grammar), ``accept`` (the acceptance rules), ``verify`` (the verifier's
step), ``plan`` (where speculation pays), ``memory`` (the speculation memory), ``features`` (the
feature drafter) and ``proposers`` (the drafting methods); beside them ``blocks`` (what one round
moves), ``trees`` (token trees), ``paths`` and ``loop`` (the in-process speculative loop). It
imports the protocol layer and never grpc or the generated protobuf code.
"""
