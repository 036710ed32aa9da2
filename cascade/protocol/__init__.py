"""The protocol layer: what a generation asks for and what a round reports, with no torch.

On top: sampling, drafting and acceptance settings, the length rules, grammars, token trees and
the acceptance counters and round statistics. ``request``: the one validated mapping from an API
request (HTTP or gRPC) to those settings, with the chat encoding. ``wire``: the protobuf
conversions of all of these and the checks on what reaches a pod. The settings import neither
``request`` nor ``wire``; the gateway imports this layer and never the core.
"""
