"""The training job's warm path: fit on a warm worker group, with ``TorchTrainer``'s ``fit()`` shape.

:class:`WarmTrainer` stands where ``jobs.train.build_trainer``'s ``TorchTrainer`` stands: its
``fit()`` runs the loop on the shared group for the job's scaling (:mod:`emr_ray.jobs.train_group`)
and returns what ``fit_and_log`` reads from a Ray Train result (metrics, the latest and best
checkpoints). What Ray Train does around a fit, it does here: each epoch's report is printed and
logged to MLflow as it arrives, the checkpoints are kept by the spec's score, and a failed group is
replaced by a fresh one that resumes from the latest checkpoint, up to ``max_failures`` times.
After the loop, still within the lease, rank 0 logs the best checkpoint's model and compares it with
the champion (:mod:`emr_ray.jobs.train_finish`): its process outlives the job, so what a first model
log costs (2-3 s) it pays once, not once per job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from emr_ray import mlflow_auth, storage
from emr_ray.jobs import _usage, shards, train_group
from emr_ray.jobs import train_mlflow as tracking
from emr_ray.jobs.train_checkpoints import CheckpointStore, StoredCheckpoint
from emr_ray.spec import TrainJobSpec

log = logging.getLogger("emr_ray.jobs.train")
#: the job's last step, run on rank 0 after the loop
FINISH = "emr_ray.jobs.train_finish:log_and_compare_stored"


@dataclass
class WarmFitResult:
    """The parts of Ray Train's ``Result`` the job reads."""

    metrics: dict[str, Any]
    checkpoint: StoredCheckpoint | None
    best_checkpoints: list[tuple[StoredCheckpoint, dict[str, Any]]]
    group: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = None
    #: what rank 0 did after the loop (``comparison``): the model is logged (jobs/train_finish.py)
    finished: dict[str, Any] | None = None

    def get_best_checkpoint(self, metric: str, mode: str) -> StoredCheckpoint | None:
        """The best kept checkpoint (ranked by the spec's score, which is what the job asks for)."""
        return self.best_checkpoints[0][0] if self.best_checkpoints else None


class WarmTrainer:
    """``fit()`` on the warm worker group for ``spec.scaling``."""

    def __init__(self, spec: TrainJobSpec, plan: dict[str, Any], options: storage.StorageOptions,
                 mlflow_run_id: str, job_runtime_env: dict[str, Any]) -> None:  # fmt: skip
        self.spec, self.plan, self.options = spec, plan, options
        self.mlflow_run_id, self.job_runtime_env = mlflow_run_id, job_runtime_env
        self.run_uri = storage.join(spec.storage_path, spec.run_name)
        fsys, run_path = storage.resolve(self.run_uri, options)
        self.store = CheckpointStore(fsys, run_path, spec.checkpoint)
        self.last: dict[str, Any] = {}

    def fit(self) -> WarmFitResult:
        spec = self.spec
        failures = 0
        while True:
            try:
                group = train_group.fit_shared(
                    spec.train_loop, {**spec.config, shards.PLAN_KEY: self.plan}, spec.scaling.to_dict(),
                    self.options, self.run_uri,
                    resume_path=self._resume_path, on_report=self._on_report,
                    idle_timeout_s=spec.worker_group_idle_timeout_s, job_runtime_env=self.job_runtime_env,
                    after=self._finish,
                )  # fmt: skip
                break
            except train_group.GroupFailed as e:
                failures += 1
                if spec.failure.max_failures != -1 and failures > spec.failure.max_failures:
                    raise
                log.warning("%s; restarting from the latest checkpoint in a fresh group (failure %d of %s)",
                            e, failures, spec.failure.max_failures)  # fmt: skip
        for line in group.pop("log"):  # the loop's own log lines, in this job's log
            print(line, flush=True)
        _usage.borrow("actor", "SharedTrainWorkers", {"CPU": group["cpus"], "GPU": group["gpus"]},
                      group["call_started_at"], group["call_ended_at"])  # fmt: skip
        log.info("Warm worker group %s: call %d (%s)", group["name"], group["calls"],
                 "warm" if group["reused"] else f"started in {group['start_seconds']:.1f}s")  # fmt: skip
        done = group["after"]  # the run's checkpoints after the loop, read once (_finish)
        latest = done["latest"]
        return WarmFitResult(
            metrics=self.last or (latest[1] if latest else {}),
            checkpoint=latest[0] if latest else None,
            best_checkpoints=done["kept"],
            group={k: group[k] for k in ("name", "calls", "reused", "start_seconds")},
            finished=done["finished"],
        )

    def _finish(self, run_on_rank0) -> dict[str, Any]:
        """Within the lease, once the loop is done: keep the run's checkpoints by score, then rank 0
        logs the best one's model and compares it with the champion, with the job's MLflow
        credentials for that call only (jobs/train_finish.py). Returns the kept checkpoints, the
        latest and what rank 0 did (None without a checkpoint: fit_and_log says so, or when rank 0
        died: the driver logs and compares instead)."""
        kept, latest = self.store.retain(), self.store.latest()
        best = kept[0][0] if kept else (latest[0] if latest else None)
        finished = None
        if best is not None:
            tracking.ensure_credentials()
            kwargs = {"spec": self.spec, "plan": self.plan, "options": self.options,
                      "mlflow_run_id": self.mlflow_run_id, "checkpoint_path": best.path}  # fmt: skip
            try:
                finished = {"comparison": run_on_rank0(FINISH, kwargs, mlflow_auth.credentials())}
            except train_group.Rank0Lost as e:
                log.warning("%s; this job's driver logs the model and compares instead", e)
        return {"kept": kept, "latest": latest, "finished": finished}

    def _resume_path(self) -> str | None:
        latest = self.store.latest()
        if latest:
            log.info(
                "Resuming from the checkpoint of epoch %d (%s)", int(latest[1]["epoch"]) + 1, latest[0].path
            )
        return latest[0].path if latest else None

    def _on_report(self, report: dict[str, Any]) -> None:
        self.last = dict(report["metrics"])
        tracking.log_epoch(
            self.spec.mlflow.tracking_uri, self.mlflow_run_id, self.spec.epochs, report["metrics"]
        )
        if report.get("checkpoint"):
            self.store.retain()
