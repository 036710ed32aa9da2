"""Gateway: the OpenAI-compatible HTTP API and gRPC Generate stream in front of Cascade."""
