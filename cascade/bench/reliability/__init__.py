"""Faults under load on real processes (`cascade bench chaos`, `faults`, `redis-durability`)."""
