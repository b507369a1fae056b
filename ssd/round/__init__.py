"""The round core: one speculative round per sequence, free of transport (no torch, no sockets).

Per sequence, a round is: speculation ready -> Verify to the target and, in ssd mode, DraftRound to the draft (at
the same time) -> Outcomes (j, t*) -> commit and stream the tokens -> look (seq, round, j, t*) up in the
speculation cache -> hit: the next speculation is ready at once; miss: a backup (jit asks the draft, ngram and
none are immediate) -> ...

Events come in as method calls (`RoundCore.submit`, `abort`, `on_message` with a worker's reply, the worker
joined / died / came back / left calls); commands go out as `ssd.wire` messages handed to a worker handle's
`send` (Prefill, Restore, Verify, DraftAdd, DraftRound, Jit, Free) and as events put on each request's queue
(("prompt_logprobs", [None, TokenLogprob...]) before the first tokens when asked, ("logprobs", [TokenLogprob])
before their tokens when asked, ("tokens", ids), ("done", reason), ("error", message)). The router
(services/router/loop.py) carries it over ZeroMQ; the in-process engine (ssd/engine/speculative.py) carries it
over function calls to the same worker handlers the services run, so tests and benchmarks run the round that
ships.

Modules: state (Request, its phase and round, the config), pool (the workers and who holds what), planner
(adaptive K and fan-out), dispatch (what is ready goes out, in batches), batches (verify hold, JIT linger,
batch ids), features (target features on their way
to a draft), replies (checks of what workers answer), metrics (the hooks a shell may implement), core.
"""
from ssd.round.core import RoundCore
from ssd.round.pool import StartupError, WorkerPool
from ssd.round.state import CoreConfig, Phase, Request

__all__ = ["CoreConfig", "Phase", "Request", "RoundCore", "StartupError", "WorkerPool"]
