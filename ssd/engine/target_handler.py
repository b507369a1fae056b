"""The target's message handler: prefills and verifies what routers send (`TargetHandler`).

It runs in the target service (`services/target/service.py`, over ZeroMQ) and in process alike: all it needs
of its endpoint is `send(peer, message)` (`ssd/engine/handler.py`).

Sequences are keyed by (router peer, sequence id), so several routers can share one target. Verify messages
that arrive together are merged into one forward (continuous batching: new sequences join between rounds).
A bad item gets an `Error` naming its sequence; the rest of its batch runs. Every `Verify` gets its `Outcomes`,
empty when none of its items could run (a router holds its next batch until the answer: ssd/round/batches.py).

A `Prefill` or `Verify` with `features` set is answered with the features that call computed for each of its
sequences (the final pre-norm hidden states, float16): `Prefilled.features` and `Outcomes.features`. Verify
messages merged into one forward compute features if any of them asked; only those that asked get them. A
message carries at most `wire.MAX_FEATURE_BYTES` of features: beyond that each block loses its oldest rows
(the draft reads missing rows as zeros). A sequence whose sampling asks for logprobs gets, with every reply that
commits tokens for it, their log-probabilities and top alternatives (`wire.SeqLogprobs`); one that asks for
prompt logprobs gets those of its prompt in its `Prefilled`, a reply of its own (at most MAX_ROW_ENTRIES of them).
"""
from __future__ import annotations

import dataclasses
import logging
import time

from ssd import trace, wire
from ssd.constraints import Constraint
from ssd.engine.features import FeatureBlock, to_wire
from ssd.engine.handler import Handler, Sender
from ssd.engine.target import TargetWorker
from ssd.sampling import SamplingParams

log = logging.getLogger("ssd.target")


def sampling_params(s: wire.SamplingSpec, vocab: int) -> SamplingParams:
    """A Prefill's sampling as the target samples with it: the tokens `min_tokens` masks (the sequence's ending
    tokens, EOS included, as the router names them) become its stop ids. ValueError naming what is wrong."""
    if any(t >= vocab for t, _ in s.logit_bias) or any(t >= vocab for t in s.ending):
        raise ValueError(f"logit_bias and ending token ids must be in [0, {vocab})")
    return SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, seed=s.seed,
                          presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
                          repetition_penalty=s.repetition_penalty, logit_bias=s.logit_bias, min_tokens=s.min_tokens,
                          stop_token_ids=tuple(s.ending), ignore_eos=True, logprobs=s.logprobs,
                          seed_stream=s.seed_stream,
                          constraint=Constraint(s.constraint_kind, s.constraint) if s.constraint_kind else None,
                          prompt_logprobs=s.prompt_logprobs)


class TargetHandler(Handler):
    """The target's logic over a `TargetWorker` (or its tensor-parallel leader, `ssd/engine/target_tp.py`)."""

    log = log
    worker: TargetWorker

    def __init__(self, worker: TargetWorker, endpoint: Sender):
        super().__init__(worker, endpoint)

    def handle(self, batch) -> None:
        verifies = []
        for peer, msg in batch:
            if isinstance(msg, wire.Verify):
                verifies.append((peer, msg))
            elif isinstance(msg, (wire.Prefill, wire.Restore)):
                # A verify of the same sequence that arrived earlier in this batch is stale: the router re-prefills
                # because it gave up on that round (e.g. this target stalled past its liveness limit). Drop it so
                # the rebuilt sequence is not advanced by an old speculation.
                fresh = {item.seq for item in msg.items}
                verifies = [(p, m if p != peer else
                             wire.Verify(m.batch_id, [it for it in m.items if it.seq not in fresh], m.features))
                            for p, m in verifies]
                self._prefill(peer, msg)
            elif isinstance(msg, wire.Free):
                for seq in msg.seqs:
                    self.worker.free((peer, seq))
            else:
                self._error(peer, "unexpected_message", f"the target does not handle {type(msg).__name__}")
        if verifies:
            self._verify(verifies)

    def _prefill(self, peer: bytes, msg) -> None:
        t0 = time.perf_counter()
        vocab = self.worker.model.cfg.vocab_size
        requests, seqs = [], []
        for item in msg.items:
            try:
                params = sampling_params(item.sampling, vocab)
            except ValueError as e:
                self._error(peer, "invalid_argument", str(e), item.seq)
                continue
            if not 0 < len(item.tokens) <= self.worker.max_len or any(not 0 <= t < vocab for t in item.tokens):
                self._error(peer, "invalid_argument",
                            f"prompt needs 1..{self.worker.max_len} token ids in [0, {vocab})", item.seq)
                continue
            if params.prompt_logprobs is not None and \
                    (len(item.tokens) - 1) * max(1, params.prompt_logprobs) > wire.MAX_ROW_ENTRIES:
                self._error(peer, "invalid_argument", f"prompt_logprobs: {len(item.tokens)} prompt tokens with "
                                                      f"{params.prompt_logprobs} alternatives each exceed the "
                                                      f"{wire.MAX_ROW_ENTRIES} entries one reply carries", item.seq)
                continue
            if item.prompt_len > len(item.tokens):
                self._error(peer, "invalid_argument", f"prompt_len {item.prompt_len} is past the {len(item.tokens)} "
                                                      f"tokens sent", item.seq)
                continue
            self.worker.free((peer, item.seq))  # a re-prefill (after a router retry) replaces the old state
            requests.append(((peer, item.seq), item.tokens, params, item.prompt_len or len(item.tokens)))
            seqs.append(item.seq)
        while len(requests) > self.worker.free_slots:
            requests.pop()
            self._error(peer, "resource_exhausted", "the target has no free KV slot", seqs.pop())
        if not requests:
            return
        try:
            if isinstance(msg, wire.Restore):
                self.worker.restore(requests)
                self.endpoint.send(peer, wire.Restored(seqs, time.perf_counter() - t0))
            else:
                firsts = dict(zip(seqs, self.worker.prefill(requests, features=msg.features)))
                elapsed = time.perf_counter() - t0
                whole = [seq for seq in seqs if (peer, seq) in self.worker.last_prompt_logprobs]
                # a sequence with prompt logprobs gets a reply of its own, so that no reply outgrows a frame
                for group in [[seq for seq in seqs if seq not in whole]] + [[seq] for seq in whole]:
                    if group:
                        features = self._features(peer, group) if msg.features else []
                        self.endpoint.send(peer, wire.Prefilled(
                            [(seq, firsts[seq]) for seq in group], elapsed, features,
                            self._logprobs(peer, group), self._prompt_logprobs(peer, group)))
        except ValueError as e:
            for seq in seqs:
                self._error(peer, "invalid_argument", str(e), seq)

    def _features(self, peer: bytes, seqs: list[int]) -> list[tuple[int, int, bytes]]:
        """(seq, start, data) of the last call's feature blocks of `seqs`, within MAX_FEATURE_BYTES in all: a block
        that does not fit keeps its newest rows (those the draft reads next)."""
        out, room = [], wire.MAX_FEATURE_BYTES
        for seq in seqs:
            block = self.worker.last_features.get((peer, seq))
            if block is None:
                continue
            rows, dim = block.rows.shape
            row_bytes = wire.feature_row_bytes(dim)
            keep = min(rows, room // row_bytes)
            if keep < rows:
                log.debug("seq %d: %d of %d feature rows exceed MAX_FEATURE_BYTES; sending the newest %d", seq,
                          rows - keep, rows, keep)
                block = FeatureBlock(block.start + rows - keep, block.rows[rows - keep:])
            if keep:
                out.append((seq, *to_wire(block)))
                room -= row_bytes * keep
        return out

    def _prompt_logprobs(self, peer: bytes, seqs: list[int]) -> list[wire.PromptLogprobs]:
        """The last prefill's prompt logprobs of `seqs` (those that asked for them), as the wire carries them."""
        out = []
        for seq in seqs:
            rows = self.worker.last_prompt_logprobs.get((peer, seq))
            if rows is not None:
                out.append(wire.PromptLogprobs(seq, [r.logprob for r in rows], [r.rank for r in rows],
                                               [t for r in rows for t, _ in r.top],
                                               [lp for r in rows for _, lp in r.top]))
        return out

    def _logprobs(self, peer: bytes, seqs: list[int]) -> list[wire.SeqLogprobs]:
        """The last call's logprobs of `seqs` (those that asked for them), as the wire carries them."""
        out = []
        for seq in seqs:
            rows = self.worker.last_logprobs.get((peer, seq))
            if rows is not None:
                out.append(wire.SeqLogprobs(seq, [r.logprob for r in rows], [t for r in rows for t, _ in r.top],
                                            [lp for r in rows for _, lp in r.top]))
        return out

    def _verify(self, messages) -> None:
        t0 = time.perf_counter()
        items, owners = [], []
        for peer, msg in messages:
            for it in msg.items:
                item = dataclasses.replace(it, seq=(peer, it.seq))   # the worker keys sequences by (peer, seq)
                problem = self.worker.check(item)
                if problem:
                    self._error(peer, "invalid_argument", problem, it.seq)
                    continue
                items.append(item)
                owners.append((peer, msg.batch_id))
        asked = {(peer, msg.batch_id) for peer, msg in messages if msg.features}
        outcomes = self.worker.verify(items, features=bool(asked)) if items else []
        elapsed = time.perf_counter() - t0
        if trace.ON:
            now = time.monotonic()
            ran = {}   # (peer, batch id) -> [sequences, positions] of its items that ran
            for item, owner in zip(items, owners):
                counts = ran.setdefault(owner, [0, 0])
                counts[0], counts[1] = counts[0] + 1, counts[1] + 1 + len(item.tokens)
            for peer, msg in messages:
                trace.mark("compute_start", msg.batch_id, now - elapsed)
                trace.mark("compute_end", msg.batch_id, now)
                seqs, positions = ran.get((peer, msg.batch_id), (0, 0))
                trace.count("sequences", msg.batch_id, seqs)
                trace.count("positions", msg.batch_id, positions)
        grouped = {(peer, msg.batch_id): [] for peer, msg in messages}  # every Verify is answered, even if empty
        for owner, out in zip(owners, outcomes):
            grouped[owner].append(dataclasses.replace(out, seq=out.seq[1]))
        for (peer, batch_id), outs in grouped.items():
            features = self._features(peer, [o.seq for o in outs]) if (peer, batch_id) in asked else []
            self.endpoint.send(peer, wire.Outcomes(batch_id, outs, elapsed, features,
                                                   self._logprobs(peer, [o.seq for o in outs])))
