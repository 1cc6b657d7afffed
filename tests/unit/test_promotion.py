"""The promotion rule (``emr_ray.promotion.decide``), one rule per test, in the order it applies."""

from __future__ import annotations

import pytest

from emr_ray.promotion import Decision, decide, improvement


def test_the_first_version_of_a_model_becomes_champion() -> None:
    assert decide(0.1, champion_version=None, champion_value=None) == Decision(True, "no champion yet")


def test_no_champion_promotes_whatever_the_value_and_the_margin() -> None:
    decision = decide(-1e9, champion_version=None, champion_value=None, min_improvement=100.0)
    assert decision.promote and decision.reason == "no champion yet"


def test_a_rerun_of_the_champions_own_run_stays_champion() -> None:
    """A retry finds its version already registered and champion: it reports promoted, as the first try did."""
    decision = decide(0.8, champion_version="3", champion_value=0.8, existing_is_champion=True)
    assert decision == Decision(True, "this run's version is already the champion")


def test_a_champion_without_the_metric_is_never_replaced_automatically() -> None:
    decision = decide(
        0.99,
        champion_version="2",
        champion_value=None,
        metric="test_accuracy",
        champion_alias="prod",
    )
    assert not decision.promote
    assert decision.reason == (
        "champion v2 has no 'test_accuracy' to compare against; "
        "set the 'prod' alias by hand if this version should replace it"
    )


def test_a_better_value_is_promoted_and_the_reason_shows_the_numbers() -> None:
    decision = decide(0.9, champion_version="1", champion_value=0.8, metric="test_accuracy")
    assert decision.promote
    assert decision.reason == (
        "test_accuracy 0.9 vs champion 0.8 (max is better, improvement +0.1, required > 0 and >= 0.0)"
    )


def test_a_worse_value_is_not_promoted() -> None:
    decision = decide(0.85, champion_version="2", champion_value=0.9, metric="test_accuracy")
    assert not decision.promote
    assert "improvement -0.05," in decision.reason


def test_a_tie_never_promotes_even_without_a_margin() -> None:
    assert not decide(0.9, champion_version="1", champion_value=0.9, min_improvement=0.0).promote


def test_the_improvement_must_reach_min_improvement() -> None:
    common = {"champion_version": "1", "champion_value": 0.5, "min_improvement": 0.25}
    assert not decide(0.74, **common).promote
    assert decide(0.75, **common).promote  # exactly the margin is enough
    assert decide(0.9, **common).promote


def test_with_direction_min_lower_is_better() -> None:
    common = {"champion_version": "1", "champion_value": 0.30, "direction": "min", "min_improvement": 0.05}
    assert not decide(0.29, **common).promote  # better, but by less than the margin
    assert decide(0.10, **common).promote
    assert not decide(0.40, **common).promote
    assert "(min is better, improvement +0.2," in decide(0.10, **common).reason


def test_the_rules_apply_in_order() -> None:
    """Being the champion already wins over a missing champion metric; no champion wins over both."""
    assert decide(0.1, champion_version="4", champion_value=None, existing_is_champion=True).promote
    assert decide(0.1, champion_version=None, champion_value=None, existing_is_champion=True).reason == (
        "no champion yet"
    )


def test_improvement_is_positive_when_better_in_either_direction() -> None:
    assert improvement(0.9, 0.8, "max") == pytest.approx(0.1)
    assert improvement(0.1, 0.3, "min") == pytest.approx(0.2)
    assert improvement(0.3, 0.1, "min") == pytest.approx(-0.2)


def test_an_unknown_direction_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="direction='up' is not supported; use 'max' or 'min'"):
        decide(0.9, champion_version="1", champion_value=0.8, direction="up")
    with pytest.raises(ValueError, match="use 'max' or 'min'"):
        improvement(0.9, 0.8, "higher")


def test_a_decision_is_an_immutable_value() -> None:
    decision = decide(0.9, champion_version=None, champion_value=None)
    with pytest.raises(AttributeError):
        decision.promote = False  # type: ignore[misc]
