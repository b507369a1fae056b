"""Adaptive speculation: the K that maximises predicted throughput, from what the router measures.

Contract
--------
* ``AdaptiveK(k_max, mode)`` folds in measurements as they arrive:
  - ``observe_round(offered, accepted, source, shared=False, peers=1)``: one verification of ``offered`` draft tokens
    (from the draft: cache entries or JIT, not n-gram) of which the first ``accepted`` were accepted. Kept per
    position as the conditional acceptance ``a_i = P(token i accepted | tokens 1..i-1 accepted)``, an EMA with a
    prior: over all rounds, and per source once that source has been seen. Sources: "cache" (a cache entry, ssd),
    "jit" (a JIT drafted for a cache miss, ssd) and "plain" (a JIT with no speculation behind it: every sd round,
    and ssd's by JIT only). The three differ: a miss is an outcome the speculation did not foresee, after which
    the draft can accept less; a cache entry is drafted without the target's features. First position, one run at
    batch 4-8: miss JIT 0.45-0.49, cache 0.52-0.55; another at batch 16: miss JIT 0.51-0.57, cache 0.43; another at
    batch 4: miss JIT 0.48, cache 0.415, and sd's (plain) rounds 0.53. By JIT only, an ssd round is an sd round, so
    that choice is weighed with the "plain" acceptance. Weighed with ssd's rounds over all (its cache entries and
    its misses' JITs: 0.445 in that run) it looked 6-8% slower than it runs, so ssd kept to the cache or plain
    decoding at batch 4 and ran 0.92x sd there (in both passes of a run). ``shared``: a plain round of the other
    mode (the router feeds sd's plain rounds to ssd's policy and ssd's to sd's: the same draft and target draft
    and verify them alike); it counts for that source only, not for this mode's acceptance over all rounds.
    ``peers``: the drafted rounds of the verify batch it came in. Each weighs 1/peers of a round, so the estimate
    spans the same number of verify batches at every batch size.
  - ``observe_verify(tokens, seconds, overhead, seqs)``: one verify batch of ``tokens`` positions (sum over its
    ``seqs`` sequences of drafted + 1), the target's compute for it and what the round trip took beyond that, kept
    in a ``CostTable``: the median of the last ``window`` (9) measurements at each shape (n, seqs) and at each n
    seen recently; a size not measured lately is read off the measured n either side of it (beyond the largest,
    along the least-squares slope of them all), and only with fewer than two measured from a line
    ``t_v(n) = c0 + c1 n`` (``LinearEma``) over the latest verifies. The shapes of one number of sequences are read
    on a fit that does not fall as n grows (``monotone``): more positions are never less work, and a deeper K
    measured cheaper than a shallower one by noise was chosen for it. Not that line once the table holds two: it
    follows the sizes in use, and at batch 16 on plain decoding and probes (16 and 19 positions) it read the noise
    between them as its slope, put 48 positions at 0.066 s against 0.055 for 16, and K = 2 went on where it ran
    about 0.75x plain decoding; such excursions kept adaptive SSD at 0.96-0.98x AR there over two series of runs
    (2026-12-05). The measured slope overstates what a larger batch adds (1-4 positions at batch 1 measure 1 ms
    a position, 16 to 64 at batch 16 about 0.9): a size never measured is not assumed cheap, and the explore
    rounds measure the neighbours of a K in use. A median, because a shared host
    stalls a verify now and then: a decayed mean took a tenth of each stall, and one stalled 4-position verify
    at batch 1 (0.0296 s among 0.026) made K = 3 predict slower than K = 2. Each measurement is kept relative to
    the host's speed then (``drift``: the median ratio of the last measurements to their shape's median), and
    every shape scales by the speed now: the host also slows for seconds at a time, and then only the sizes the
    choice runs are measured. Against stale figures for the others the choice looked dear: at batch 1 the 3- and
    4-position verifies read 0.030 and 0.034 s against 0.024 and 0.025 for 1 and 2, K = 3 went to K = 1 and
    stayed there most of a run (sd-auto 0.92x its usual speed; 2026-12-05). Per shape first: 16 positions as
    16 x 1 (0.0505 s in one run) and as 8 x 2 or 4 x 4 (attention over longer rows) cost differently, and a mean
    over all of them (0.0587) made plain decoding at batch 16 look dearer than it was and K = 1 chosen where it
    ran below plain.
    A table, because the cost is not a line in n on a CPU: a 2-row matmul can cost what a 1-row one does and a
    3-row one half again (ssd/models/linear.py), and that step decides between K = 1 and K = 3 at batch 1.
  - ``observe_draft_step(batch, seconds)``: one draft step (a JIT batch's time / K): a line in the batch size.
  - ``observe_jit(roundtrip, compute)``: one JIT as the router saw it; what the round trip took beyond the
    draft's compute (the hop: ZeroMQ, the draft's queue) is kept as the median of the last 9.
  - ``observe_lookup(hit, batch, k)``: whether a speculation-cache lookup hit (ssd mode), in a batch of ``batch``:
    kept over all lookups and per batch-size bucket (the buckets below), which the model reads once its bucket
    has seen ``HIT_TRUSTED`` lookups. The draft's forks a round are shared by the sequences it speculates for,
    so the hit rate falls as the batch grows: 0.73 at batch 1, 0.35 at 16 in one run, where the rate over all
    lookups (mostly batch 1-4's) still said 0.6 and made K = 1 from the cache look faster than plain decoding.
    It is kept per K of the round looked up (``k``) as well, at each bucket; the model reads a K's own rate once
    trusted, and for a K not measured lately none above a shallower K's (``hit_at``).
  - ``observe_round_time(batch, k, seconds, cached)``: one sequence's round as it lived it (its previous outcome to
    this one) at K = k in a batch of ``batch``. Its ratio to the model's ``T(k)`` below, clamped to [0.5, 3], is kept
    per class (K = 0, K > 0 from the cache, K > 0 by JIT only) and batch-size bucket (1, 2-3, 4-7, 8-15, ...) as the
    median of the last ``realized_window`` (64) ratios, a window that starts with 16 ratios of 1 (the prior, which
    ages out). A median, not a decayed mean: the sequences of one verify batch share its time, so at batch 16 a
    mean decayed 0.97 a round moved 39% of the way to what one batch read. One slow batch (a stall of the host) took
    plain decoding's correction from 0.93 to 1.21 within a second, K = 1 read 31% faster than K = 0, and
    speculation went on where it ran below plain decoding (2026-12-06). A window of 64 ratios is four verify batches
    at batch 16 and 64 rounds at batch 1; a lasting change is followed within half of it, about as fast as the
    decayed mean followed one. The correction multiplies
    the model's prediction for that class and bucket: the model holds the verify, the draft and the hop, not the
    waits a real round has on top (a verify held for its batch's JITs, sequences out of step); in one run at batch
    8 on the default pair SD rounds took 0.34 s where the model said 0.29, and speculation stayed on where plain
    decoding was 1.2x faster (another run measured 1.01 there). Per bucket, so what batch 8 taught does not turn
    speculation off at batch 1. A class not yet timed in a bucket takes another class's correction there, not
    none: most of what the model misses (the router's work on a round, the waits) falls on all. Left at 1, plain
    rounds timed at 1.14x at batch 14 made an untimed K = 1 look 13% faster, and speculation went on where it ran
    below plain decoding. Plain rounds take JIT only's, then the cache's (its rounds also hold the draft's work beside
    the target's); a speculating class takes the largest of the others' timed there, since it waits for all a plain
    round waits for and for JITs besides: taking plain decoding's 0.99-1.07 at batch 16 where rounds from the cache
    read 1.13-1.48, K > 0 by JIT only went on for a few rounds at a time and ran below plain decoding. Timed, a
    speculating class's own correction still counts for no less than plain decoding's: only the running class is
    timed, and in a slow stretch plain decoding's rose to 1.30 against the 0.985 a pinned K = 3 run had left the
    cache's, which made K = 1 look 12% faster at batch 16.
* ``choose(batch)`` returns the K in ``0..k_max`` that maximises the predicted tokens per second of a batch of
  ``batch`` sequences (Theorem 7 with measured terms), and in ssd mode whether its rounds speculate into the cache
  (``cached``) or draft only by JIT, as sd does:

      E(K) = 1 + a_1 + a_1 a_2 + ... + a_1...a_K                 (tokens per sequence per round, plain rounds';
             in ssd mode from the cache h E_cache(K) + (1 - h) E_jit(K), each from its own source's rounds)
      T(K) = c(batch, K) (t_v(batch (K + 1)) + D(K))              (seconds per round; c: realized / model)
      D(K) = hop + K t_d(batch)                        in sd mode, and ssd mode by JIT only (a JIT before every verify)
           = (1 - h^batch) (hop + K t_d(batch (1 - h)))   in ssd mode from the cache (h = hit rate)

  From the cache only a miss needs a JIT draft, but a verify batch waits for its sequences' JITs (the
  router's hold), so a round waits whenever any of its ``batch`` sequences missed: ``1 - h^batch``, which
  nears 1 quickly as the batch grows. The wait is a JIT's round trip, not only its compute: ``hop`` is measured.
  By JIT only the draft does no work while the target verifies: at batch 4-16 on two cores its speculation slowed
  the target's verify (0.097 against SD's 0.0935 s at batch 16) and hit in only a third to a half of the rounds,
  and SSD at a fixed K ran 1-8% below SD there. Which of the two pays is left to the measured terms.
  K = 0 is plain decoding (E = 1, no draft work): speculation is turned off where it does not pay, which
  depends on the batch size through ``t_v`` and ``t_d``. ``choose(batch, current)`` keeps ``current`` unless
  another K is predicted faster by more than ``margin`` (5%): a switch has costs the formula does not hold (a
  speculation cache gone cold while K was 0, the verify cost of a size not measured lately), and where two
  K are predicted within a few percent of each other, flipping between them paid those costs for nothing.
  A K > 0 is a candidate at all only where it is predicted more than ``margin`` faster than K = 0: speculation
  has costs of its own the formula does not hold either. Its sequences finish in different rounds, so verify
  batches run part-full (in one run at batch 4, 3.6 sequences per verify batch against plain decoding's 3.97),
  and a batch waits for the JITs of its slowest members. At batch 4 the model put K = 1 within 1% of K = 0,
  the margin kept K = 1 in use, and adaptive SSD ran 0.87x plain decoding.
  To turn speculation on from K = 0 takes more than the margin where it has just failed (``entry_margin``): each
  stint of speculation that began at K = 0 and ended within ``short_stint`` (64) decisions at the same batch-size
  bucket doubles the margin for the next one there, up to ``entry_backoff`` (2) times (5%, 10%, 20%); a stint that
  lasts, or ``backoff_relax`` (1024) decisions without a short one, puts it back. Where the two are predicted within
  a few percent, the measured terms' noise crossed one threshold both ways: at batch 16 speculation went on and off
  15 times in 11 s, on predicted gains of 5-11% that ran below plain decoding. A stint that ends at another
  bucket ended with the batch, and counts for neither. A batch that moves to another bucket starts from the K
  last chosen there (a run's ramp through small batches chose K = 3, and the next run's first choice at batch 16
  then kept K = 1 on the margin alone).
* From K = 0, ``choose`` does not turn speculation on at a verify shape this batch never measured
  (``CostTable.known``) while plain decoding's is measured; ``measure_k`` names
  the K, and the planner runs the whole batch at it until its size is trusted. At batch 16 a probe (one sequence
  at K = 3: 19 positions) measured 19 below 16 on a swinging host, 32 was read along a slope that batch 1's
  memory-bound verifies flattened, K = 1 was predicted 20% faster and 32 positions cost 1.5-2 times 16; at
  batch 15, 30 positions measured as 8 sequences of about 4 (0.104 s, where 15 of 2 cost about 0.15) made K = 1
  look 37% faster (2026-12-06). A measuring round of 16 at K = 1 costs about what the tokens it makes save.
* While K = 0 is chosen, ``probe(rounds_since_probe)`` says when a verify batch's sequences should run one
  round at ``k_max`` anyway, so the acceptance estimate stays current and speculation comes back when the draft
  starts paying (a different kind of text, a better draft). The router counts rounds and decides per verify
  batch, not per sequence (ssd/round/planner.py), so a batch probes together and stays one forward. The interval
  starts at ``probe_every`` rounds and doubles with each probe that leaves speculation off, up to
  ``max_probe_every`` (a draft that never pays costs ever less); it returns to ``probe_every`` as soon as K > 0 is
  chosen again. ``probe_due`` asks the same without counting.
* While K > 0 is chosen, ``explore(rounds_since_explore, k)`` says when a batch should run one round at a
  neighbour of the choice instead (K + 1 and K - 1 in turn, every ``explore_every`` rounds): it measures the
  verify cost at the neighbours' sizes and the acceptance one position further, so a choice the prior or a
  stale line put in the wrong place moves (hill climbing on measured terms). Costs one round in
  ``explore_every`` at a nearby K.
* With no measurement yet, the prior (acceptance 0.6 per position, a draft step 1/6 of a verify) picks a
  K > 0: speculation starts on and turns itself down from evidence.

Output never depends on K (the target decides every token); only speed does. Plain Python: the router
imports this module.
"""
from __future__ import annotations

import bisect
import statistics
from collections import deque

from ssd.spec.backup import LinearEma

__all__ = ["AdaptiveK", "CostTable"]

PLAIN, CACHED, JIT = 0, 1, 2   # classes of rounds: K = 0, K > 0 from the speculation cache, K > 0 by JIT only
SOURCES = ("cache", "jit", "plain")   # where a round's draft tokens came from: a cache entry, a miss's JIT, a JIT
                                      # with no speculation behind it (sd, ssd by JIT only)
KIND_NAMES = {PLAIN: "K=0", CACHED: "K>0 cached", JIT: "K>0"}
HIT_TRUSTED = 50   # lookups a batch-size bucket (or a K at one) needs before its own hit rate is used
HIT_MAX_AGE = 2048   # decisions after which a K's hit rate not measured since is forgotten (`hit_at`)
HOP_WINDOW = 9     # JITs whose round trips beyond the draft's compute the hop is the median of
REALIZED_PRIOR = 16   # ratios of 1 a class's realized-time window starts with (they age out as rounds come)
MEASURE_TRIES = 3     # measuring rounds asked for one verify shape (`choose`), again `backoff_relax` decisions later
BORROW = {PLAIN: (JIT, CACHED), JIT: (PLAIN, CACHED), CACHED: (JIT, PLAIN)}   # an untimed class's stand-ins


class CostTable:
    """Seconds of a verify against the positions n it holds: per n measured at least `trusted` times within the last
    `max_age` observations, the median of its last `window` measurements, each taken relative to the host's speed
    when it was made and scaled by the speed now (`drift`); otherwise read off those (`between`), or with fewer than
    two the line over the latest measurements; plus the mean overhead of a round trip beyond the target's compute.
    The drift is the median of the last `drift_window` measurements over their shape's median: shorter than
    `window`, so it follows a host whose speed swings and the medians stay in one unit. With both nine, a shape
    measured every round followed the swing in its own median while one measured every 16th lagged it, and at batch
    1 the router's table put 3 and 4 positions 0-16% apart (their true gap is about 1%; 2026-12-07)."""

    def __init__(self, line: LinearEma | None = None, decay: float = 0.9, trusted: float = 2.0,
                 max_age: int = 2000, window: int = 17, drift_window: int = 5):
        if window < 1 or drift_window < 1:
            raise ValueError(f"window and drift_window must be >= 1, got {window} and {drift_window}")
        self.line = line if line is not None else AdaptiveK.default_verify_line()
        self.decay, self.trusted, self.max_age, self.window = decay, trusted, max_age, window
        self._recent: dict = {}   # key (n, or (n, seqs)) -> its last `window` measurements / the drift then
        self._medians: dict = {}  # key -> the median of `_recent[key]` (times `drift`: seconds now), kept per observe
        self._seen: dict = {}     # key -> the observation count when it was last measured
        self._clock = 0
        self.overhead = 0.0
        self._ratios: deque = deque(maxlen=drift_window)   # the last measurements over their shape's median
        self.drift = 1.0          # the host's speed now against the measurements' units: those ratios' median
        self._curve: tuple | None = None   # (the trusted n entries, sorted, in seconds now; their slope), per observe
        self._index: tuple | None = None   # `_shapes`, per observe

    def observe(self, n: int, seconds: float, overhead: float | None = None, seqs: int | None = None) -> None:
        """`seconds`: the target's compute for a verify of `n` positions (of `seqs` sequences, if known); `overhead`:
        what its round trip took beyond that (router hop and ZeroMQ, capped at `seconds`: time queued behind a
        prefill is not the verify's and does not depend on K), kept as one mean that every prediction adds.
        A shape already trusted also measures the drift: what it took now against its median (the drift is the
        median of the last `window` such ratios, so one stalled verify moves neither it nor a shape's median)."""
        if overhead is not None:
            self.overhead = self.decay * self.overhead + (1 - self.decay) * min(max(overhead, 0.0), seconds)
        self.line.observe(n, seconds)
        self._clock += 1
        keys = (n,) if seqs is None else ((n, seqs), n)
        if self._trusted(keys[0]) and self._medians[keys[0]] > 0:   # its own shape only: n alone mixes shapes
            self._ratios.append(seconds / self._medians[keys[0]])
            self.drift = statistics.median(self._ratios)
        for key in keys:
            if not self._fresh(key):   # not measured for `max_age` observations: what it held is forgotten
                self._recent[key] = deque(maxlen=self.window)
            self._recent[key].append(seconds / self.drift)
            self._medians[key] = statistics.median(self._recent[key])
            self._seen[key] = self._clock
        self._curve = self._index = None

    def _fresh(self, key) -> bool:
        return key in self._seen and self._clock - self._seen[key] <= self.max_age

    def _trusted(self, key) -> bool:
        return self._fresh(key) and len(self._recent[key]) >= self.trusted

    def measured(self, n: int, seqs: int | None = None) -> bool:
        """Whether `predict(n, seqs)` reads measurements of that size (else a guess: `between`, or the line)."""
        return any(self._trusted(key) for key in ((n, seqs), n))

    def known(self, n: int, seqs: int | None = None) -> bool:
        """Whether a verify of `n` positions of `seqs` sequences was measured, not guessed: that shape itself, or `n`
        measured only by verifies whose shape was not given. Not `n` measured at another number of sequences: 30
        positions as 8 sequences of about 4 cost 0.104 s in one run where 15 of 2 cost about 0.15, and speculation
        went on at batch 15 on a predicted gain of 37%. Nor read between two shapes of as many sequences: at batch 16
        the segment from a probe's 19 positions (15 sequences of 1 and one of 4) to 64 (16 of 4) put 32 (16 of 2) at
        1.34x plain decoding's 16, where it costs about 1.5x, and K = 1 went on predicted 6% faster (2026-12-06)."""
        if seqs is None:
            return self._trusted(n)
        if self._trusted((n, seqs)):
            return True
        return self._trusted(n) and n not in self._shapes()[1]

    def _shapes(self) -> tuple[dict[int, list[tuple[int, float]]], set[int]]:
        """(per number of sequences, its trusted shapes as sorted (n, seconds now) on the row's monotone fit
        (`monotone`); the n of the fresh shapes), kept until the next observation: the choice asks for them for every
        K it weighs, each verify batch."""
        if self._index is None:
            rows: dict = {}
            shaped = set()
            for key in self._recent:
                if isinstance(key, tuple) and self._fresh(key):
                    shaped.add(key[0])
                    if self._trusted(key):
                        rows.setdefault(key[1], []).append((key[0], self._medians[key] * self.drift,
                                                            len(self._recent[key])))
            for seqs, row in rows.items():
                row.sort()
                rows[seqs] = monotone(row)
            self._index = (rows, shaped)
        return self._index

    def _row_between(self, n: float, seqs: int) -> float | None:
        """Seconds now (without the overhead) of `n` positions of `seqs` sequences on its row's monotone fit: the
        trusted shape itself, else the segment joining the trusted shapes nearest below and above `n`; None where the
        shape is not trusted and has no trusted shape on one side."""
        row = self._shapes()[0].get(seqs, [])
        i = bisect.bisect_left(row, (n, -1.0))   # row[i]: the first shape at or above n
        if i < len(row) and row[i][0] == n:
            return row[i][1]
        if i == 0 or i == len(row):
            return None
        (n0, t0), (n1, t1) = row[i - 1], row[i]
        return t0 + (t1 - t0) * (n - n0) / (n1 - n0)

    def predict(self, n: float, seqs: int | None = None) -> float:
        """A verify of `n` positions (of `seqs` sequences): at that shape, else between the shapes of as many
        sequences either side of it, else at that n, else from the trusted n either side of it (`between`), else
        the line."""
        n_int = int(n)
        if seqs is not None:
            row = self._row_between(n, seqs)
            if row is not None:
                return row + self.overhead
        if n_int == n and self._trusted(n_int):
            return self._medians[n_int] * self.drift + self.overhead
        guess = self.between(n)
        return (self.line.predict(n) if guess is None else guess) + self.overhead

    def between(self, n: float) -> float | None:
        """A verify of `n` positions from the trusted costs by n (seconds now, without the overhead): on the segment
        joining the nearest measured n below and above it; beyond the smallest or largest, from that one along the
        least-squares slope of them all. None while fewer than two n are trusted. Not the line: it is fitted to the
        latest verifies, which are the sizes in use, so it reads noise between close sizes as the slope. At batch
        16 on plain decoding and probes (16 and 19 positions) it put 48 positions at 0.066 s, where 16 cost 0.055,
        and K = 2 predicted 23% faster than K = 0 where it runs about 0.75x (2026-12-05)."""
        if self._curve is None:
            pts = sorted((k, self._medians[k] * self.drift) for k in self._recent
                         if isinstance(k, int) and self._trusted(k))
            slope = max(0.0, statistics.linear_regression(*zip(*pts)).slope) if len(pts) >= 2 else 0.0
            self._curve = (pts, slope)
        pts, slope = self._curve
        if len(pts) < 2:
            return None
        if n > pts[-1][0]:
            return pts[-1][1] + slope * (n - pts[-1][0])
        if n < pts[0][0]:   # fewer positions than any measured: not below the line from zero through the first
            n0, t0 = pts[0]
            return max(t0 + slope * (n - n0), t0 * n / n0)
        i = bisect.bisect_left(pts, (n, -1.0))   # pts[i]: the first measured n at or above n
        n1, t1 = pts[i]
        if n1 == n:
            return t1
        n0, t0 = pts[i - 1]
        return t0 + (t1 - t0) * (n - n0) / (n1 - n0)

    def coefficients(self) -> tuple[float, float]:
        return self.line.coefficients()

    def table(self, seqs: int | None = None) -> dict[int, float]:
        """The trusted costs now, by n (with `seqs`, of verifies of that many sequences, as `predict` reads them: on the
        row's monotone fit; for logs and tests)."""
        if seqs is None:
            keys = sorted(k for k in self._recent if isinstance(k, int))
            return {n: self._medians[n] * self.drift for n in keys if self._trusted(n)}
        return dict(self._shapes()[0].get(seqs, []))


def monotone(row: list[tuple[int, float, int]]) -> list[tuple[int, float]]:
    """The verify costs of one number of sequences, sorted by positions n as (n, seconds, measurements), fitted to be
    non-decreasing in n (pool adjacent violators, weighted by the measurements): more positions of the same sequences
    are more rows through every product and longer attention, never less work, so a shape measured cheaper than one
    of fewer positions is noise. Read raw, such noise chose the deeper K: at batch 1 with the draft's K at 5, the
    medians put 6 positions at 0.0827 s against 0.0855 for 4 and 0.0878 for 5, and K = 5 was predicted 7% faster
    than K = 3 (2026-12-07); fitted, 4 to 6 read 0.0853 alike and K = 5 only what its extra tokens are worth."""
    blocks: list[list[float]] = []   # [weighted sum, weight, shapes pooled]
    for _, t, w in row:
        blocks.append([t * w, float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, w2, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += w2
            blocks[-1][2] += c
    fitted = [b[0] / b[1] for b in blocks for _ in range(b[2])]
    return [(n, t) for (n, _, _), t in zip(row, fitted)]


class AdaptiveK:
    def __init__(self, k_max: int, mode: str = "ssd", probe_every: int = 16, prior_acceptance: float = 0.6,
                 decay: float = 0.99, max_probe_every: int = 256, verify: CostTable | None = None,
                 draft_step: LinearEma | None = None, explore_every: int = 16, margin: float = 0.05,
                 realized_window: int = 64, entry_backoff: int = 2, short_stint: int = 64,
                 backoff_relax: int = 1024):
        """`verify` and `draft_step`: measurement lines shared with other users (the router feeds each once);
        by default this instance keeps its own. `entry_backoff`, `short_stint`, `backoff_relax`: the entry margin's
        backoff (`entry_margin`)."""
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        if mode not in ("sd", "ssd"):
            raise ValueError(f"mode must be sd or ssd, got {mode!r}")
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        if realized_window < 2 * REALIZED_PRIOR:
            raise ValueError(f"realized_window must be >= {2 * REALIZED_PRIOR}, got {realized_window}")
        if entry_backoff < 0 or short_stint < 1 or backoff_relax < 1:
            raise ValueError(f"entry_backoff must be >= 0, short_stint and backoff_relax >= 1, got {entry_backoff}, "
                             f"{short_stint}, {backoff_relax}")
        self.margin = margin
        self.entry_backoff, self.short_stint, self.backoff_relax = entry_backoff, short_stint, backoff_relax
        self.decisions = 0    # choose() calls so far: the clock of stints and of the backoff
        self._stint: tuple[int, int] | None = None   # speculation's current stint from K = 0: (bucket, its start)
        self._short: dict[int, tuple[int, int]] = {}  # bucket -> (short stints in a row, decision of the last)
        self.k_max, self.mode, self.probe_every, self.decay = k_max, mode, probe_every, decay
        self.max_probe_every = max(probe_every, max_probe_every)
        self.probe_interval = probe_every
        self.acceptance = [prior_acceptance] * k_max   # conditional, per position 1..k_max, all rounds
        self.by_source = {src: [prior_acceptance] * k_max for src in SOURCES}   # per source, once seen
        self.seen = {src: 0 for src in SOURCES}
        self.hit = 0.5 if mode == "ssd" else 0.0
        self.hit_by_bucket: dict[int, list[float]] = {}   # bucket -> [hit rate (EMA), lookups seen]
        self.hit_by_k: dict[tuple[int, int], list] = {}   # (bucket, K) -> [hit rate, lookups, decision of the last]
        self.cached = mode == "ssd"   # ssd: the choice's rounds speculate into the cache (else JIT only)
        self.verify = verify if verify is not None else CostTable()
        self.explore_every = explore_every   # 0: never explore
        self._explore_up = False
        self.draft_step = draft_step if draft_step is not None else LinearEma(prior_intercept=4e-3, prior_slope=4e-4)
        self.hop = 2e-3   # a JIT's round trip beyond the draft's compute, seconds (median; prior 2 ms)
        self._hops: deque = deque(maxlen=HOP_WINDOW)
        self.rounds = 0
        # realized / modelled round time, by (batch-size bucket, class: PLAIN, CACHED, JIT)
        self.realized: dict[tuple[int, int], float] = {}
        self.realized_window = realized_window
        self._realized_recent: dict[tuple[int, int], deque] = {}   # key -> its last round ratios (prior first)
        self.measure_k = 0   # the last choice's K to measure before turning speculation on (0: none; `choose`)
        self._measured_tries: dict[tuple[int, int], tuple[int, int]] = {}   # shape -> (rounds asked, decision)
        self._last_bucket: int | None = None   # the batch-size bucket of the last choice
        self._last_by_bucket: dict[int, int] = {}   # bucket -> the K last chosen there

    @staticmethod
    def default_verify_line() -> LinearEma:
        """Verify round trip in seconds against the positions in the batch, with its prior."""
        return LinearEma(prior_intercept=25e-3, prior_slope=1e-3)

    # ---- measurements ---------------------------------------------------------------------------
    def observe_round(self, offered: int, accepted: int, source: str | None = None, shared: bool = False,
                      peers: int = 1) -> None:
        """`peers`: the drafted rounds its verify batch held (this one included). Each weighs 1/peers of a round, so
        the acceptance decays by `decay` per verify batch, not per sequence. Decayed per sequence, at batch 16 the
        estimate spanned about six verify batches: its first position's standard error was about 0.035 and the
        tokens a round at K = 3 moved by 4% either way, as much as the margin. At batch 16 sd's choice went from
        K = 0 to K = 3 on acceptance read at 0.61-0.65 where its rounds accepted 0.52-0.57, and ran 0.80x plain
        decoding there (`bench/results/ssd_spr_s29_run2.json`, 2026-12-07). A probe's round (one sequence of the
        batch) weighs a whole round."""
        if offered <= 0 or (shared and source not in self.by_source):
            return
        d = self.decay ** (1.0 / max(1, int(peers)))
        vectors = []
        if not shared:
            self.rounds += 1
            vectors.append(self.acceptance)
        if source in self.by_source:
            self.seen[source] += 1
            vectors.append(self.by_source[source])
        for i in range(min(offered, self.k_max)):  # position i+1 was reached iff the first i were accepted
            if i > accepted:
                break
            for acc in vectors:
                acc[i] = d * acc[i] + (1 - d) * (1.0 if accepted > i else 0.0)

    def observe_verify(self, tokens: int, seconds: float, overhead: float | None = None,
                       seqs: int | None = None) -> None:
        if tokens > 0 and seconds > 0:
            self.verify.observe(tokens, seconds, overhead, seqs)

    def observe_draft_step(self, batch: int, seconds: float) -> None:
        if batch > 0 and seconds > 0:
            self.draft_step.observe(batch, seconds)

    def observe_jit(self, roundtrip: float, compute: float) -> None:
        """A JIT's round trip beyond the draft's compute: `hop` is the median of the last `HOP_WINDOW`, as the verify
        table's entries are medians. A decayed mean took a tenth of every stall: one JIT that waited 1.5 s behind a
        draft's restart or a long catch-up would add 0.15 s to every predicted JIT, and speculation went off."""
        if roundtrip > 0:
            self._hops.append(max(0.0, roundtrip - max(0.0, compute)))
            self.hop = statistics.median(self._hops)

    def observe_lookup(self, hit: bool, batch: int | None = None, k: int | None = None) -> None:
        """`k`: the K of the round whose outcome was looked up (its rate is kept per K too: `hit_at`)."""
        d, x = self.decay, 1.0 if hit else 0.0
        self.hit = d * self.hit + (1 - d) * x
        if batch is None:
            return
        self._fold_hit(self.hit_by_bucket.setdefault(self.bucket(batch), [0.0, 0]), x)
        if k is not None and k > 0:
            h = self.hit_by_k.get((self.bucket(batch), k))
            if h is None or self.decisions - h[2] > HIT_MAX_AGE:   # none, or forgotten: begins again
                h = self.hit_by_k[(self.bucket(batch), k)] = [0.0, 0, self.decisions]
            self._fold_hit(h, x)
            h[2] = self.decisions

    def _fold_hit(self, h: list, x: float) -> None:
        """One lookup into a rate kept as [rate, lookups, ...]: their plain mean until trusted, then an EMA like the
        rate over all lookups."""
        rate, n = h[0], h[1]
        h[0] = self.decay * rate + (1 - self.decay) * x if n >= HIT_TRUSTED else (rate * n + x) / (n + 1)
        h[1] = n + 1

    def hit_at(self, batch: int, k: int | None = None) -> float:
        """The hit rate the model takes at `batch`: its bucket's once trusted, else over all lookups. With `k`, the
        rate of rounds of that K at that bucket once trusted (and seen within `HIT_MAX_AGE` decisions); else that
        rate, but none above a shallower K's trusted one: a deeper speculation has more outcomes to cover and a
        longer chain to grow for each, so it hits no more often. With the draft's K at 5 on a 2-core host, rounds
        of K = 3 hit 0.67-0.69 of the time and of K = 5 0.34 (117 of 349 lookups found the draft late); one rate for
        all put K = 4 and 5 at K = 3's, the choice went there, and adaptive SSD read 17.1 tok/s against fixed K = 3's
        20.1-20.5 (`bench/results/hit_by_k_k5_d00cf0c.jsonl`). Kept per K, the choice drafted a fourth token in
        11-126 rounds of a run against 129-282, and read 0.88-1.11 of fixed K = 3 (mean 1.00) against 0.83-1.02
        (mean 0.93), in interleaved stacks (`bench/results/hit_by_k_ab_k5.jsonl`)."""
        b = self.bucket(max(1, batch))
        h = self.hit_by_bucket.get(b)
        base = h[0] if h is not None and h[1] >= HIT_TRUSTED else self.hit
        if k is None:
            return base
        own = self._hit_k(b, k)
        if own is not None:
            return own
        return min([base] + [r for kk in range(1, k) if (r := self._hit_k(b, kk)) is not None])

    def _hit_k(self, bucket: int, k: int) -> float | None:
        h = self.hit_by_k.get((bucket, k))
        if h is None or h[1] < HIT_TRUSTED or self.decisions - h[2] > HIT_MAX_AGE:
            return None
        return h[0]

    @staticmethod
    def bucket(batch: int) -> int:
        """Batch sizes 1, 2-3, 4-7, 8-15, ... share a realized-time correction."""
        return max(1, int(batch)).bit_length() - 1

    def kind(self, k: int, cached: bool | None = None) -> int:
        """The class of a round at K = k: PLAIN, CACHED (ssd, from the cache) or JIT (sd, or ssd by JIT only);
        `cached` None: the current choice's."""
        if k <= 0:
            return PLAIN
        cached = self.cached if cached is None else cached
        return CACHED if self.mode == "ssd" and cached else JIT

    def observe_round_time(self, batch: int, k: int, seconds: float, cached: bool | None = None) -> None:
        if seconds <= 0 or not 0 <= k <= self.k_max:
            return
        batch = max(1, batch)
        ratio = min(3.0, max(0.5, seconds / self.model_seconds(batch, k, cached)))
        key = (self.bucket(batch), self.kind(k, cached))
        recent = self._realized_recent.get(key)
        if recent is None:
            recent = self._realized_recent[key] = deque([1.0] * REALIZED_PRIOR, maxlen=self.realized_window)
        recent.append(ratio)
        self.realized[key] = statistics.median(recent)

    # ---- the decision ----------------------------------------------------------------------------
    def _acceptance(self, source: str) -> list[float]:
        return self.by_source[source] if self.seen[source] else self.acceptance

    @staticmethod
    def _expected(acceptance: list[float], k: int) -> float:
        total, p = 1.0, 1.0
        for a in acceptance[:k]:
            p *= a
            total += p
        return total

    def expected_tokens(self, k: int, cached: bool | None = None, batch: int = 1) -> float:
        if self.kind(k, cached) == CACHED:
            hit = self.hit_at(batch, k)
            return (hit * self._expected(self._acceptance("cache"), k)
                    + (1.0 - hit) * self._expected(self._acceptance("jit"), k))
        return self._expected(self._acceptance("plain"), k)

    def round_seconds(self, batch: int, k: int, cached: bool | None = None) -> float:
        """The model's round time corrected by what rounds of this class and batch size took; while none of this one
        was timed at this size, another class's correction there: for plain rounds the first of `BORROW`'s timed, for
        speculating ones the largest of the timed others'. A speculating round waits for all a plain round does and
        for JITs and out-of-step sequences besides: at batch 16 the JIT-only class, never timed there, read plain
        decoding's 0.99-1.07 while rounds from the cache read 1.13-1.48, and K > 0 by JIT only went on for a few rounds
        at a time where it ran below plain decoding (`bench/results/batch16_excursions.log`, 2026-12-05). For the same
        reason a speculating class's own correction counts for no less than plain decoding's there: only the running
        class is timed, so a slow stretch of the host raises its correction alone, and another's, timed minutes before
        (by a pinned run), stays. At batch 16 plain decoding's went to 1.30 in a slow stretch against the cache's 0.985
        from a pinned K = 3 run, K = 1 went on predicted 12% faster, and that run read 0.78x AR (2026-12-06)."""
        b, kind = self.bucket(batch), self.kind(k, cached)
        c = self.realized.get((b, kind))
        if c is None:
            timed = [self.realized[(b, other)] for other in BORROW[kind] if (b, other) in self.realized]
            if timed:
                c = timed[0] if kind == PLAIN else max(timed)
        elif kind != PLAIN and (b, PLAIN) in self.realized:
            c = max(c, self.realized[(b, PLAIN)])
        return self.model_seconds(batch, k, cached) * (1.0 if c is None else c)

    def model_seconds(self, batch: int, k: int, cached: bool | None = None) -> float:
        """The model's round time: the verify, and the draft's time a round waits for."""
        draft = 0.0
        kind = self.kind(k, cached)
        if kind == JIT:
            draft = self.hop + k * self.draft_step.predict(batch)
        elif kind == CACHED:
            hit = self.hit_at(batch, k)
            draft = (1.0 - hit ** batch) * (self.hop + k * self.draft_step.predict(max(1.0, batch * (1.0 - hit))))
        return self.verify.predict(batch * (k + 1), batch) + draft

    def throughput(self, batch: int, k: int, cached: bool | None = None) -> float:
        """Predicted tokens per second of a batch running K (from the cache or not: `cached`, None the choice's)."""
        return batch * self.expected_tokens(k, cached, batch) / self.round_seconds(batch, k, cached)

    def choose(self, batch: int, current: int | None = None) -> int:
        """The K of the highest predicted throughput (the smaller on a tie) among K = 0 and the K > 0 predicted
        more than `margin` faster than K = 0; `current` (the K in use), if among them, stays unless that one is
        predicted more than `margin` faster, and a current K > 0 stays against another K > 0 whose verify size at
        this batch was not measured lately (explore rounds measure it). In ssd mode each K > 0 is weighed from the
        cache and by JIT only, and `cached` is set to the choice's (the current one's stays unless another is more
        than `margin` faster). From K = 0, where plain decoding's verify size at this batch is measured and the best
        K > 0's is not (`CostTable.known`), that K is not chosen on the guess: `measure_k` names it, and the planner
        runs the whole batch at it (at most `MEASURE_TRIES` rounds per size, again `backoff_relax` decisions later)
        until its size is trusted and the choice reads what it costs."""
        batch = max(1, batch)
        self.decisions += 1
        bucket = self.bucket(batch)
        if current is not None and bucket != self._last_bucket:
            # a batch that moved to another size bucket starts from the K last chosen there: runs end in a ramp
            # through small batches that choose K = 3, and the next run at batch 16 otherwise started with K = 3 in
            # use, where K = 1 needed only the margin, not the entry margin, to stay on (2026-12-06)
            current = self._last_by_bucket.get(bucket, current)
        self._last_bucket = bucket
        options = [(0, False)] + [(k, c) for c in ((True, False) if self.mode == "ssd" else (False,))
                                  for k in range(1, self.k_max + 1)]
        tp = {o: self.throughput(batch, *o) for o in options}
        # speculation only where it is predicted more than `margin` faster than plain decoding (to turn it on from
        # K = 0, more than the entry margin: `entry_margin`)
        margin = self.entry_margin(batch) if current == 0 else self.margin
        eligible = [(0, False)] + [o for o in options if o[0] > 0 and tp[o] > tp[(0, False)] * (1.0 + margin)]
        best = max(eligible, key=lambda o: (tp[o], -o[0], o[1]))
        self.measure_k = 0
        if (current == 0 and best[0] > 0 and self.verify.known(batch, batch)
                and not self.verify.known(batch * (best[0] + 1), batch)):
            # speculation would turn on at a verify size this batch never measured, against plain decoding's measured
            # one: measure it first (`measure_k`)
            shape = (batch * (best[0] + 1), batch)
            tries, last = self._measured_tries.get(shape, (0, self.decisions))
            if self.decisions - last > self.backoff_relax:
                tries = 0
            if tries < MEASURE_TRIES:
                self._measured_tries[shape] = (tries + 1, self.decisions)
                self.measure_k = best[0]
            eligible = [o for o in eligible if o[0] == 0 or self.verify.known(batch * (o[0] + 1), batch)]
            best = max(eligible, key=lambda o: (tp[o], -o[0], o[1]))
        now = None if current is None else (current, current > 0 and self.kind(current) == CACHED)
        if now is not None and now != best and now in eligible and tp[now] * (1.0 + self.margin) >= tp[best]:
            best = now
        if now is not None and now in eligible and now[0] > 0 and best[0] not in (0, now[0]):
            if not self.verify.measured(batch * (best[0] + 1), batch):
                best = now   # another K > 0 whose verify size was not measured lately: its figure is a guess
        k = best[0]
        if k > 0:
            self.probe_interval = self.probe_every
            self.cached = best[1]
        self._count_stint(bucket, current, k)
        self._last_by_bucket[bucket] = k
        return k

    def entry_margin(self, batch: int) -> float:
        """How much faster than K = 0 a K > 0 must be predicted to turn speculation on from K = 0 at `batch`: the
        margin, doubled for each short stint in a row at that batch size (a stint of speculation turned on from
        K = 0 that ended within `short_stint` decisions), at most `entry_backoff` times; back to the margin after a
        stint that lasted, or `backoff_relax` decisions after the last short one. Where K > 0 and K = 0 are
        predicted within a few percent of each other, the noise in the measured terms crosses the margin both ways
        and speculation went on and off for nothing: at batch 16 one run switched between K = 0 and K = 1 15 times
        in 11 s, each time on a predicted gain of 5-11% that ran below plain decoding (pinned K = 1 runs at 0.94-0.95x
        it there; `bench/results/batch16_flips_trace.log`, 2026-12-06). Leaving speculation keeps the margin: a
        stint ends as soon as its K is no longer predicted the margin faster."""
        return self.margin * 2 ** self._short_run(self.bucket(max(1, batch)))

    def _short_run(self, bucket: int) -> int:
        """Short stints in a row at `bucket` that still count (0 once `backoff_relax` decisions passed the last)."""
        short = self._short.get(bucket)
        return short[0] if short is not None and self.decisions - short[1] <= self.backoff_relax else 0

    def _count_stint(self, bucket: int, current: int | None, k: int) -> None:
        """Start a stint where speculation turns on from K = 0; where it turns off, score it at its batch size: short
        (one more short stint in a row there, up to `entry_backoff`) or not (none). A stint that ends at another batch
        size ended with the batch, not with the measurements: it counts for neither."""
        if current == 0 and k > 0:
            self._stint = (bucket, self.decisions)
        elif current is not None and current > 0 and k == 0 and self._stint is not None:
            started_in, start = self._stint
            self._stint = None
            if started_in != bucket:
                return
            if self.decisions - start < self.short_stint:
                self._short[bucket] = (min(self.entry_backoff, self._short_run(bucket) + 1), self.decisions)
            else:
                self._short.pop(bucket, None)

    def probe(self, rounds_since_probe: int) -> bool:
        """Whether a batch that ran `rounds_since_probe` rounds with speculation off should probe now (a probe
        lengthens the interval for the next ones)."""
        if not self.probe_due(rounds_since_probe):
            return False
        self.probe_interval = min(self.max_probe_every, 2 * self.probe_interval)
        return True

    def probe_due(self, rounds_since_probe: int) -> bool:
        """Whether `probe` would say yes at `rounds_since_probe` (changes nothing)."""
        return rounds_since_probe >= self.probe_interval

    def explore(self, rounds_since_explore: int, k: int) -> int | None:
        """The K a batch that ran `rounds_since_explore` rounds at the choice `k` (> 0) should run this round
        instead, or None: every `explore_every` rounds a neighbour, K + 1 and K - 1 in turn."""
        other = self.explore_peek(rounds_since_explore, k)
        if other is not None:
            self._explore_up = not self._explore_up
        return other

    def explore_peek(self, rounds_since_explore: int, k: int) -> int | None:
        """What `explore(rounds_since_explore, k)` would return, changing nothing."""
        if not self.explore_every or k <= 0 or rounds_since_explore < self.explore_every:
            return None
        return k + 1 if not self._explore_up and k < self.k_max else k - 1

    def summary(self, batch: int) -> dict:
        """What the choice at `batch` rests on (for logs; changes nothing)."""
        return {"cached": self.cached, "entry_margin": round(self.entry_margin(batch), 3), "measure_k": self.measure_k,
                "acceptance": [round(a, 3) for a in self.acceptance],
                "by_source": {src: [round(a, 3) for a in acc] for src, acc in self.by_source.items() if self.seen[src]},
                "hit": round(self.hit, 3), "hit_at_batch": round(self.hit_at(batch), 3),
                "hit_by_k": {k: round(h, 3) for k in range(1, self.k_max + 1)
                             if (h := self._hit_k(self.bucket(max(1, batch)), k)) is not None},
                "verify": self.verify.coefficients(),
                "verify_table": {n: round(t, 4) for n, t in self.verify.table().items()},
                "verify_at_batch": {n: round(t, 4) for n, t in self.verify.table(max(1, batch)).items()},
                "verify_overhead": round(self.verify.overhead, 4), "verify_drift": round(self.verify.drift, 3),
                "jit_hop": round(self.hop, 4),
                "draft_step": self.draft_step.coefficients(),
                "realized": {f"batch {1 << b}+ {KIND_NAMES[kind]}": round(c, 3)
                             for (b, kind), c in sorted(self.realized.items())},
                "throughput": [round(self.throughput(max(1, batch), k), 2) for k in range(self.k_max + 1)],
                **({"throughput_jit": [round(self.throughput(max(1, batch), k, False), 2)
                                       for k in range(1, self.k_max + 1)]} if self.mode == "ssd" else {})}
