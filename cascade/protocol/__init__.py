"""The protocol layer: what a generation asks for and what a round reports, with no torch.

Request, sampling, drafting and acceptance settings, the length rules, the one validated mapping
from an API request (HTTP or gRPC) to settings, the acceptance counters, the chat encoding and the
protobuf conversions of all of these. The gateway imports this layer and never the core.
"""
