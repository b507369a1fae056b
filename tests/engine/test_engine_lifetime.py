"""A dropped in-process engine frees its workers (their KV caches) at once, not at the next cyclic collection:
the round core's parts hold it through a weak proxy, so nothing in it forms a reference cycle. Tests and
benchmarks build many engines in one process; with a cycle each one's KV stayed allocated until a full GC."""
import gc
import weakref

from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams


def test_dropping_an_engine_frees_its_workers_without_a_collection(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    engine = SpeculativeEngine(model, model, SpecConfig(mode="ssd", k=2), max_batch=2, max_len=64)
    engine.generate([[1, 2, 3]], SamplingParams(max_tokens=6, ignore_eos=True))
    target, draft, core = weakref.ref(engine.target), weakref.ref(engine.draft), weakref.ref(engine.core)
    gc.disable()
    try:
        del engine
        assert target() is None and draft() is None and core() is None
    finally:
        gc.enable()
