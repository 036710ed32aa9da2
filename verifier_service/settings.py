"""The verifier pod's settings: the shared pod flags and its own, each declared once
(``python -m verifier_service``'s command line is generated from this class)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

from cascade.core.verify.compiled import check_mode
from cascade.pod.settings import PodSettings
from cascade.serving.mesh.security import SESSION_KEY_HELP
from cascade.serving.settings_cli import env
from verifier_service.scheduler import VerifierSettings

_DEFAULTS = VerifierSettings()
CompileMode = Annotated[str, AfterValidator(check_mode)]
"""off, on or auto (``cascade.core.verify.compiled``)."""


class VerifierPodSettings(PodSettings):
    """Serve the target model: verify draft blocks from many sessions in batched passes, or
    decode alone (k = 0)."""

    port: int = Field(50051, ge=0, le=65535, description="Port to bind (0 picks a free one).")
    kv_tokens: int = Field(0, ge=0, description="KV budget in tokens shared by all sessions, in "
                           "blocks of 64 (0: 40 % of the memory available at start-up, at most "
                           "64 full-length sequences).")
    max_batch_tokens: int = Field(_DEFAULTS.max_batch_tokens, ge=1, description="Most tokens "
                                  "one engine step feeds.")
    max_wait_ms: float = Field(_DEFAULTS.max_wait_ms, ge=0, description="How long a free model "
                               "thread waits for the last step's sessions to send their next "
                               "blocks before stepping without them.")
    batching: bool = Field(True, description="Verify blocks from many sessions in one pass "
                           "(--no-batching: one block per pass).")
    invariant: bool = Field(True, description="Batch-invariant passes: a position's logits are "
                            "bit-identical whatever else the pass holds, so greedy output equals "
                            "the target's own one-token decoding for any draft length, batch or "
                            "load (--no-invariant: the plain pass, up to 10 % faster in "
                            "bfloat16, 50 % in float32 at one session without speculation).")
    share_prefixes: bool = Field(True, description="A new session takes the keys and values of "
                                 "the prompt prefix a live or ended session of its scope holds "
                                 "(n choices of one prompt, a chat's next turn, a common system "
                                 "prompt) instead of computing them again (--no-share-prefixes: "
                                 "every session computes its whole prompt).")
    admission_wait_s: float = Field(_DEFAULTS.admission_wait_s, ge=0, description="How long a "
                                    "session waits for KV memory before RESOURCE_EXHAUSTED.")
    max_kv_share: float = Field(_DEFAULTS.max_kv_share, ge=0.01, le=1.0, description="Most of "
                                "the KV budget one API key's sessions may hold while another "
                                "key's sessions wait for memory (1: no share).")
    compile: CompileMode = Field(_DEFAULTS.compile, description="Compile the target's step with "
                         "torch.compile (one graph per step, attention and packed products "
                         "opaque): on, off, or auto (on a GPU only). The first start compiles "
                         "for minutes on a few CPU cores (progress logged), later starts reuse "
                         "the kernels cached per model, dtype and machine; measured 0-15 % "
                         "faster per step on a CPU (docs/benchmarks.md).",
                         json_schema_extra=env("CASCADE_COMPILE"))
    tensor_parallel: int = Field(1, ge=1, description="Split the target over this many ranks "
                                 "(processes this pod starts; one GPU each with --device cuda): "
                                 "attention heads and MLP columns by the model's tensor-parallel "
                                 "plan, the KV cache by heads. The target's attention and "
                                 "key/value heads must divide by it.",
                                 json_schema_extra=env("CASCADE_TENSOR_PARALLEL"))
    session_key_file: Path | None = Field(None, description=SESSION_KEY_HELP,
                                          json_schema_extra=env("CASCADE_SESSION_KEY_FILE"))

    def verifier(self) -> VerifierSettings:
        """The scheduler's settings these flags set."""
        return VerifierSettings(self.kv_tokens or None, self.admission_wait_s,
                                self.max_batch_tokens, self.max_wait_ms, self.batching,
                                self.invariant, self.share_prefixes, self.max_kv_share,
                                self.compile)
