"""The drafter pod's settings: the shared pod flags and its own, each declared once
(``python -m drafter_service``'s command line is generated from this class)."""

from __future__ import annotations

from pydantic import Field

from cascade.core.memory.candidates import MemoryLimits
from cascade.pod.settings import PodSettings
from cascade.serving.settings_cli import env
from drafter_service.speculation import SpeculationConfig, SpeculationMode


class DrafterPodSettings(PodSettings):
    """Serve the drafter model: run draft -> verify loops for sessions."""

    port: int = Field(50061, ge=0, le=65535, description="Port to bind (0 picks a free one).")
    allowed_verifiers: str | None = Field(None, description="Comma-separated host:port verifiers "
                                          "this drafter may dial besides those in the registry "
                                          "(--redis-url). With neither, it dials any address a "
                                          "request names.",
                                          json_schema_extra=env("CASCADE_ALLOWED_VERIFIERS"))
    inject_delay_ms: float = Field(0.0, ge=0, description="Testing: one-way delay added to every "
                                   "message to and from the verifier, as if it were this far "
                                   "away.")
    inject_jitter_ms: float = Field(0.0, ge=0, description="Testing: uniform jitter (+-) on that "
                                    "delay.")
    speculate: SpeculationMode = Field(SpeculationMode.AHEAD, description="Draft while the "
                                       "verifier verifies: 'cache' pre-drafts the next block for "
                                       "the likeliest outcomes, 'ahead' also sends the best of "
                                       "them to the verifier before the verdict; 'off' drafts "
                                       "after each verdict.",
                                       json_schema_extra=env("CASCADE_SPECULATE"))
    speculate_fanout: int = Field(6, ge=1, le=64, description="Guessed next tokens per drafted "
                                  "position.")
    speculate_blocks: int = Field(12, ge=1, le=64, description="Blocks pre-drafted per round at most.")
    send_ahead: int = Field(12, ge=0, description="With --speculate ahead: pre-drafted blocks "
                            "sent before the verdict.")
    miss_draft_tokens: int = Field(0, ge=0, le=32, description="When no pre-draft guessed the outcome, "
                                   "draft at most this many tokens while the verifier waits "
                                   "(0: k).")
    speculate_max_sessions: int = Field(4, ge=1, description="Speculate only while this drafter "
                                        "runs at most this many sessions.")
    memory_max_sequences: int = Field(MemoryLimits.max_sequences, ge=0, description="Finished "
                                      "generations the speculation memory keeps (the oldest are "
                                      "evicted; 0 turns the memory off on this pod). It follows "
                                      "the cluster's stream in --redis-url's Redis.")
    memory_max_tokens: int = Field(MemoryLimits.max_tokens, ge=1, description="Tokens the "
                                   "speculation memory keeps (about 40 bytes each).")
    invariant: bool = Field(True, description="Batch-invariant drafter passes: a proposal does "
                            "not depend on how the drafter's cache was fed or which guesses were "
                            "drafted beside it (reproducible drafts; --no-invariant: the plain "
                            "pass).")

    def speculation(self) -> SpeculationConfig:
        return SpeculationConfig(self.speculate, self.speculate_fanout, self.speculate_blocks,
                                 self.send_ahead, self.miss_draft_tokens,
                                 self.speculate_max_sessions)
