"""What a client asks for, as either API states it (HTTP or gRPC), validated once and mapped to
a generation's settings: the request fields (``options``), the one mapping (``mapping``),
structured outputs, predicted outputs and the chat encoding."""
