"""The services under load and over a slow link (`cascade bench load`, `rtt`, `admission`, `shared-
prefill`, `prefix-chat`, `grpc-floor`)."""
