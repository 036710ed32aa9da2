"""Shared gRPC service plumbing: server lifecycle, error mapping, pod registry.

Unlike the rest of the core, this package imports grpc; the pure core never imports it.
"""
