"""Closed forms from the SSD paper used to size speculation and to report against a bound.

* ``expected_tokens(a, K)``: tokens one round commits when each of K drafted tokens is accepted
  independently with probability ``a`` (accepted prefix plus the correction or bonus token),
  ``(1 - a^(K+1)) / (1 - a)``; ``K + 1`` at ``a = 1``.
* ``predicted_speedup`` (Theorem 7): tokens per unit of verify time relative to autoregressive decoding,
  ``[p_hit E_hit + (1-p_hit) E_miss] / [p_hit max(1, T_p) + (1-p_hit)(1 + T_b)]``, with ``T_p`` and
  ``T_b`` the primary and backup speculation latency in units of one verify.

Plain Python: the router imports this module.
"""
from __future__ import annotations

__all__ = ["expected_tokens", "predicted_speedup"]


def expected_tokens(a: float, K: int) -> float:
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance rate must be in [0, 1], got {a}")
    if K < 0:
        raise ValueError(f"K must be >= 0, got {K}")
    if a == 1.0:
        return float(K + 1)
    return (1.0 - a ** (K + 1)) / (1.0 - a)


def predicted_speedup(p_hit: float, E_hit: float, E_miss: float, T_p: float, T_b: float) -> float:
    if not 0.0 <= p_hit <= 1.0:
        raise ValueError(f"p_hit must be in [0, 1], got {p_hit}")
    if T_p < 0 or T_b < 0:
        raise ValueError(f"latencies must be >= 0, got T_p={T_p}, T_b={T_b}")
    tokens = p_hit * E_hit + (1.0 - p_hit) * E_miss
    time = p_hit * max(1.0, T_p) + (1.0 - p_hit) * (1.0 + T_b)
    return tokens / time
