"""Arrival schedules: constant is exactly spaced; Poisson has the right mean and dispersion."""

import numpy as np
import pytest

from servelab.bench import schedule, stats


def test_constant_is_exactly_spaced():
    t = schedule.offsets(250.0, 1000, "constant")
    gaps = np.diff(t)
    assert t[0] == 0
    assert np.allclose(gaps, 1 / 250.0, rtol=0, atol=1e-12)
    assert len(t) == 1000


def test_poisson_mean_and_dispersion():
    rate = 100.0
    t = schedule.offsets(rate, 200_000, "poisson", seed=7)
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert np.all(gaps > 0)
    # mean gap 1/rate within 1 %; exponential gaps have coefficient of variation 1
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.01)
    assert stats.dispersion(gaps) == pytest.approx(1.0, abs=0.02)
    # counts in 1-second windows: Poisson, so variance ~ mean (index of dispersion ~ 1)
    counts = np.bincount(t.astype(int))[:-1]
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.1)
    # seeded: reproducible; different seeds differ
    assert np.array_equal(t[:100], schedule.offsets(rate, 100, "poisson", seed=7)[:100])
    assert not np.array_equal(t[:100], schedule.offsets(rate, 100, "poisson", seed=8))


def test_bad_schedules_rejected():
    with pytest.raises(ValueError):
        schedule.offsets(0, 10)
    with pytest.raises(ValueError):
        schedule.offsets(10, 10, "bursty")
    assert schedule.count_for(50, 2.0) == 100
