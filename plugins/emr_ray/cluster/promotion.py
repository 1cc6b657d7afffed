"""The champion/challenger promotion rule, as a pure function of numbers already read from MLflow.

:class:`~emr_ray.operators.mlflow.MLflowRegisterOperator` reads the new run's metric, the figures
the training job scored on its own test rows (:class:`Comparison`) and the current champion from
the registry, asks :func:`decide`, and only then writes. Nothing here talks to MLflow or Airflow,
so every rule is tested without a store.
"""

from __future__ import annotations

import datetime as dt
import math
import sys
from dataclasses import dataclass

#: Accepted values of ``direction``: ``max`` when higher is better, ``min`` when lower is better.
DIRECTIONS = ("max", "min")

#: The ``run_type`` of the DAG runs an Airflow backfill creates.
BACKFILL_RUN_TYPE = "backfill"


#: What the training job writes into the challenger's MLflow run when it compares (``jobs/compare.py``):
#: tags naming the registered model, the alias, the champion version it scored and the row count ...
TAG_COMPARE_MODEL = "compare.model"
TAG_COMPARE_ALIAS = "compare.alias"
TAG_COMPARE_VERSION = "compare.champion_version"
TAG_COMPARE_ROWS = "compare.rows"
#: ... or why it did not compare
TAG_COMPARE_SKIPPED = "compare.skipped"
#: ``compare.champion_version`` when the job found no champion to score
NO_CHAMPION = "none"


def compare_metric(side: str, metric: str) -> str:
    """The run metric holding ``side``'s (``champion`` or ``challenger``) ``metric`` on the same rows."""
    return f"compare.{side}.{metric}"


class NonFiniteMetricError(ValueError):
    """A challenger's metric is NaN or infinite: no decision can be made on it."""


@dataclass(frozen=True)
class Decision:
    """
    Whether a new model version takes the champion alias, and why (the why goes to logs and XCom).

    :param promote: True when the version becomes champion.
    :param reason: one line for people: which rule decided, with the numbers it compared.
    :param same_rows: True when the numbers compared were both scored on the same test rows.
    """

    promote: bool
    reason: str
    same_rows: bool = False


@dataclass(frozen=True)
class Comparison:
    """
    What the training job measured on its own test split: the challenger and the champion it
    found, scored by the same ``evaluate`` on the same rows (the ``compare.*`` tags and metrics of
    the challenger's MLflow run).

    :param champion_version: the champion version the job scored, or None when it found none.
    :param rows: how many test rows both were scored on.
    :param challenger_value: the challenger's metric on those rows.
    :param champion_value: the champion's metric on those rows (None when it has none).
    """

    champion_version: str | None
    rows: int | None
    challenger_value: float | None
    champion_value: float | None


def comparison_from_run(
    tags: dict[str, str], metrics: dict[str, float], *, model_name: str, metric: str
) -> Comparison | None:
    """
    The comparison a training run recorded for ``model_name`` and ``metric``, or None without one.

    :param tags: the run's tags.
    :param metrics: the run's metrics (latest values).
    :param model_name: the registered model being promoted; a comparison with another model is none.
    :param metric: the gate metric.
    """
    version = tags.get(TAG_COMPARE_VERSION)
    if not version or tags.get(TAG_COMPARE_MODEL, model_name) != model_name:
        return None
    challenger = metrics.get(compare_metric("challenger", metric))
    if version != NO_CHAMPION and challenger is None:
        return None  # the job's evaluate() does not produce this metric
    champion = metrics.get(compare_metric("champion", metric))
    rows = tags.get(TAG_COMPARE_ROWS)
    return Comparison(
        champion_version=None if version == NO_CHAMPION else version,
        rows=int(rows) if rows and rows.isdigit() else None,
        challenger_value=None if challenger is None else float(challenger),
        champion_value=None if champion is None else float(champion),
    )


def is_finite(value: float | None) -> bool:
    """
    True for a real number that is neither NaN nor infinite.

    MLflow's SQL stores cannot hold an infinity and save it as the largest float
    (``sys.float_info.max``, signed): that value reads back as infinite here.
    """
    return value is not None and math.isfinite(value) and abs(value) < sys.float_info.max


def require_finite(value: float, *, metric: str = "metric", where: str = "the run") -> float:
    """
    ``value``, or :class:`NonFiniteMetricError` when it is NaN or infinite.

    :param value: the challenger's metric.
    :param metric: the metric's name, for the message.
    :param where: what logged it, for the message.
    """
    if not is_finite(value):
        shown = value if not math.isfinite(value) else f"{'-' if value < 0 else ''}inf (stored as {value})"
        raise NonFiniteMetricError(
            f"{where} logged {metric} = {shown}: a NaN or infinite metric cannot be compared, so nothing "
            "is registered. The training diverged or evaluated no rows: fix it (learning rate, input "
            "data, the test split) and train again."
        )
    return value


def improvement(value: float, champion_value: float, direction: str = "max") -> float:
    """
    How much ``value`` beats ``champion_value``: positive is better, whatever the direction.

    :param value: the new run's metric.
    :param champion_value: the champion's metric.
    :param direction: ``max`` or ``min``.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r} is not supported; use 'max' or 'min'.")
    return value - champion_value if direction == "max" else champion_value - value


def historical_reason(
    *, run_type: str | None, partition: str | None, champion_partition: str | None
) -> str | None:
    """
    Why a run counts as historical, or None when it does not.

    A run is historical when Airflow backfills it, or when its partition is older than the
    partition the current champion was trained on (both ``YYYY-MM-DD``; a tag that is not a date
    is ignored).

    :param run_type: the DAG run's ``run_type`` (``backfill``, ``manual``, ``scheduled``, ...).
    :param partition: the partition the new version was trained on.
    :param champion_partition: the champion version's ``partition`` tag.
    """
    if str(run_type or "").lower() == BACKFILL_RUN_TYPE:
        return "a backfill run"
    mine, theirs = _date(partition), _date(champion_partition)
    if mine and theirs and mine < theirs:
        return f"partition {partition} is older than the champion's partition {champion_partition}"
    return None


def _date(text: str | None) -> dt.date | None:
    try:
        return dt.date.fromisoformat(str(text)[:10]) if text else None
    except ValueError:
        return None


def decide(
    value: float,
    *,
    champion_version: str | None,
    champion_value: float | None,
    existing_is_champion: bool = False,
    direction: str = "max",
    min_improvement: float = 0.0,
    metric: str = "metric",
    champion_alias: str = "champion",
    comparison: Comparison | None = None,
    historical: str | None = None,
    promote_historical: bool = False,
) -> Decision:
    """
    Decide whether the version registered from a run with metric ``value`` becomes champion.

    A NaN or infinite ``value`` (or challenger figure in ``comparison``) raises
    :class:`NonFiniteMetricError`. Otherwise the rules, first match wins:

    1. no champion yet: promote (even a historical run: there is nothing to replace);
    2. this run's version already is the champion (a retry or rerun): promote, so the rerun
       reports what the first run did;
    3. the figures decide, in this order:

       a. the training job scored another champion (or found none), so the champion has changed
          since: do not promote; clearing the training task compares again;
       b. the training job scored the current champion on the challenger's own test rows
          (``comparison`` for ``champion_version``): compare those two figures;
       c. no comparison (older runs): compare with the metric the champion's own run logged.

       In b and c a champion figure that is NaN or infinite is no comparable figure: a finite
       challenger replaces it. In c a champion without the metric (its run gone) is never
       replaced automatically: a person moves the alias. Otherwise promote when the improvement
       is above 0 and at least ``min_improvement`` (a tie never promotes);
    4. a historical run (``historical`` says why) that the figures would promote is kept as
       challenger unless ``promote_historical``.

    :param value: the new run's metric.
    :param champion_version: version the champion alias points at, or None when there is none.
    :param champion_value: the metric the champion's own source run logged, or None.
    :param existing_is_champion: whether the version already registered from this run is the champion.
    :param direction: ``max`` when higher is better, ``min`` when lower is better.
    :param min_improvement: the margin (>= 0, in the metric's units) by which ``value`` must beat
        the champion.
    :param metric: the metric's name, for the reason.
    :param champion_alias: the champion alias's name, for the reason.
    :param comparison: both models' figures on the challenger's test rows, when the training made them.
    :param historical: why the run is historical (:func:`historical_reason`), or None.
    :param promote_historical: let a historical run replace the champion.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r} is not supported; use 'max' or 'min'.")
    require_finite(value, metric=metric)
    if comparison is not None and comparison.challenger_value is not None:
        require_finite(comparison.challenger_value, metric=metric, where="the comparison on the test rows")
    if champion_version is None:
        return Decision(True, "no champion yet")
    if existing_is_champion:
        return Decision(True, "this run's version is already the champion")
    decision = _on_figures(
        value,
        champion_version,
        champion_value,
        direction,
        min_improvement,
        metric,
        champion_alias,
        comparison,
    )
    if historical is None or not decision.promote:
        return decision
    if promote_historical:
        return Decision(
            True,
            f"historical run ({historical}), promote_historical=True: {decision.reason}",
            decision.same_rows,
        )
    return Decision(
        False,
        f"historical run ({historical}): registered as challenger only, {champion_alias} v{champion_version} "
        f"stays; set promote_historical=True to let history replace it. On the figures: {decision.reason}",
        decision.same_rows,
    )


def _on_figures(
    value: float,
    champion_version: str,
    champion_value: float | None,
    direction: str,
    min_improvement: float,
    metric: str,
    champion_alias: str,
    comparison: Comparison | None,
) -> Decision:
    """Rule 3 of :func:`decide`: the figures, with the champion present and not this run's version."""
    if comparison is not None and comparison.champion_version != champion_version:
        compared = (
            f"scored {champion_alias} v{comparison.champion_version} on its test rows"
            if comparison.champion_version
            else f"found no {champion_alias} to score"
        )
        return Decision(
            False,
            f"the training {compared}, but {champion_alias} is v{champion_version} now: not promoting on a "
            f"comparison with another model. To compare again, clear this run's train task with its "
            f"downstream tasks: the training is not repeated, a new job scores the current {champion_alias} "
            f"on the same rows, and this task decides on that",
        )
    if comparison is not None and comparison.challenger_value is not None:
        rows = f"the same {comparison.rows} test rows" if comparison.rows else "the same test rows"
        challenger, champion = comparison.challenger_value, comparison.champion_value
        figures = (
            f"on {rows}: {metric} challenger {challenger} vs {champion_alias} v{champion_version} {champion}"
        )
        if champion is None or not is_finite(champion):
            return Decision(
                True,
                f"{figures}: the champion has no comparable figure, so the finite challenger replaces it",
                same_rows=True,
            )
        gain = improvement(challenger, champion, direction)
        return Decision(
            gain > 0 and gain >= min_improvement,
            f"{figures} ({direction} is better, improvement {gain:+.6g}, "
            f"required > 0 and >= {min_improvement})",
            same_rows=True,
        )
    if champion_value is None:
        return Decision(
            False,
            f"champion v{champion_version} has no {metric!r} to compare against; set the "
            f"{champion_alias!r} alias by hand if this version should replace it",
        )
    if not is_finite(champion_value):
        return Decision(
            True,
            f"champion v{champion_version} logged {metric} = {champion_value}: it has no comparable figure, "
            f"so the finite {value} replaces it",
        )
    gain = improvement(value, champion_value, direction)
    return Decision(
        gain > 0 and gain >= min_improvement,
        f"{metric} {value} vs champion {champion_value} ({direction} is better, "
        f"improvement {gain:+.6g}, required > 0 and >= {min_improvement})",
    )
