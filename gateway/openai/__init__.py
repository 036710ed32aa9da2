"""The OpenAI-compatible API's shapes: request models and response builders, structured outputs
and tools, server-sent events, streamed text and stop strings, log-probabilities, echo,
several choices, the per-round extension and OpenAI-style errors."""
