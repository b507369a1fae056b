"""bench/verify_shapes.py's pure parts: the shapes it reads and what one pass times."""
import pytest

from tests.bench_scripts import load


def test_shapes_parse_and_bad_ones_say_which():
    bench = load("verify_shapes")
    assert bench.parse_shapes("16x1, 8x4") == [(16, 1), (8, 4)]
    for bad in ("16", "0x2", "4x0", "ax2"):
        with pytest.raises(SystemExit, match="SEQSxROWS"):
            bench.parse_shapes(bad)


def test_a_pass_times_each_shape_with_features_and_with_both_also_without():
    bench = load("verify_shapes")
    shapes = [(16, 1), (8, 4)]
    assert bench.variants(shapes, "on") == [(16, 1, True), (8, 4, True)]
    assert bench.variants(shapes, "both") == [(16, 1, True), (16, 1, False), (8, 4, True), (8, 4, False)]
    with pytest.raises(SystemExit, match="on or both"):
        bench.variants(shapes, "off")
