"""The protocol on the wire: conversions between its dataclasses and the cascade.v1 protobuf
messages (``convert``), and the checks on what reaches a pod's gRPC port before anything is
allocated (``validation``)."""
