"""Job: distributed PyTorch training with Ray Train's TorchTrainer (or, with ``worker_group="shared"``,
on a warm worker group that outlives the job: :mod:`emr_ray.cluster.jobs.train_warm`), tracked in MLflow.

Workers read their own shards of the committed Parquet partitions (``emr_ray.cluster.train.worker_shard``);
the job only plans them from the Parquet footers, so no data passes through the job or Ray's object
store. The steps of :func:`run`: plan the shards, read the resume state, build the trainer, fit and
log, return the result.

Identity makes it resumable: the run's storage path and name come from the Airflow task, and a
small state file there remembers the MLflow run and (once done) the result. A retry of an
unfinished run resumes from its latest checkpoint into the same MLflow run; a rerun of a finished
run with the same inputs returns the stored result instead of training again; a rerun with other
inputs or hyperparameters starts clean.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from emr_ray.cluster import mlflow_auth, partitions, retention, storage
from emr_ray.cluster.jobs import _usage, shards, train_datasets, train_finish, train_group
from emr_ray.cluster.jobs import compare as comparing
from emr_ray.cluster.jobs import train_mlflow as tracking
from emr_ray.cluster.jobs._runtime import JobInputError, main
from emr_ray.cluster.results import ChampionScores, TrainResult
from emr_ray.cluster.reuse import FORCE_ENV
from emr_ray.cluster.spec import TrainJobSpec, import_by_path
from emr_ray.cluster.warm import registry

log = logging.getLogger("emr_ray.cluster.jobs.train")
STATE_FILE = "_emr_ray_state.json"


def fingerprint(spec: TrainJobSpec, manifests: dict[str, Any]) -> str:
    """What makes two trainings the same: code path, config, scaling and the exact input data."""
    payload = spec.fingerprint_payload() | {"manifests": manifests}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class RunState:
    """The job's own memory of a training run, in ``<storage_path>/<run_name>/_emr_ray_state.json``."""

    fsys: Any
    path: str

    def read(self) -> dict[str, Any]:
        """The stored state; ``{}`` when there is none. An unreadable one (cut short by a crash, edited
        by hand) is copied beside the run's folder for inspection and reported as ``{"unreadable":
        <copy>}``: :func:`resume_state` then starts the run clean, as every retry would fail on it."""
        from pyarrow import fs as pafs

        path = f"{self.path}/{STATE_FILE}"
        if self.fsys.get_file_info(path).type != pafs.FileType.File:
            return {}
        with self.fsys.open_input_stream(path) as f:
            raw = f.read()
        try:
            state = json.loads(raw.decode())
            if isinstance(state, dict):
                return state
        except ValueError:
            pass
        kept = f"{self.path}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}-{STATE_FILE}"
        with self.fsys.open_output_stream(kept) as f:
            f.write(raw)
        return {"unreadable": kept}

    def write(self, state: dict[str, Any]) -> None:
        self.fsys.create_dir(self.path, recursive=True)
        with self.fsys.open_output_stream(f"{self.path}/{STATE_FILE}") as f:
            f.write(json.dumps(state, indent=2, sort_keys=True, default=str).encode())

    def clear(self) -> None:
        self.fsys.delete_dir(self.path)


# -- step 1: plan -----------------------------------------------------------------------------------
Inputs = dict[str, tuple[partitions.Committed, str]]


def resolve_inputs(spec: TrainJobSpec, options: storage.StorageOptions) -> Inputs:
    """Each dataset's committed generation and output name, read once (the fingerprint and the plan
    both use them)."""
    return {name: partitions.for_output_uri(uri, options) for name, uri in spec.datasets.items()}


def plan_datasets(
    spec: TrainJobSpec, options: storage.StorageOptions, inputs: Inputs | None = None
) -> dict[str, Any]:
    """The shard plan for the workers: exactly the files each dataset's committed manifest lists
    (sizes checked), with their row counts from the Parquet footers."""
    inputs = inputs or resolve_inputs(spec, options)
    datasets = {}
    for name, uri in spec.datasets.items():
        committed, output = inputs[name]
        files = [path for path, _ in partitions.dataset_files(committed, output, options)]
        if not files:
            raise JobInputError(
                f"Training input {name}={uri} has no Parquet files; run the preprocessing step first."
            )
        counted, columns = storage.parquet_footers(files, uri, options)
        if not sum(rows for _, rows in counted):
            raise JobInputError(f"Training input {name}={uri} has no rows; check the preprocessing step.")
        datasets[name] = shards.describe(uri, counted, equal=(name == "train"), columns=columns)
    return {"datasets": datasets, "storage": spec.storage.to_dict()}


def planned_rows(plan: dict[str, Any], spec: TrainJobSpec) -> dict[str, int]:
    rows = {name: sum(n for _, n in entry["files"]) for name, entry in plan["datasets"].items()}
    workers = spec.scaling.num_workers
    if rows["train"] < workers:
        raise JobInputError(
            f"Training input {spec.datasets['train']} has {rows['train']} rows for {workers} workers; "
            "use fewer workers or a larger partition."
        )
    return rows


def pin_inputs(
    spec: TrainJobSpec, inputs: Inputs, options: storage.StorageOptions, mlflow_run_id: str | None = None
) -> None:
    """Pin each input generation for this training (``train-<run name>``), with its MLflow run once
    known: retention keeps them while it reads, and afterwards while a version registered from that run
    is kept (the housekeeping asks the registry). A rerun without a run id never erases the one the pin
    holds (:func:`~emr_ray.cluster.retention.pin`). A pin that cannot be written fails the training: a
    model version whose data retention may remove is not traceable months later."""
    for committed, _ in inputs.values():
        if committed.generation == partitions.LEGACY:
            continue
        try:
            retention.pin(
                committed.partition_uri,
                committed.generation,
                f"train-{spec.run_name}",
                options,
                kind="training",
                run_name=spec.run_name,
                mlflow_run_id=mlflow_run_id,
            )
        except Exception as e:
            raise JobInputError(
                f"Could not pin generation {committed.generation} of {committed.partition_uri} for this "
                f"training ({type(e).__name__}: {e}). Without the pin, retention could remove the data a "
                f"model version is trained on: give the training's storage keys write access under "
                f"{committed.partition_uri}/{partitions.PINS}/, then run the task again."
            ) from e


# -- step 2: resume state ---------------------------------------------------------------------------
def input_manifests(
    spec: TrainJobSpec, options: storage.StorageOptions, inputs: Inputs | None = None
) -> dict[str, Any]:
    """Each input's generation and the digest of its files' checksums (part of the fingerprint):
    other data, even with the same row counts, is another training."""
    inputs = inputs or resolve_inputs(spec, options)
    return {
        name: {"generation": committed.generation, "digest": committed.digest()}
        for name, (committed, _) in inputs.items()
    }


class NamedRun(Protocol):
    """A job spec with a run name (the training and the RLlib job's specs)."""

    @property
    def run_name(self) -> str: ...


def finished_result(state: dict[str, Any], print_key: str, *, force: bool = False) -> TrainResult | None:
    """The stored result of a finished run with these inputs (``state`` as :meth:`RunState.read`
    gave it), or None: what a rerun returns without training again (nor waiting for anything). A
    stored result this code cannot read as a training's is not returned: the run trains again."""
    if force or state.get("unreadable") or state.get("fingerprint") != print_key:
        return None
    return TrainResult.read(state.get("result"))


def resume_state(
    spec: NamedRun,
    run_state: RunState,
    print_key: str,
    *,
    force: bool = False,
    state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The stored state to continue from: kept when the inputs are the same, cleared otherwise
    (and always cleared when recomputation is forced). The training and the RLlib job's rule.
    ``state``: what :meth:`RunState.read` gave, when the caller read it already (read once: an
    unreadable state is copied aside on each read)."""
    state = run_state.read() if state is None else state
    if state.get("unreadable"):
        log.warning(
            "The stored state of run %s is unreadable (kept as %s): starting the run clean.",
            spec.run_name,
            state["unreadable"],
        )
        run_state.clear()
        return {}
    if state and force:
        log.info("Recomputation forced: discarding the stored run %s.", spec.run_name)
        run_state.clear()
        return {}
    if state and state.get("fingerprint") != print_key:
        log.info("Inputs changed since the stored run %s: starting it clean.", spec.run_name)
        run_state.clear()
        return {}
    return state


# -- step 3: trainer --------------------------------------------------------------------------------
def build_trainer(
    spec: TrainJobSpec, plan: dict[str, Any], options: storage.StorageOptions, mlflow_run_id: str
):
    """A ``TorchTrainer`` from the spec's scaling, checkpoint and failure parts."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from emr_ray.cluster import train as emr_train

    storage_scheme, storage_root = storage.split_uri(spec.storage_path)
    ckpt = spec.checkpoint
    return TorchTrainer(
        emr_train.with_inputs_of_plan(import_by_path(spec.train_loop)),
        train_loop_config={**spec.config, shards.PLAN_KEY: plan},
        scaling_config=ray.train.ScalingConfig(
            num_workers=spec.scaling.num_workers,
            use_gpu=spec.scaling.use_gpu,
            resources_per_worker=spec.scaling.resources_per_worker,
            placement_strategy=spec.scaling.placement_strategy,
        ),
        run_config=ray.train.RunConfig(
            name=spec.run_name,
            storage_path=storage_root,
            storage_filesystem=storage.filesystem(spec.storage_path, options)
            if storage_scheme != "file"
            else None,
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=ckpt.num_to_keep,
                checkpoint_score_attribute=ckpt.score_attribute,
                checkpoint_score_order=ckpt.score_order,
            ),
            failure_config=ray.train.FailureConfig(max_failures=spec.failure.max_failures),
            callbacks=[tracking.epoch_callback(spec.mlflow.tracking_uri, mlflow_run_id, spec.epochs)],
        ),
    )


# -- step 4: fit and log ----------------------------------------------------------------------------
@dataclass
class Fitted:
    result: Any
    best: Any
    final: dict[str, Any]
    seconds: float
    comparison: ChampionScores | None = None


def fit_and_log(
    trainer, spec: TrainJobSpec, plan: dict[str, Any], options, mlflow_run_id: str | None
) -> Fitted:
    """Fit, then log the best checkpoint's model, the loss curve and the final metrics; end the run.

    A warm group starts the run, logs the model, compares with the champion and ends the run on its
    rank 0 within the fit (:mod:`emr_ray.cluster.jobs.train_warm`; ``mlflow_run_id`` None: the trainer's);
    after Ray Train's fit, this driver does. A failed fit marks the run FAILED.
    """
    try:
        started = time.monotonic()
        result = trainer.fit()
        seconds = time.monotonic() - started
        mlflow_run_id = mlflow_run_id or trainer.mlflow_run_id
        if result.error:
            raise result.error
        best = result.get_best_checkpoint(spec.checkpoint.score_attribute, spec.checkpoint.score_order)
        best = best or result.checkpoint
        if best is None:
            raise RuntimeError(f"Training {spec.run_name} finished without a checkpoint; nothing to log.")
        finished = getattr(result, "finished", None)  # what a warm group's rank 0 did (LastStep)
        if finished is not None:
            comparison = finished.comparison
        else:
            comparison = train_finish.log_and_compare(spec, plan, options, mlflow_run_id, best)
        final = {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}
        if not (finished and finished.ended):
            tracking.end_run(spec, mlflow_run_id, final, seconds)
    except BaseException:
        failed_run = mlflow_run_id or getattr(trainer, "mlflow_run_id", None)
        if failed_run:  # none when a warm group failed before its rank 0 started the run
            tracking.client(spec).set_terminated(failed_run, status="FAILED")
        raise
    return Fitted(result, best, final, seconds, comparison)


# -- step 5: result ---------------------------------------------------------------------------------
def result_of(spec: TrainJobSpec, fitted: Fitted, mlflow_run_id: str, rows: dict[str, int]) -> TrainResult:
    """The job's JSON result (the operator's XCom)."""
    best_metrics = {}
    for checkpoint, metrics in fitted.result.best_checkpoints or []:
        if checkpoint.path == fitted.best.path:
            best_metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    scheme, _ = storage.split_uri(spec.storage_path)
    path = fitted.best.path
    checkpoint_uri = f"file://{path}" if scheme == "file" else f"{scheme}://{path.lstrip('/')}"
    return TrainResult(
        mlflow_run_id=mlflow_run_id,
        tracking_uri=mlflow_auth.redact_uri(spec.mlflow.tracking_uri),
        run_name=spec.run_name,
        checkpoint_uri=checkpoint_uri,
        final_metrics=fitted.final,
        best_metrics=best_metrics,
        epochs_completed=int(fitted.final.get("epoch", spec.epochs - 1)) + 1,
        rows=rows,
        fit_seconds=round(fitted.seconds, 2),
        comparison=fitted.comparison,
    )


def run(spec: TrainJobSpec, usage: UsageLog | None = None) -> TrainResult:
    """Train (or return the stored result); ``usage``: who logs the job's usage afterwards, told here
    when a warm group's rank 0 does."""
    import ray

    usage = usage or UsageLog()

    options = spec.storage.options()
    import_by_path(spec.train_loop)
    import_by_path(f"{spec.model_module}:build_model")  # fail before training, not after it
    inputs = resolve_inputs(spec, options)
    pin_inputs(spec, inputs, options)
    print_key = fingerprint(spec, input_manifests(spec, options, inputs))
    run_state = RunState(*storage.resolve(spec.run_uri, options))
    force = os.environ.get(FORCE_ENV) == "1"
    stored_state = run_state.read()
    _usage.lap("check_inputs")
    if stored := finished_result(stored_state, print_key, force=force):
        log.info(
            "Training %s already finished with these inputs; returning its stored result.", spec.run_name
        )
        # the champion may have changed since: compare again without training again (jobs/compare.py)
        comparison = comparing.refresh(spec, stored, lambda: plan_datasets(spec, options, inputs), options)
        return dataclasses.replace(stored, reused=True, comparison=comparison)

    # Ray Train's controller polls its workers every 2 s by default: each epoch's report, and the end
    # of training, wait for the next poll. Polls are cheap; 0.5 s takes seconds off every fit().
    # Ray Train passes this variable from the driver to its controller and workers.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    ray.init(address="auto", logging_level=logging.WARNING, ignore_reinit_error=True)
    _usage.lap("ray_connect")
    started = time.monotonic()
    plan = plan_datasets(spec, options, inputs)
    # what MLflow shows of the run's data: the generations, their digests, schemas and rows
    plan[train_datasets.PLAN_KEY] = [item.to_dict() for item in train_datasets.describe(inputs, plan)]
    rows = planned_rows(plan, spec)
    log.info("Planned per-worker shards of %s rows in %.1fs", rows, time.monotonic() - started)
    _usage.lap("plan")

    # A killed job's warm call on this run may still be writing its checkpoints: one writer per run.
    # Wait before deciding what to resume: a run folder cleared for other inputs while that call
    # still wrote into it would hand this run the other inputs' weights.
    train_group.wait_for_abandoned_calls(spec.run_uri)
    state = resume_state(spec, run_state, print_key, force=force, state=stored_state)
    plan["inputs"] = print_key  # every checkpoint carries it; one of other inputs is never resumed
    resuming = state.get("mlflow_run_id")
    state = {"fingerprint": print_key}

    def record_run(run_id: str) -> None:  # before this attempt's first checkpoint: a retry resumes the run
        state["mlflow_run_id"] = run_id
        run_state.write(state)
        pin_inputs(spec, inputs, options, run_id)

    mlflow_run_id: str | None = None
    if spec.worker_group == "shared":  # a warm group that outlives this job (jobs/train_group.py)
        from emr_ray.cluster.jobs.train_warm import WarmTrainer

        # its rank 0 starts the run within the lease: this driver imports no MLflow (jobs/train_warm.py)
        trainer = WarmTrainer(
            spec,
            plan,
            options,
            ray.get_runtime_context().runtime_env,
            resume_run_id=resuming,
            on_run_started=record_run,
        )
        usage.by(trainer.log_usage)
    else:
        record_run(mlflow_run_id := tracking.start_run(spec, resuming, train_datasets.of_plan(plan)))
        if resuming:
            tracking.backfill_checkpointed_epochs(run_state.fsys, run_state.path, spec, mlflow_run_id)
        _usage.lap("mlflow_start")
        # idle warm pools give way to Ray Train's worker group (a small cluster has no CPU for both)
        registry.release_idle(spec.scaling.cpus)
        trainer = build_trainer(spec, plan, options, mlflow_run_id)
    _usage.lap("build_trainer")
    fitted = fit_and_log(trainer, spec, plan, options, mlflow_run_id)
    _usage.lap("log", fit=fitted.seconds)  # fit: worker group start + epochs (their seconds: epoch metrics)
    output = result_of(spec, fitted, state["mlflow_run_id"], rows)
    # the inputs its checkpoints carry (a version's receipt); the warm group that trained it
    output = dataclasses.replace(
        output, inputs_fingerprint=print_key, worker_group=getattr(fitted.result, "group", None)
    )
    run_state.write(state | {"result": output.to_dict()})
    return output


class UsageLog:
    """The job's ``after`` (:func:`emr_ray.cluster.jobs._runtime.main`): its usage on its MLflow run,
    logged by this driver, or on the warm path by the group's rank 0 (:func:`run` says so), so that
    the driver imports no MLflow."""

    def __init__(self) -> None:
        self.logger: Callable[[TrainJobSpec, TrainResult], None] = tracking.log_usage

    def by(self, logger: Callable[[TrainJobSpec, TrainResult], None]) -> None:
        self.logger = logger

    def __call__(self, spec: TrainJobSpec, result: TrainResult) -> None:
        self.logger(spec, result)


if __name__ == "__main__":
    usage = UsageLog()
    main(lambda spec: run(spec, usage), spec_type=TrainJobSpec, after=usage, fast_exit=True)
