"""Speculation statistics, per request and per engine. Plain Python: the router keeps these too."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SpecStats:
    rounds: int = 0                  # verifications
    tokens: int = 0                  # tokens committed by those verifications (bonus/correction included)
    accepted: list[int] = field(default_factory=list)   # accepted[i]: rounds whose (i+1)-th token was accepted
    offered: list[int] = field(default_factory=list)    # offered[i]: rounds that drafted an (i+1)-th token
    reached: int = 0                 # drafted tokens that were examined (up to and including the first reject)
    cache: dict[str, int] = field(default_factory=dict)    # lookups by reason: hit, no_entry, late, stale, forced
    backups: dict[str, int] = field(default_factory=dict)  # backups used: jit, ngram, none
    waits: dict[str, int] = field(default_factory=dict)    # late lookups that waited for the draft's entries, by
                                                           # how the wait ended: hit, no_entry, failed

    def record_round(self, proposed: int, accepted: int, committed: int) -> None:
        self.rounds += 1
        self.tokens += committed
        self.reached += min(accepted + 1, proposed)
        if len(self.offered) < proposed:
            grow = proposed - len(self.offered)
            self.offered += [0] * grow
            self.accepted += [0] * grow
        for i in range(proposed):
            self.offered[i] += 1
            self.accepted[i] += i < accepted

    def count(self, table: str, key: str) -> None:
        d = getattr(self, table)
        d[key] = d.get(key, 0) + 1

    def merge(self, other: "SpecStats") -> None:
        self.rounds += other.rounds
        self.tokens += other.tokens
        self.reached += other.reached
        for i in range(len(other.offered)):
            if i >= len(self.offered):
                self.offered.append(0)
                self.accepted.append(0)
            self.offered[i] += other.offered[i]
            self.accepted[i] += other.accepted[i]
        for table in ("cache", "backups", "waits"):
            mine = getattr(self, table)
            for k, v in getattr(other, table).items():
                mine[k] = mine.get(k, 0) + v

    @property
    def tokens_per_round(self) -> float:
        return self.tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / o if o else 0.0 for a, o in zip(self.accepted, self.offered)]

    @property
    def acceptance_rate(self) -> float:
        """Per-token acceptance a: accepted drafted tokens over drafted tokens that were reached."""
        return sum(self.accepted) / self.reached if self.reached else 0.0

    @property
    def looked_up(self) -> int:
        """Cache lookups of drafted rounds, the forced first rounds not counted (the rates' denominator)."""
        return sum(v for k, v in self.cache.items() if k != "forced")

    @property
    def hit_rate(self) -> float:
        return self.cache.get("hit", 0) / self.looked_up if self.looked_up else 0.0

    @property
    def served(self) -> int:
        """Rounds whose speculation came from the cache: hits at once, and late lookups whose wait found their entry."""
        return self.cache.get("hit", 0) + self.waits.get("hit", 0)

    @property
    def backed_up(self) -> int:
        """Looked-up rounds that took a backup speculation (a miss, a late entry whose wait found none, the forced
        first round)."""
        return sum(self.cache.values()) - self.served

    @property
    def served_rate(self) -> float:
        """Lookups whose round ran from the cache, at once or after waiting for the draft's entries (`waits`)."""
        return self.served / self.looked_up if self.looked_up else 0.0

    def as_dict(self) -> dict:
        return {"rounds": self.rounds, "tokens": self.tokens, "tokens_per_round": round(self.tokens_per_round, 4),
                "acceptance_rate": round(self.acceptance_rate, 4),
                "acceptance_per_position": [round(x, 4) for x in self.acceptance_per_position],
                "cache": dict(self.cache), "hit_rate": round(self.hit_rate, 4),
                "served_rate": round(self.served_rate, 4), "backups": dict(self.backups),
                "waits": dict(self.waits)}
