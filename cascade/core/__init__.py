"""The core: exact speculative decoding with torch and transformers, and nothing of serving.

Sampling, the acceptance rules (and their slow references), the KV-cached model runner, the
proposers, per-sequence verification and the in-process loop. It imports the protocol layer and
never grpc or the generated protobuf code.
"""
