"""The draft steered by a request's grammar (structured output): a part of `ssd.engine.draft.DraftWorker`.

The target masks its distribution to the grammar at every position it verifies, so a drafted token outside the
grammar is always rejected. A constrained sequence's draft therefore keeps its own `ssd.constraints.Matcher`,
advanced by the committed output as the target's is, and masks every proposal with the grammar's allowed tokens
after the path it extends: a JIT's steps after the tokens drafted so far, SSD's forks (t* after j accepted
tokens of the speculation being verified) and each branch's chain after its fork. Forks for outcomes that cannot
come back (after a speculated token the grammar refuses) are dropped.

Exactness never depends on this: the draft only proposes; q (masked, so it sums to one over allowed tokens) is
what travels with a sampled proposal and what verification divides by. So the draft steers on a best-effort
basis: a draft without a grammar tokenizer, or whose matcher refuses the grammar or a committed token, drafts
that sequence unsteered (logged), which costs acceptance and nothing else.
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from ssd.constraints import Constraint, Matcher

log = logging.getLogger(__name__)


def follow(tokenizer, constraint: Constraint | None, vocab_size: int, output: list[int]) -> Matcher | None:
    """A matcher for a constrained sequence, advanced by its committed `output`; None: not steered."""
    if constraint is None or tokenizer is None:
        return None
    try:
        matcher = Matcher(tokenizer, constraint, vocab_size)
        matcher.commit(output)
        return matcher
    except (ValueError, RuntimeError) as err:
        log.warning("draft: not steering a %s sequence: %s", constraint.kind, err)
        return None


def advance(matcher: Matcher | None, tokens: list[int]) -> Matcher | None:
    """The matcher after newly committed tokens (None once it cannot follow them)."""
    if matcher is None:
        return None
    try:
        matcher.commit(tokens)
        return matcher
    except RuntimeError as err:
        log.warning("draft: no longer steering a sequence: %s", err)
        return None


def proposal_rows(matchers: list[Matcher | None], paths: list[list[int]], vocab_size: int) -> torch.Tensor | None:
    """[rows, V] bool: the tokens each proposal may take after its path (every token for a row not steered, or
    whose path leaves the grammar); None when no row is steered."""
    if not any(m is not None for m in matchers):
        return None
    rows = np.ones((len(matchers), vocab_size), dtype=bool)
    for r, (m, path) in enumerate(zip(matchers, paths)):
        if m is not None and (mask := m.mask_after(path)) is not None and mask.any():
            rows[r] = mask
    return torch.from_numpy(rows)


def fork_rows(matchers: list[Matcher | None], specs: list[list[int]], vocab_size: int) -> torch.Tensor | None:
    """[sum(K_b + 1), V] bool, the glue's rows in order: the t* a sequence may get after j = 0..K_b accepted tokens
    of its speculation; no token after a speculated token the grammar refuses (that outcome cannot come back).
    None when no sequence is steered."""
    if not any(m is not None for m in matchers):
        return None
    rows = np.ones((sum(len(sp) + 1 for sp in specs), vocab_size), dtype=bool)
    r = 0
    for m, sp in zip(matchers, specs):
        if m is not None:
            for j in range(len(sp) + 1):
                mask = m.mask_after(sp[:j])
                rows[r + j] = False if mask is None else mask
        r += len(sp) + 1
    return torch.from_numpy(rows)


def steer(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """`logits` with -inf outside each row's allowed tokens. A row whose allowed tokens all have -inf logits (a
    draft vocabulary without them) becomes uniform over them, so q stays a distribution."""
    allowed = allowed.to(logits.device)
    out = logits.float().masked_fill(~allowed, float("-inf"))
    dead = (out == float("-inf")).all(-1) & allowed.any(-1)
    if dead.any():
        out[dead] = torch.zeros_like(out[dead]).masked_fill(~allowed[dead], float("-inf"))
    return out


def keep_allowed(forks_per_seq: list[list[tuple[int, int]]], specs: list[list[int]],
                 allowed: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Each sequence's forks (j, t*) without those the grammar rules out (`allowed`: `fork_rows`)."""
    out, r = [], 0
    for forks, sp in zip(forks_per_seq, specs):
        out.append([(j, t) for j, t in forks if allowed[r + j, t]])
        r += len(sp) + 1
    return out
