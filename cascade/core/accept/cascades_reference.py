"""Slow, obvious versions of the speculative-cascade rules, one position at a time, written from
the formulas in cascade.core.accept.cascades' docstring; they exist only to check it."""

from __future__ import annotations


def cascade_target_reference(name: str, alpha: float, p_decide: list[float],
                             q_decide: list[float], p: list[float], q: list[float],
                             drafted: int) -> tuple[list[float], bool]:
    """(pi, deferred) at one position."""
    max_p, max_q = max(p_decide), max(q_decide)
    if name in ("chow", "diff", "opt"):
        tv = sum(max(0.0, qv - pv) for qv, pv in zip(q_decide, p_decide))
        threshold = {"chow": 1 - alpha, "diff": max_p - alpha, "opt": max_p - alpha * tv}[name]
        keep = max_q >= threshold
        return (list(q) if keep else list(p)), not keep
    if name == "token_v1":
        accepted = [qv >= max_p - alpha for qv in q_decide]
    elif name == "token_v2":
        accepted = [pv >= max_p - alpha for pv in p_decide]
    else:
        accepted = [pv >= (1 - alpha) * max_p for pv in p_decide]
    kept = sum(qv for qv, a in zip(q, accepted) if a)
    pi = [(qv if a else 0.0) + max(0.0, 1 - kept) * pv for qv, pv, a in zip(q, p, accepted)]
    return pi, not accepted[drafted]
