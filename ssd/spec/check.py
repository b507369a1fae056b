"""What makes drafted tokens verifiable (torch-free: the router checks what drafts send, the target what it is
asked to verify).

``speculation_problem(tokens, proposal, vocab)`` says why drafted ``tokens`` with their proposal rows cannot be
verified over a vocabulary of ``vocab`` ids, or returns None when they can. ``proposal`` is one sparse row
``(ids, probs)`` per token, or None (greedy: nothing to check beyond the ids). A token must lie in its own row's
support with a positive probability: verification divides by q of that token.

``proposal_problem(tokens, proposal)`` is the shape alone, whatever the vocabulary: one row per token, as many
probabilities as ids in each row, each token in its own row's support (what the speculation cache holds to).
"""
from __future__ import annotations


def speculation_problem(tokens, proposal, vocab: int) -> str | None:
    bad = next((t for t in tokens if not 0 <= t < vocab), None)
    if bad is not None:
        return f"token {bad} lies outside the vocabulary [0, {vocab})"
    if proposal is None:
        return None
    if len(proposal) != len(tokens):
        return f"{len(proposal)} proposal rows for {len(tokens)} tokens"
    for t, (ids, probs) in zip(tokens, proposal):
        if any(not 0 <= i < vocab for i in ids) or t not in ids or probs[ids.index(t)] <= 0:
            return f"token {t} lies outside its proposal row's support (or the row outside the vocabulary)"
    return None


def proposal_problem(tokens, proposal) -> str | None:
    if proposal is None:
        return None
    if len(proposal) != len(tokens):
        return f"proposal has {len(proposal)} rows for {len(tokens)} tokens"
    for (ids, probs), t in zip(proposal, tokens):
        if len(ids) != len(probs):
            return "each proposal row needs as many probabilities as token ids"
        if t not in ids:
            return f"token {t} is outside the support it was drawn from"
    return None
