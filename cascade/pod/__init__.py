"""What the model pods (drafter and verifier) share on top of the core and the gRPC plumbing:
the model thread, the command line, and the conversions of drafts and verdicts to messages."""
