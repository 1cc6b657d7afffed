"""The chaos soak's seeded fault schedule (``devstack/chaos_schedule.py``): a seed replays the same faults at
the same points; a short schedule draws different kinds; settings stay in their ranges."""

from __future__ import annotations

import pytest

from devstack.chaos_schedule import KINDS, draw


def test_the_same_seed_draws_the_same_faults_at_the_same_points_and_another_seed_does_not():
    assert draw(7, 6, 600) == draw(7, 6, 600)
    assert draw(7, 6, 600) != draw(8, 6, 600)


def test_faults_fall_inside_the_span_in_time_order_spread_apart_with_settings_in_range():
    faults = draw(3, 9, 1000)
    times = [f.at_s for f in faults]
    assert times == sorted(times) and 100 <= times[0] and times[-1] <= 1000
    assert all(b - a >= 20 for a, b in zip(times, times[1:], strict=False))
    for f in faults:
        for name, (low, high) in KINDS[f.kind].items():
            assert low <= f.params[name] <= high, (f.kind, name, f.params[name])


def test_a_short_schedule_draws_as_many_different_kinds_as_faults():
    for seed in range(20):
        kinds = [f.kind for f in draw(seed, 3, 300)]
        assert len(set(kinds)) == 3
    assert {f.kind for f in draw(1, len(KINDS), 3000)} == set(KINDS)
    assert {f.kind for f in draw(1, 4, 300, kinds=["kill_scheduler", "cos_503_burst"])} == {
        "kill_scheduler",
        "cos_503_burst",
    }


def test_an_unknown_kind_is_refused_naming_the_known_ones():
    with pytest.raises(
        ValueError, match="unknown fault kinds \\['kill_everything'\\]: use some of kill_celery_worker"
    ):
        draw(1, 1, 60, kinds=["kill_everything"])
