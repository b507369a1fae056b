import pytest

from ssd.spec.theory import expected_tokens, predicted_speedup


def test_expected_tokens_known_values():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(0.8, 4) == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)


def test_predicted_speedup_known_values():
    assert predicted_speedup(1.0, 3.0, 1.0, 0.5, 9.0) == pytest.approx(3.0)
    assert predicted_speedup(1.0, 3.0, 1.0, 1.5, 9.0) == pytest.approx(2.0)
    assert predicted_speedup(0.0, 3.0, 2.0, 0.5, 1.0) == pytest.approx(1.0)
    assert predicted_speedup(0.5, 4.0, 2.0, 0.2, 0.5) == pytest.approx(3.0 / 1.25)
