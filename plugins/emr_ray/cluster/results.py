"""What a job sends back, typed as the spec going out is (cluster side: imports no Airflow).

A job returns one of these frozen types; its runtime adds what every job reports (the code it ran,
its usage) and prints ``to_dict()``. The operator rebuilds it with ``from_dict()``, which refuses
keys it does not know, as a spec does (the two sides run different code: align them), works with
attributes, and pushes ``to_dict()`` as the XCom, so XComs keep the JSON shape they always had: a
field left at its ``None`` default is left out.

What reads a *stored* result (an XCom of any age, a training's stored result, the Retraining view,
the receipt, the audit) uses :meth:`ResultPart.read`: it takes the fields it knows, ignores the
rest and answers None when the data is not of that kind, so a result an older or newer provider
wrote still reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from emr_ray.cluster.spec import SpecError, SpecPart, _part_type, field_types

R = TypeVar("R", bound="ResultPart")


class ResultPart(SpecPart):
    """A part of a job's result: the spec's JSON round trip, plus :meth:`read` for stored results."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            out[f.name] = value.to_dict() if isinstance(value, SpecPart) else _plain(value)
        return out

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        """As the spec's, and a missing field is named too (the job ran other code than this side)."""
        if isinstance(data, Mapping) and (missing := sorted(_required(cls) - set(data))):
            raise SpecError(
                f"{cls.__name__} lacks field(s) {missing}. The Airflow side and the cluster side run "
                "different versions of emr_ray: align them."
            )
        return super().from_dict(dict(data) if isinstance(data, Mapping) else data)

    @classmethod
    def read(cls: type[R], data: Any) -> R | None:
        """``data`` as this kind of result, or None: it is not a mapping, lacks a field this kind
        requires, or holds a value its checks refuse. Keys it does not know are ignored."""
        if not isinstance(data, Mapping) or not _required(cls) <= set(data):
            return None
        hints = field_types(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in data:
                continue
            value = data[f.name]
            part = _part_type(hints[f.name])
            if part is not None and issubclass(part, ResultPart) and value is not None:
                value = part.read(value)
            values[f.name] = value
        try:
            return cls(**values)
        except (SpecError, TypeError, ValueError):
            return None


def _required(cls: type[ResultPart]) -> set[str]:
    return {
        f.name
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }


def _plain(value: Any) -> Any:
    """A copy of a JSON value (dicts and lists are copied, so the result stays frozen in effect)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise SpecError(message)


# -- what every job reports --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PoolIdle(ResultPart):
    """The warm pools' idle time before this job's calls, charged to it."""

    seconds: float
    cpu_seconds: float
    gpu_seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Usage(ResultPart):
    """What a job held and for how long (:mod:`emr_ray.cluster.jobs._usage`). A job whose accounting
    failed has only ``error`` and ``phases``: the figures are then None (left out of the JSON)."""

    started_at: float | None = None
    ended_at: float | None = None
    wall_seconds: float | None = None
    cpu_seconds_reserved: float | None = None
    gpu_seconds_reserved: float | None = None
    actors: int | None = None
    tasks: int | None = None
    held: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    phases: dict[str, float] = field(default_factory=dict)
    missing: list[str] | None = None
    pool_idle: PoolIdle | None = None
    measuring_seconds: float | None = None
    error: str | None = None

    @property
    def measured(self) -> bool:
        return self.wall_seconds is not None


@dataclass(frozen=True, kw_only=True)
class PoolUse(ResultPart):
    """What a call says of the warm pool that served it (a Spark session, a training group)."""

    name: str
    calls: int
    reused: bool
    why: str | None
    start_seconds: float
    idle_seconds: float = 0.0
    age_seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class JobResult(ResultPart):
    """What the job's runtime adds to every typed result: the code it ran and what it used."""

    code_origin: dict[str, str | None] | None = None
    code_version: str | None = None
    versions: dict[str, str] | None = None
    usage: Usage | None = None


# -- the jobs' own results ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SparkResult(JobResult):
    """A preprocessing: the partition it read and the generation it committed (None for a dry run,
    ``validated`` then). ``raw_input`` is added on the Airflow side: the raw listing's identity the
    job was submitted for (:mod:`emr_ray.arrivals`)."""

    partition: str
    input_uri: str
    rows_in: int
    validated: bool | None = None
    output_uri: str | None = None
    generation: str | None = None
    superseded_by: str | None = None
    rows_out: dict[str, int] | None = None
    outputs: dict[str, str] | None = None
    spark_session: PoolUse | None = None
    raw_input: str | None = None

    def __post_init__(self) -> None:
        _check(
            isinstance(self.rows_in, int) and self.rows_in >= 0,
            f"rows_in={self.rows_in!r} is not a row count.",
        )
        _check(
            (self.generation is None) == (self.output_uri is None),
            "A committed generation names its output_uri, a dry run neither.",
        )

    @property
    def committed(self) -> bool:
        return self.generation is not None


@dataclass(frozen=True, kw_only=True)
class ChampionScores(ResultPart):
    """The new model and the champion scored on the same test rows (:mod:`emr_ray.cluster.jobs.compare`),
    metric name to value on each side; ``champion_version`` None: there was no champion to score;
    ``skipped``: why no comparison was made (the training stands, uncompared)."""

    model_name: str
    alias: str
    champion_version: str | None = None
    rows: int | None = None
    champion: dict[str, float] = field(default_factory=dict)
    challenger: dict[str, float] = field(default_factory=dict)
    skipped: str | None = None

    @property
    def scored(self) -> bool:
        """Whether both models were scored (a champion existed and nothing was skipped)."""
        return self.skipped is None and self.champion_version is not None


@dataclass(frozen=True, kw_only=True)
class TrainResult(JobResult):
    """A training: its MLflow run, best checkpoint, metrics, and the inputs its checkpoints carry
    (``inputs_fingerprint``); ``reused`` when a finished training with these inputs was returned."""

    mlflow_run_id: str
    tracking_uri: str
    run_name: str
    checkpoint_uri: str
    final_metrics: dict[str, Any]
    best_metrics: dict[str, Any] = field(default_factory=dict)
    epochs_completed: int = 0
    rows: dict[str, Any] | None = None
    fit_seconds: float | None = None
    comparison: ChampionScores | None = None
    inputs_fingerprint: str | None = None
    worker_group: PoolUse | None = None
    reused: bool | None = None

    def __post_init__(self) -> None:
        _check(bool(self.mlflow_run_id), "A training result names its MLflow run.")


@dataclass(frozen=True, kw_only=True)
class PredictResult(JobResult):
    """A batch scoring: the input generation it read, the model version it used, and the predictions
    generation it committed, with as many rows as the input (the commit checks it)."""

    partition: str
    input_uri: str
    input_generation: str
    model_name: str
    model_version: str
    rows: int
    output_uri: str
    generation: str
    predictions_uri: str
    superseded_by: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(isinstance(self.rows, int) and self.rows > 0, f"rows={self.rows!r}: a scoring scores rows.")


@dataclass(frozen=True, kw_only=True)
class RLlibResult(JobResult):
    """An RLlib training: its MLflow run, last checkpoint and iterations."""

    mlflow_run_id: str
    tracking_uri: str
    run_name: str
    algorithm: str
    env: str
    checkpoint_uri: str
    final_metrics: dict[str, Any]
    iterations_completed: int
    start_iteration: int = 0
    train_seconds: float | None = None
    reused: bool | None = None
