"""The training job's warm path: fit on a warm worker group, with ``TorchTrainer``'s ``fit()`` shape.

:class:`WarmTrainer` stands where ``jobs.train.build_trainer``'s ``TorchTrainer`` stands: its
``fit()`` runs the loop on the shared group for the job's scaling (:mod:`emr_ray.cluster.jobs.train_group`)
and returns what ``fit_and_log`` reads from a Ray Train result (metrics, the latest and best
checkpoints). What Ray Train does around a fit, it does here: each epoch's report is printed and
logged to MLflow as it arrives, the checkpoints are kept by the spec's score, and a failed group is
replaced by a fresh one that resumes from the latest checkpoint, up to ``max_failures`` times.
After the loop, still within the lease, rank 0 logs the best checkpoint's model and compares it with
the champion (:mod:`emr_ray.cluster.jobs.train_finish`): its process outlives the job, so what a first model
log costs (2-3 s) it pays once, not once per job.

The job's driver imports no MLflow (what it would cost, 2-3 s a job: the import and opening the
store, is most of a warm training's fixed cost). Rank 0 does every MLflow step of the run: it starts
the run once the lease is taken (and the driver then records its id in the run's state), logs each
epoch's metrics as the driver prints them, logs the model, ends the run, and, after the lease, logs
the job's usage (:func:`WarmTrainer.log_usage`). Each step gets the job's MLflow login with the call.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emr_ray.cluster import mlflow_auth, storage
from emr_ray.cluster.jobs import _usage, shards, train_datasets, train_finish, train_group
from emr_ray.cluster.jobs import train_mlflow as tracking
from emr_ray.cluster.jobs.train_checkpoints import CheckpointStore, StoredCheckpoint
from emr_ray.cluster.results import ChampionScores, PoolUse, TrainResult
from emr_ray.cluster.spec import TrainJobSpec
from emr_ray.cluster.warm.policy import DEFAULT

log = logging.getLogger("emr_ray.cluster.jobs.train")
#: the longest a job's end waits for its usage to be logged (then the result stands without it)
USAGE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class LastStep:
    """What rank 0 did after the loop: the model logged and compared with the champion
    (``comparison``, None when the spec asks for none), and whether it ended the run (``ended``)."""

    comparison: ChampionScores | None
    ended: bool = False


@dataclass
class WarmFitResult:
    """The parts of Ray Train's ``Result`` the job reads."""

    metrics: dict[str, Any]
    checkpoint: StoredCheckpoint | None
    best_checkpoints: list[tuple[StoredCheckpoint, dict[str, Any]]]
    group: PoolUse | None = None
    error: BaseException | None = None
    #: what rank 0 did after the loop (None: it did nothing, or died: the driver does it)
    finished: LastStep | None = None

    def get_best_checkpoint(self, metric: str, mode: str) -> StoredCheckpoint | None:
        """The best kept checkpoint (ranked by the spec's score, which is what the job asks for)."""
        return self.best_checkpoints[0][0] if self.best_checkpoints else None


class WarmTrainer(train_group.GroupCallback):
    """``fit()`` on the warm worker group for ``spec.scaling``; rank 0 starts the MLflow run (resuming
    ``resume_run_id`` when given) and ``on_run_started(run_id)`` records it before the loop runs. Its
    hooks around each call on the group are :class:`~.train_group.GroupCallback`'s."""

    def __init__(
        self,
        spec: TrainJobSpec,
        plan: dict[str, Any],
        options: storage.StorageOptions,
        job_runtime_env: dict[str, Any],
        *,
        resume_run_id: str | None = None,
        on_run_started: Callable[[str], None] = lambda run_id: None,
    ) -> None:
        self.spec, self.plan, self.options, self.job_runtime_env = spec, plan, options, job_runtime_env
        self.resume_run_id, self.on_run_started = resume_run_id, on_run_started
        self.mlflow_run_id: str | None = None
        self.run_uri = spec.run_uri
        fsys, run_path = storage.resolve(self.run_uri, options)
        self.store = CheckpointStore(fsys, run_path, spec.checkpoint, plan.get("inputs"))
        self.last: dict[str, Any] = {}
        self.rank0: Any = None  # the last call's rank 0 (its usage is logged there: log_usage)
        tracking.ensure_credentials()
        self.login = mlflow_auth.credentials()  # the job's MLflow login, passed with each rank-0 step
        self._call: train_group.GroupCall | None = None
        self._began = 0.0
        self._restarted = False  # a group failed: the next one starts by logging what MLflow lacks

    def fit(self) -> WarmFitResult:
        spec = self.spec
        failures = 0
        self._began = time.monotonic()
        while True:
            try:
                call = train_group.fit_shared(
                    spec.train_loop,
                    {**spec.config, shards.PLAN_KEY: self.plan},
                    spec.scaling,
                    self.options,
                    self.run_uri,
                    self,
                    job_runtime_env=self.job_runtime_env,
                    policy=DEFAULT.idle_after(spec.worker_group_idle_timeout_s),
                    tenant=spec.tenant,
                )
                break
            except train_group.GroupFailed as e:
                failures += 1
                self._restarted = True
                if spec.failure.max_failures != -1 and failures > spec.failure.max_failures:
                    raise
                log.warning(
                    "%s; restarting from the latest checkpoint in a fresh group (failure %d of %s)",
                    e,
                    failures,
                    spec.failure.max_failures,
                )
        call.report()  # the loop's own log lines, in this job's log
        _usage.borrow_call("SharedTrainWorkers", call)
        fitted: WarmFitResult = call.value  # the run's checkpoints after the loop, read once (after_loop)
        return dataclasses.replace(fitted, group=call.use)

    def before_loop(self, call: train_group.GroupCall) -> None:
        """Within the lease, before the loop: rank 0 starts the MLflow run (or resumes it, logging the
        epochs a stopped attempt checkpointed), and the job records its id before any checkpoint of
        this attempt exists. A retry in a fresh group keeps the run it started."""
        self._call, self.rank0 = call, call.rank0
        if self.mlflow_run_id is None:
            kwargs = {
                "spec": self.spec,
                "options": self.options,
                "resume_run_id": self.resume_run_id,
                "run_inputs": train_datasets.of_plan(self.plan),
            }
            self.mlflow_run_id = call.step(tracking.begin_run, kwargs, self.login)
            if self.resume_run_id:
                log.info("Resuming MLflow run %s", self.mlflow_run_id)
            self.on_run_started(self.mlflow_run_id)
        elif self._restarted:  # epochs the failed group stored but could not report reach MLflow now
            call.step(
                tracking.begin_run,
                {"spec": self.spec, "options": self.options, "resume_run_id": self.mlflow_run_id},
                self.login,
            )

    def after_loop(self, call: train_group.GroupCall) -> WarmFitResult:
        """Within the lease, once the loop is done: keep the run's checkpoints by score, then rank 0
        logs the best one's model and compares it with the champion, with the job's MLflow
        credentials for that call only (jobs/train_finish.py), and ends the run with its final
        metrics. Returns the fit's result: the kept checkpoints, the latest and what rank 0 did (None
        without a checkpoint: fit_and_log says so, or when rank 0 died: the driver logs, compares and
        ends)."""
        kept, latest = self.store.retain(), self.store.latest()
        best = kept[0][0] if kept else (latest[0] if latest else None)
        finished = None
        if best is not None:
            kwargs = {
                "spec": self.spec,
                "plan": self.plan,
                "options": self.options,
                "mlflow_run_id": self.mlflow_run_id,
                "checkpoint_path": best.path,
            }
            try:
                comparison = call.after_fit(train_finish.log_and_compare_stored, kwargs, self.login)
                finished = LastStep(comparison)
                final = self.last or (latest[1] if latest else {})
                end = {
                    "spec": self.spec,
                    "mlflow_run_id": self.mlflow_run_id,
                    "final": numeric(final),
                    "fit_seconds": time.monotonic() - self._began,
                }
                call.after_fit(tracking.end_run, end, self.login)
                finished = LastStep(comparison, ended=True)
            except train_group.Rank0Lost as e:
                log.warning("%s; this job's driver does the rest of the run's last step", e)
        return WarmFitResult(
            metrics=self.last or (latest[1] if latest else {}),
            checkpoint=latest[0] if latest else None,
            best_checkpoints=kept,
            finished=finished,
        )

    def log_usage(self, spec: TrainJobSpec, result: TrainResult) -> None:
        """After the job's lease: rank 0 logs the job's usage on its MLflow run, the login passed with
        the request, never through the environment (another job's loop may run there meanwhile)."""
        import ray

        if self.rank0 is None:
            return
        ray.get(
            self.rank0.after_lease.options(concurrency_group="after_lease").remote(
                tracking.log_usage_as, {"spec": spec, "result": result, "credentials": self.login}
            ),
            timeout=USAGE_TIMEOUT_S,
        )

    def resume_path(self) -> str | None:
        latest = self.store.latest()
        if latest:
            log.info(
                "Resuming from the checkpoint of epoch %d (%s)", int(latest[1]["epoch"]) + 1, latest[0].path
            )
        return latest[0].path if latest else None

    def on_report(self, report: dict[str, Any]) -> None:
        """An epoch's report: its line in the job's log, its metrics on the MLflow run (by rank 0)."""
        self.last = dict(report["metrics"])
        tracking.print_epoch(self.spec.epochs, report["metrics"])
        assert self._call is not None  # set by before_loop, within the lease
        kwargs = {
            "tracking_uri": self.spec.mlflow.tracking_uri,
            "mlflow_run_id": self.mlflow_run_id,
            "metrics": report["metrics"],
        }
        self._call.step(tracking.log_epoch_metrics, kwargs, self.login)
        if report.get("checkpoint"):
            self.store.retain()


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers among a report's metrics (what the run's final metrics are read from)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
