"""Sessions behind every API: the orchestrator that assigns pods and moves failed sessions,
the pod choice (least-loaded, prefix affinity, cooling), the session's lease, and its state in
Redis (record, committed tokens, epochs, replication)."""
