"""The chaos soak's fault schedule: which faults, when, with what settings, drawn from one seed.

Pure: the same seed, count, span and kinds give the same list (kind, second after the backfill
started, parameters), so a rerun injects the same faults at the same points
(``tests/unit/test_chaos_schedule.py``). What each kind does is :mod:`devstack.chaos_faults`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: every kind of fault, with the settings each draw picks (ranges are inclusive)
KINDS: dict[str, dict[str, tuple[float, float]]] = {
    "kill_celery_worker": {"worker": (1, 2), "down_s": (5, 20)},  # SIGKILL mid-task, then restarted
    "kill_scheduler": {"down_s": (5, 20)},
    "kill_triggerer": {"down_s": (5, 20)},
    "kill_raylet": {"down_s": (10, 30)},  # the Ray worker node's raylet, then the node joins again
    "jobs_api_outage": {"down_s": (30, 90)},  # the Jobs API refuses connections
    "cos_503_burst": {"down_s": (5, 20)},  # every COS request answers 503
    "restart_postgres": {"down_s": (2, 10)},
    "restart_mlflow": {"down_s": (0, 0)},  # SIGKILL, then started again at once
    "pause_driver": {"down_s": (10, 40)},  # SIGSTOP of a running Ray job's driver, then SIGCONT
    "kill_spark_executor": {},  # SIGKILL of a live Spark executor (RayDP's executor actor)
    "kill_warm_actor": {},  # SIGKILL of one rank of a warm training group (a TrainWorker actor)
    "cos_slow_burst": {"down_s": (10, 30), "delay_s": (1, 4)},  # every COS request waits delay_s first
}


@dataclass(frozen=True)
class Fault:
    """One fault: its kind, when (seconds after the backfill started) and its drawn settings."""

    kind: str
    at_s: float
    params: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "at_s": self.at_s, **self.params}


def draw(seed: int, count: int, span_s: float, kinds: Sequence[str] = tuple(KINDS)) -> list[Fault]:
    """``count`` faults over ``[0.1, 0.8] x span_s``, in time order, at least 20 s apart where the
    span allows. Kinds cycle through a seeded shuffle of ``kinds``, so ``count <= len(kinds)`` draws
    that many different kinds."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}: use some of {', '.join(KINDS)}")
    if count < 0 or span_s <= 0:
        raise ValueError(f"count={count}, span_s={span_s}: a count >= 0 over a positive span")
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    first, last = 0.1 * span_s, 0.8 * span_s
    gap = min(20.0, (last - first) / max(1, count))
    times = sorted(round(rng.uniform(first, last), 1) for _ in range(count))
    for i in range(1, count):  # spread them: two faults at one moment are one fault's worth of recovery
        times[i] = round(max(times[i], times[i - 1] + gap), 1)
    faults = []
    for i, at in enumerate(times):
        kind = order[i % len(order)]
        params = {name: int(round(rng.uniform(low, high))) for name, (low, high) in KINDS[kind].items()}
        faults.append(Fault(kind, at, params))
    return faults
