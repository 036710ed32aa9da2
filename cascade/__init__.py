"""Cascade core: exact speculative decoding shared by the drafter, verifier and gateway."""

__version__ = "0.1.0"
