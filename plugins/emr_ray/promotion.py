"""The champion/challenger promotion rule, as a pure function of numbers already read from MLflow.

:class:`~emr_ray.operators.mlflow.MLflowRegisterOperator` reads the new run's metric and the
current champion from the registry, asks :func:`decide`, and only then writes. Nothing here talks
to MLflow or Airflow, so every rule is tested without a store.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Accepted values of ``direction``: ``max`` when higher is better, ``min`` when lower is better.
DIRECTIONS = ("max", "min")


@dataclass(frozen=True)
class Decision:
    """
    Whether a new model version takes the champion alias, and why (the why goes to logs and XCom).

    :param promote: True when the version becomes champion.
    :param reason: one line for people: which rule decided, with the numbers it compared.
    """

    promote: bool
    reason: str


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
) -> Decision:
    """
    Decide whether the version registered from a run with metric ``value`` becomes champion.

    The rules, first match wins:

    1. no champion yet: promote;
    2. this run's version already is the champion (a retry or rerun): promote, so the rerun
       reports what the first run did;
    3. the champion's metric is unknown (its source run is gone or never logged ``metric``): do
       not promote, since there is nothing to beat; a person moves the alias by hand;
    4. otherwise promote when the improvement is above 0 and at least ``min_improvement``: a tie
       never promotes, even with ``min_improvement=0``.

    :param value: the new run's metric.
    :param champion_version: version the champion alias points at, or None when there is none.
    :param champion_value: the champion's metric, or None when it cannot be read.
    :param existing_is_champion: whether the version already registered from this run is the champion.
    :param direction: ``max`` when higher is better, ``min`` when lower is better.
    :param min_improvement: the margin (>= 0, in the metric's units) by which ``value`` must beat
        the champion.
    :param metric: the metric's name, for the reason.
    :param champion_alias: the champion alias's name, for the reason.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r} is not supported; use 'max' or 'min'.")
    if champion_version is None:
        return Decision(True, "no champion yet")
    if existing_is_champion:
        return Decision(True, "this run's version is already the champion")
    if champion_value is None:
        return Decision(
            False,
            f"champion v{champion_version} has no {metric!r} to compare against; set the "
            f"{champion_alias!r} alias by hand if this version should replace it",
        )
    gain = improvement(value, champion_value, direction)
    return Decision(
        gain > 0 and gain >= min_improvement,
        f"{metric} {value} vs champion {champion_value} ({direction} is better, "
        f"improvement {gain:+.6g}, required > 0 and >= {min_improvement})",
    )
