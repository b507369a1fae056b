"""bench/draft.py's pure parts."""
import json

import pytest

from ssd.models.prepare import EAGLE_WEIGHTS
from tests.bench_scripts import load

draft_bench = load("draft")


@pytest.mark.parametrize("value, minutes", [("3.8 + 1.6", 5.4), ("55", 55.0), (2.8, 2.8), (0, 0.0)])
def test_training_minutes_of_one_or_several_stages(value, minutes):
    assert draft_bench.provenance_minutes(value) == minutes


def test_the_shipped_drafts_provenance_gives_its_minutes():
    """The shipped draft's provenance records two stages ("3.8 + 1.6"): the bench read it with float() and failed at
    its end, after the whole evaluation."""
    provenance = json.loads(EAGLE_WEIGHTS.with_suffix(".json").read_text())
    assert draft_bench.provenance_minutes(provenance.get("train_minutes", 0)) > 0
