"""The contract between the two sides: a typed job spec in, a small JSON result out.

Operators build a spec (frozen dataclasses, validated on construction with a message that says how
to fix the input, as Ray Train's config classes do), serialise it to JSON and encode it into the
job's entrypoint; the cluster-side job decodes it back into the same classes and reads attributes.
The job prints its result (and, on failure, its error) as one marked line in the job log, which the
operator reads back through the Jobs API: that works on any cluster, with no shared filesystem.
Secrets never go into a spec: they reach the job's processes as environment variables
(``COS_SECRET_ENV``) through :mod:`emr_ray.cluster.secrets`, never through its runtime_env.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib
import json
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from emr_ray.cluster import secrets, storage

RESULT_MARKER = "EMR_RAY_RESULT "
ERROR_MARKER = "EMR_RAY_ERROR "
COS_SECRET_ENV = {
    "access_key": "EMR_RAY_COS_SECRET_ID",
    "secret_key": "EMR_RAY_COS_SECRET_KEY",
    "session_token": "EMR_RAY_COS_TOKEN",
}
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
SCORE_ORDERS = ("min", "max")

S = TypeVar("S", bound="SpecPart")


class SpecError(ValueError):
    """A spec that cannot run: the message names the field and the fix."""


class SpecPart:
    """JSON round trip shared by every part of a spec: ``to_dict()`` and ``from_dict()``.

    Pickled (sent by a job's driver to its workers), a part carries the name of the job's secret copy
    along (:func:`emr_ray.cluster.secrets.carried`); JSON never does.
    """

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_unpickle_part, (type(self), dict(self.__dict__), secrets.carried()))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls: type[S], data: dict[str, Any]) -> S:
        """Build from JSON data; nested parts are built too, unknown keys are refused."""
        if not isinstance(data, dict):
            raise SpecError(f"{cls.__name__} must be a JSON object, got {type(data).__name__}.")
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - names)
        if unknown:
            raise SpecError(
                f"{cls.__name__} has no field(s) {unknown}; known: {sorted(names)}. "
                "The Airflow side and the cluster side run different versions of emr_ray: align them."
            )
        hints = field_types(cls)
        values = {}
        for key, value in data.items():
            hint = _part_type(hints[key])
            if hint is not None and isinstance(value, dict):
                value = hint.from_dict(value)
            values[key] = value
        return cls(**values)


def _unpickle_part(cls: type[S], state: dict[str, Any], carried: secrets.CopyName | None) -> S:
    """Rebuild a pickled part as it was (no validation again); unpickling ``carried`` adopted the name."""
    part = object.__new__(cls)
    part.__dict__.update(state)
    return part


_FIELD_TYPES: dict[type, dict[str, Any]] = {}


def field_types(cls: type) -> dict[str, Any]:
    """A part's resolved field annotations, once per class: resolving them is the costly step of
    reading a part, and the Retraining view reads many stored results per page."""
    if cls not in _FIELD_TYPES:
        _FIELD_TYPES[cls] = typing.get_type_hints(cls)
    return _FIELD_TYPES[cls]


def _part_type(hint: Any) -> type[SpecPart] | None:
    """The spec part a field holds: ``Part`` or an optional ``Part | None``; None for other fields."""
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and issubclass(candidate, SpecPart):
            return candidate
    return None


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise SpecError(message)


@dataclass(frozen=True)
class StorageSection(SpecPart):
    """The public storage settings a job needs (``cos``: endpoint and region; ``hdfs``: WebHDFS)."""

    cos: dict[str, Any] | None = None
    hdfs: dict[str, Any] | None = None

    def options(self) -> storage.StorageOptions:
        """The settings, with the COS secrets read from this process's environment (never the spec)."""
        secrets.ensure_env()  # in a worker process of a job: fetch the job's secrets first
        settings: dict[str, Any] = {**(self.cos or {})}
        settings.update({k: v for k, v in (self.hdfs or {}).items() if v is not None})
        settings.update({key: os.environ.get(env) for key, env in COS_SECRET_ENV.items()})
        return storage.StorageOptions(**settings)


SPARK_SESSIONS = ("job", "shared")
#: where a training's loop runs: Ray Train's worker group for the job, or a warm one that outlives it
WORKER_GROUPS = ("job", "shared")


@dataclass(frozen=True)
class SparkSettings(SpecPart):
    """``raydp.init_spark`` arguments."""

    app_name: str
    num_executors: int = 1
    executor_cores: int = 1
    executor_memory: str = "1g"
    configs: dict[str, str] = field(default_factory=dict)
    placement_group_strategy: str | None = None
    #: ``job``: the job starts and stops its own session; ``shared``: a warm session that outlives the
    #: job serves it (:mod:`emr_ray.cluster.jobs.spark_session`), stopped after ``idle_timeout_s`` unused
    session: str = "job"
    idle_timeout_s: int = 600

    def __post_init__(self) -> None:
        _require(
            int(self.num_executors) >= 1 and int(self.executor_cores) >= 1,
            "num_executors and executor_cores must be at least 1.",
        )
        _require(
            self.session in SPARK_SESSIONS,
            f"spark_session={self.session!r}: use 'job' (a session per job) or 'shared' (a warm session "
            "that outlives the job).",
        )
        _require(
            int(self.idle_timeout_s) >= 1, f"idle_timeout_s={self.idle_timeout_s}: use at least 1 second."
        )
        _require(
            self.placement_group_strategy in (None, *PLACEMENT_STRATEGIES),
            f"placement_group_strategy={self.placement_group_strategy!r}: use one of "
            f"{', '.join(PLACEMENT_STRATEGIES)} or None.",
        )


@dataclass(frozen=True)
class SparkJobSpec(SpecPart):
    """``emr_ray.cluster.jobs.spark``: preprocess one committed input partition into one output partition."""

    partition: str
    preprocess: str
    input_uri: str
    output_uri: str
    spark: SparkSettings
    config: dict[str, Any] = field(default_factory=dict)
    validate_only: bool = False
    identity: dict[str, str] = field(default_factory=dict)
    storage: StorageSection = field(default_factory=StorageSection)
    #: whose warm pools the job may use: a digest of its connections (pools are single-tenant)
    tenant: str = ""

    def __post_init__(self) -> None:
        storage.validate_partition(self.partition)
        _check_import_path("preprocess", self.preprocess)
        for uri in (self.input_uri, self.output_uri):
            storage.split_uri(uri)


def worker_resources(resources_per_worker: Mapping[str, float] | None, use_gpu: bool) -> dict[str, float]:
    """One training worker's resources, by Ray Train's own rule (its ``ScalingConfig``): the given
    ``resources_per_worker`` without zero entries, else 1 CPU, or with ``use_gpu`` 1 GPU and no CPU;
    ``use_gpu`` adds 1 GPU to given resources that name none.

    The one rule for the job's trainer, the warm worker group's placement bundle and the cluster
    check (:class:`emr_ray.run_request.RunRequest`), so that all three reserve the same.
    """
    if resources_per_worker is None:
        asks = {"GPU": 1.0} if use_gpu else {"CPU": 1.0}
    else:
        asks = {str(k): float(v) for k, v in resources_per_worker.items() if float(v) != 0}
    if use_gpu:
        asks.setdefault("GPU", 1.0)
    return asks


@dataclass(frozen=True)
class ScalingSpec(SpecPart):
    """Ray Train's ``ScalingConfig``, checked before any cluster work."""

    num_workers: int = 2
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    placement_strategy: str = "PACK"

    def __post_init__(self) -> None:
        _require(self.num_workers >= 1, f"num_workers={self.num_workers}: Ray Train needs at least 1 worker.")
        _require(
            self.placement_strategy in PLACEMENT_STRATEGIES,
            f"placement_strategy={self.placement_strategy!r}: use one of {', '.join(PLACEMENT_STRATEGIES)}.",
        )
        resources = self.resources_per_worker or {}
        _require(
            not (self.use_gpu and resources.get("GPU", 1) == 0),
            "use_gpu=True with resources_per_worker GPU=0: drop GPU from resources_per_worker.",
        )
        _require(
            self.use_gpu or resources.get("GPU", 0) <= 0,
            "resources_per_worker asks for GPUs but use_gpu=False: set use_gpu=True.",
        )

    def per_worker(self) -> dict[str, float]:
        """One worker's resources: :func:`worker_resources` of this scaling."""
        return worker_resources(self.resources_per_worker, self.use_gpu)

    @property
    def cpus(self) -> float:
        """The CPUs the worker group holds (none per worker with ``use_gpu`` and no CPU asked)."""
        return self.num_workers * self.per_worker().get("CPU", 0.0)


@dataclass(frozen=True)
class CheckpointSpec(SpecPart):
    """Ray Train's ``CheckpointConfig``: how many checkpoints to keep and how to rank them."""

    num_to_keep: int | None = 2
    score_attribute: str = "test_loss"
    score_order: str = "min"

    def __post_init__(self) -> None:
        _require(
            self.score_order in SCORE_ORDERS,
            f"score_order={self.score_order!r}: use 'min' (losses) or 'max' (accuracies).",
        )
        _require(
            self.num_to_keep is None or self.num_to_keep >= 1,
            f"num_to_keep={self.num_to_keep}: keep at least 1 checkpoint, or None to keep all.",
        )


@dataclass(frozen=True)
class FailureSpec(SpecPart):
    """Ray Train's ``FailureConfig``: worker-group restarts from the last checkpoint."""

    max_failures: int = 1

    def __post_init__(self) -> None:
        _require(self.max_failures >= -1, f"max_failures={self.max_failures}: use -1 (unlimited) or more.")


@dataclass(frozen=True)
class MLflowSection(SpecPart):
    """Where the training job logs (no credentials: those travel in the job's environment)."""

    tracking_uri: str
    experiment_name: str
    registry_uri: str | None = None
    artifact_location: str | None = None
    tags: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require(bool(self.tracking_uri), "The mlflow connection gives no tracking URI; set its host.")
        _require(bool(self.experiment_name), "experiment_name is empty; name an MLflow experiment.")


@dataclass(frozen=True)
class CompareSection(SpecPart):
    """After fit, score ``models:/<model_name>@<alias>`` and the new model on the same test rows
    (the registry is the ``mlflow`` part's)."""

    model_name: str
    alias: str = "champion"

    def __post_init__(self) -> None:
        _require(
            bool(self.model_name), "compare.model_name is empty; name the registered model to compare with."
        )
        _require(bool(self.alias), "compare.alias is empty; name the alias to compare with, e.g. 'champion'.")


class RunFolder:
    """A spec whose run keeps its state and checkpoints under ``<storage_path>/<run_name>``."""

    storage_path: str
    run_name: str

    @property
    def run_uri(self) -> str:
        return storage.join(self.storage_path, self.run_name)


@dataclass(frozen=True)
class TrainJobSpec(SpecPart, RunFolder):
    """``emr_ray.cluster.jobs.train``: a Ray Train ``TorchTrainer`` fit over committed Parquet datasets."""

    train_loop: str
    datasets: dict[str, str]
    run_name: str
    storage_path: str
    mlflow: MLflowSection
    config: dict[str, Any] = field(default_factory=dict)
    scaling: ScalingSpec = field(default_factory=ScalingSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    failure: FailureSpec = field(default_factory=FailureSpec)
    identity: dict[str, str] = field(default_factory=dict)
    storage: StorageSection = field(default_factory=StorageSection)
    #: whose warm pools the job may use: a digest of its connections (pools are single-tenant)
    tenant: str = ""
    compare: CompareSection | None = None
    #: ``job``: Ray Train builds a worker group for this fit; ``shared``: a warm group that outlives the
    #: job runs the loop (:mod:`emr_ray.cluster.jobs.train_group`), stopped after ``worker_group_idle_timeout_s``
    worker_group: str = "job"
    worker_group_idle_timeout_s: int = 600

    def __post_init__(self) -> None:
        _check_import_path("train_loop", self.train_loop)
        _require(
            self.worker_group in WORKER_GROUPS,
            f"worker_group={self.worker_group!r}: use 'job' (Ray Train's worker group per fit) or 'shared' "
            "(a warm worker group that outlives the job).",
        )
        _require(
            int(self.worker_group_idle_timeout_s) >= 1,
            f"worker_group_idle_timeout={self.worker_group_idle_timeout_s}: use at least 1 second.",
        )
        _require(
            bool(self.datasets) and "train" in self.datasets,
            "datasets must name a 'train' URI (and usually 'test').",
        )
        for uri in (*self.datasets.values(), self.storage_path):
            storage.split_uri(uri)
        storage.validate_partitions_in(*self.datasets.values())
        from emr_ray.cluster import batches  # the contract module imports this one

        if batches.declares_batches(self.config):
            batches.batch_spec(self.config)  # the model's inputs, checked before anything is submitted

    @property
    def epochs(self) -> int:
        return int(self.config.get("epochs", 5))

    @property
    def model_module(self) -> str:
        """The module of ``train_loop``: it also provides ``build_model(config)``."""
        return self.train_loop.partition(":")[0]

    def fingerprint_payload(self) -> dict[str, Any]:
        """What makes two trainings the same, besides the exact input data."""
        return {
            "train_loop": self.train_loop,
            "config": self.config,
            "scaling": self.scaling.to_dict(),
            "datasets": self.datasets,
        }


@dataclass(frozen=True)
class PredictJobSpec(SpecPart):
    """``emr_ray.cluster.jobs.predict``: score one committed input (a pinned generation's output) with
    one registered model version on Ray Data, and commit the predictions as a new generation of
    ``output_uri``. The version is a number, never an alias: a promotion mid-run cannot mix models."""

    partition: str
    input_uri: str
    output_uri: str
    model_name: str
    model_version: str
    mlflow: MLflowSection
    #: ``fn(model, batch, config) -> {column: values}``: the columns a batch (column name to numpy
    #: array) gains; the model is the version's pyfunc model
    predict: str = "include.scoring.tabular:predict_batch"
    config: dict[str, Any] = field(default_factory=dict)
    #: at most this many model replicas (Ray Data actors), each loading the version once
    num_workers: int = 1
    batch_size: int = 4096
    use_gpu: bool = False
    identity: dict[str, str] = field(default_factory=dict)
    storage: StorageSection = field(default_factory=StorageSection)

    def __post_init__(self) -> None:
        storage.validate_partition(self.partition)
        _check_import_path("predict", self.predict)
        for uri in (self.input_uri, self.output_uri):
            storage.split_uri(uri)
        _require(bool(self.model_name), "model_name is empty; name the registered model.")
        _require(
            str(self.model_version).isdigit(),
            f"model_version={self.model_version!r} is not a version number; resolve the alias first "
            "(RayBatchPredictOperator does, once per task).",
        )
        _require(int(self.num_workers) >= 1, f"num_workers={self.num_workers}: use at least 1.")
        _require(int(self.batch_size) >= 1, f"batch_size={self.batch_size}: use at least 1 row.")


#: RLlib algorithms that learn online from a Gymnasium environment (the offline ones need recorded data)
RLLIB_ALGORITHMS = ("APPO", "DQN", "IMPALA", "PPO", "SAC")


@dataclass(frozen=True)
class RLlibJobSpec(SpecPart, RunFolder):
    """``emr_ray.cluster.jobs.rllib``: an RLlib algorithm trained iteration by iteration on a Gymnasium
    environment, checkpointed under ``<storage_path>/<run_name>`` so that a retry resumes."""

    run_name: str
    storage_path: str
    mlflow: MLflowSection
    algorithm: str = "PPO"
    env: str = "CartPole-v1"
    env_config: dict[str, Any] = field(default_factory=dict)
    #: ``AlgorithmConfig.training()`` keywords: lr, gamma, train_batch_size_per_learner, ...
    config: dict[str, Any] = field(default_factory=dict)
    #: ``rl_module(model_config=...)``: e.g. {"fcnet_hiddens": [64, 64]}
    model_config: dict[str, Any] = field(default_factory=dict)
    iterations: int = 20
    num_env_runners: int = 0
    num_envs_per_env_runner: int = 1
    checkpoint_every: int = 1
    num_to_keep: int = 2
    seed: int | None = None
    evaluation_episodes: int = 10
    #: torch threads in the job's driver (its learner, and its sampler when num_env_runners is 0)
    driver_threads: int = 1
    identity: dict[str, str] = field(default_factory=dict)
    storage: StorageSection = field(default_factory=StorageSection)

    def __post_init__(self) -> None:
        _require(
            self.algorithm in RLLIB_ALGORITHMS,
            f"algorithm={self.algorithm!r} is not an online RLlib algorithm: use one of "
            f"{', '.join(RLLIB_ALGORITHMS)}.",
        )
        _require(bool(self.env), "env is empty; name a Gymnasium environment id such as 'CartPole-v1'.")
        _require(int(self.iterations) >= 1, f"iterations={self.iterations}: train at least 1 iteration.")
        _require(
            int(self.num_env_runners) >= 0,
            f"num_env_runners={self.num_env_runners}: use 0 (sample in the job's driver) or more.",
        )
        _require(
            int(self.num_envs_per_env_runner) >= 1,
            f"num_envs_per_env_runner={self.num_envs_per_env_runner}: use at least 1.",
        )
        _require(
            int(self.checkpoint_every) >= 1,
            f"checkpoint_every={self.checkpoint_every}: checkpoint at least every 1 iteration.",
        )
        _require(int(self.num_to_keep) >= 1, f"num_to_keep={self.num_to_keep}: keep at least 1 checkpoint.")
        _require(
            int(self.evaluation_episodes) >= 0,
            f"evaluation_episodes={self.evaluation_episodes}: use 0 (no evaluation) or more.",
        )
        _require(int(self.driver_threads) >= 1, f"driver_threads={self.driver_threads}: use at least 1.")
        storage.split_uri(self.storage_path)

    def fingerprint_payload(self) -> dict[str, Any]:
        """What makes two trainings the same: a retry resumes only a run of the same payload."""
        return {
            "algorithm": self.algorithm,
            "env": self.env,
            "env_config": self.env_config,
            "config": self.config,
            "model_config": self.model_config,
            "iterations": self.iterations,
            "num_env_runners": self.num_env_runners,
            "num_envs_per_env_runner": self.num_envs_per_env_runner,
            "seed": self.seed,
        }


#: every typed spec an operator can build
JobSpec = SparkJobSpec | TrainJobSpec | RLlibJobSpec | PredictJobSpec


def _check_import_path(name: str, path: str) -> None:
    module, sep, attribute = str(path).partition(":")
    _require(
        bool(sep and module and attribute),
        f"{name}={path!r} is not an import path like 'include.models.tabular:train_loop'.",
    )


def encode_spec(spec: dict[str, Any]) -> str:
    """URL-safe base64 of the JSON spec (fits in a shell command line without quoting)."""
    return base64.urlsafe_b64encode(json.dumps(spec, sort_keys=True).encode()).decode()


def decode_spec(text: str) -> dict[str, Any]:
    return json.loads(base64.urlsafe_b64decode(text.encode()).decode())


def entrypoint(module: str, spec: dict[str, Any], python: str = "python") -> str:
    """The Ray job entrypoint that runs ``module`` (a package job) with ``spec``."""
    return f"{python} -m {module} --spec-b64 {encode_spec(spec)}"


def parse_marked(logs: str, marker: str) -> dict[str, Any] | None:
    """The JSON after ``marker`` on the last log line that holds it, or None.

    The marker may follow other output on the same line (Spark's progress bar ends in a carriage
    return, not a newline), so it is searched for, not expected at the start.
    """
    for line in reversed(logs.splitlines()):
        at = line.rfind(marker)
        if at >= 0:
            return json.loads(line[at + len(marker) :])
    return None


def import_by_path(path: str) -> Any:
    """Import ``package.module:attribute`` (the form operators take for user code)."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{path!r} is not an import path like 'include.models.tabular:train_loop'.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"Cannot import {module_name!r} for {path!r} ({e}); the job's PYTHONPATH (runtime_env) "
            "must contain the project root that holds include/."
        ) from e
    try:
        return getattr(module, attribute)
    except AttributeError as e:
        raise ValueError(f"Module {module_name!r} has no {attribute!r} (from {path!r}).") from e
