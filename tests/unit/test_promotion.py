"""The promotion rule (``emr_ray.cluster.promotion``), one rule per test, in the order it applies; then what feeds it."""

from __future__ import annotations

import math
import sys

import pytest

from emr_ray.cluster.promotion import (
    Comparison,
    Decision,
    NonFiniteMetricError,
    comparison_from_run,
    decide,
    historical_reason,
    improvement,
    is_finite,
    require_finite,
)


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


# ---------------------------------------------------------------------- NaN and infinite metrics
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_nan_or_infinite_challenger_is_refused_with_the_fix(bad: float) -> None:
    with pytest.raises(
        NonFiniteMetricError, match=r"test_accuracy = (nan|inf|-inf).*nothing is registered.*train"
    ):
        decide(bad, champion_version=None, champion_value=None, metric="test_accuracy")
    with pytest.raises(NonFiniteMetricError, match="the comparison on the test rows logged"):
        decide(0.9, champion_version="1", champion_value=0.8, comparison=Comparison("1", 10, bad, 0.8))


def test_require_finite_passes_a_real_number_through() -> None:
    assert require_finite(0.5) == 0.5
    assert is_finite(0.0) and not is_finite(None) and not is_finite(math.nan)


@pytest.mark.parametrize("broken", [math.nan, math.inf])
def test_a_nan_or_infinite_champion_no_longer_blocks_every_promotion(broken: float) -> None:
    decision = decide(0.7, champion_version="2", champion_value=broken, metric="test_accuracy")
    assert decision.promote
    assert decision.reason == (
        f"champion v2 logged test_accuracy = {broken}: it has no comparable figure, so the finite 0.7 replaces it"
    )


# ---------------------------------------------------------------------- the same rows
def test_figures_on_the_same_rows_decide_over_the_recorded_metrics() -> None:
    """The champion once scored 0.95 on its own day; on today's rows it scores 0.88, the new model 0.90."""
    same = Comparison(champion_version="3", rows=800, challenger_value=0.90, champion_value=0.88)
    decision = decide(
        0.90, champion_version="3", champion_value=0.95, comparison=same, metric="test_accuracy"
    )
    assert decision == Decision(
        True,
        "on the same 800 test rows: test_accuracy challenger 0.9 vs champion v3 0.88 "
        "(max is better, improvement +0.02, required > 0 and >= 0.0)",
        same_rows=True,
    )


def test_on_the_same_rows_a_worse_challenger_stays_challenger_whatever_it_scored_alone() -> None:
    same = Comparison("3", 800, challenger_value=0.90, champion_value=0.93)
    decision = decide(0.99, champion_version="3", champion_value=0.80, comparison=same)
    assert not decision.promote and decision.same_rows
    assert "challenger 0.9 vs champion v3 0.93" in decision.reason and "improvement -0.03" in decision.reason


def test_same_row_figures_follow_direction_and_margin() -> None:
    same = Comparison("1", 50, challenger_value=0.20, champion_value=0.30)
    common = {"champion_version": "1", "champion_value": 0.1, "comparison": same, "direction": "min"}
    assert decide(0.2, **common, min_improvement=0.05).promote
    assert not decide(0.2, **common, min_improvement=0.2).promote


def test_a_champion_without_a_comparable_figure_on_the_same_rows_is_replaced() -> None:
    same = Comparison("4", 100, challenger_value=0.6, champion_value=math.nan)
    decision = decide(0.6, champion_version="4", champion_value=0.9, comparison=same, metric="test_loss")
    assert decision.promote and decision.same_rows
    assert "champion v4 nan: the champion has no comparable figure" in decision.reason


def test_a_comparison_with_another_champion_never_promotes_and_says_how_to_compare_again() -> None:
    stale = Comparison("3", 800, challenger_value=0.99, champion_value=0.5)
    decision = decide(0.99, champion_version="5", champion_value=0.5, comparison=stale)
    assert not decision.promote
    assert decision.reason == (
        "the training scored champion v3 on its test rows, but champion is v5 now: not promoting on a "
        "comparison with another model. To compare again, clear this run's train task with its "
        "downstream tasks: the training is not repeated, a new job scores the current champion on the "
        "same rows, and this task decides on that"
    )
    found_none = Comparison(None, None, None, None)
    decision = decide(0.99, champion_version="5", champion_value=0.5, comparison=found_none)
    assert not decision.promote and decision.reason.startswith("the training found no champion to score, but")


def test_a_comparison_that_found_no_champion_is_moot_when_there_still_is_none() -> None:
    found_none = Comparison(None, None, None, None)
    assert decide(0.5, champion_version=None, champion_value=None, comparison=found_none).promote


# ---------------------------------------------------------------------- history
def test_history_registers_but_keeps_the_champion_unless_asked() -> None:
    common = {"champion_version": "2", "champion_value": 0.8, "metric": "test_accuracy"}
    kept = decide(0.9, **common, historical="a backfill run")
    assert not kept.promote
    assert kept.reason.startswith(
        "historical run (a backfill run): registered as challenger only, champion v2 stays; set "
        "promote_historical=True to let history replace it. On the figures: test_accuracy 0.9 vs champion 0.8"
    )
    asked = decide(0.9, **common, historical="a backfill run", promote_historical=True)
    assert asked.promote and asked.reason.startswith(
        "historical run (a backfill run), promote_historical=True: "
    )
    worse = decide(0.7, **common, historical="a backfill run", promote_historical=True)
    assert not worse.promote and worse.reason.startswith("test_accuracy 0.7 vs champion 0.8")


def test_history_takes_the_alias_when_there_is_no_champion_and_keeps_a_rerun_as_it_was() -> None:
    assert decide(0.9, champion_version=None, champion_value=None, historical="a backfill run").promote
    rerun = decide(0.9, champion_version="2", champion_value=0.8, existing_is_champion=True, historical="x")
    assert rerun.promote


def test_a_run_is_historical_when_backfilled_or_older_than_the_champions_partition() -> None:
    assert historical_reason(run_type="backfill", partition="2026-12-01", champion_partition=None) == (
        "a backfill run"
    )
    assert historical_reason(run_type="manual", partition="2026-11-03", champion_partition="2026-11-20") == (
        "partition 2026-11-03 is older than the champion's partition 2026-11-20"
    )
    for run_type, partition, champion in [
        ("scheduled", "2026-11-20", "2026-11-20"),  # the same day again
        ("manual", "2026-11-21", "2026-11-20"),
        ("manual", "2026-11-01", None),  # the champion has no partition tag
        ("manual", "yesterday", "2026-11-20"),  # not a date: ignored
        (None, None, None),
    ]:
        assert historical_reason(run_type=run_type, partition=partition, champion_partition=champion) is None


# ---------------------------------------------------------------------- reading a run
def test_a_comparison_is_read_from_the_runs_tags_and_metrics() -> None:
    tags = {
        "compare.model": "m",
        "compare.alias": "champion",
        "compare.champion_version": "3",
        "compare.rows": "800",
    }
    metrics = {
        "compare.challenger.test_accuracy": 0.9,
        "compare.champion.test_accuracy": 0.85,
        "test_accuracy": 0.91,
    }
    assert comparison_from_run(tags, metrics, model_name="m", metric="test_accuracy") == Comparison(
        "3", 800, 0.9, 0.85
    )
    assert comparison_from_run(tags, metrics, model_name="other", metric="test_accuracy") is None
    assert comparison_from_run(tags, metrics, model_name="m", metric="auc") is None  # evaluate() made no auc
    assert comparison_from_run({}, metrics, model_name="m", metric="test_accuracy") is None
    assert comparison_from_run({"compare.skipped": "no evaluate"}, {}, model_name="m", metric="x") is None
    none = {"compare.model": "m", "compare.champion_version": "none"}
    assert comparison_from_run(none, {}, model_name="m", metric="test_accuracy") == Comparison(
        None, None, None, None
    )


def test_the_largest_float_is_how_mlflow_stores_infinity_and_counts_as_infinite() -> None:
    """MLflow's SQL stores save +-inf as +-sys.float_info.max."""
    assert not is_finite(sys.float_info.max) and not is_finite(-sys.float_info.max)
    with pytest.raises(NonFiniteMetricError, match=r"test_loss = -inf \(stored as -1.79"):
        require_finite(-sys.float_info.max, metric="test_loss")
    assert decide(0.5, champion_version="1", champion_value=sys.float_info.max).promote
