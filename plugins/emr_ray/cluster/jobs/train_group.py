"""A training worker group that outlives one job: the warm path of ``emr_ray.cluster.jobs.train`` (cluster side).

Ray Train builds a worker group for every ``fit()``: a controller actor, the workers, torch imported
in each, the process group, then tears it all down; 10-15 s per training here whatever the data's
size (``bench/results/SUMMARY.md``). With ``worker_group="shared"`` the training job hands its fit to
a warm group instead: a detached coordinator actor (:class:`WarmTrainGroup`) that owns one
:class:`TrainWorker` actor per rank, torch imported and the process group joined once, and runs
each job's loop on them. The loop is the same code (it sees the group through :mod:`emr_ray.cluster.train`).

Its lifecycle is every warm pool's (``docs/warm-pools.md``, :mod:`emr_ray.cluster.warm`); this module
has the group's own part: what names it (:func:`group_key`), start the workers, run a call on them
(:func:`fit_shared`, with the job's :class:`GroupCallback` around the loop, as Ray Train's worker
group callbacks), stop them. A group is leased only when every worker answers; a call that fails
retires it (its workers may be stuck in a collective); no two groups train one run at once
(:func:`wait_for_abandoned_calls`). Rank 0's checkpoints go to the run's folder
(:mod:`emr_ray.cluster.jobs.train_checkpoints`), so a retry resumes in whichever group serves it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from emr_ray.cluster.spec import ScalingSpec
from emr_ray.cluster.warm import keys, registry
from emr_ray.cluster.warm.actor import PoolFigures, WarmActor
from emr_ray.cluster.warm.call_log import CallLog, Ran
from emr_ray.cluster.warm.lease import PoolCall, Replica, lease
from emr_ray.cluster.warm.policy import DEFAULT, PoolPolicy

log = logging.getLogger("emr_ray.cluster.jobs.train_group")

NAMESPACE = "emr_ray_train_groups"
NAME_PREFIX = keys.POOLS[NAMESPACE]
#: how long a training job waits for an abandoned call on its run to end (lease lapse, then retirement)
ABANDONED_WAIT_S = DEFAULT.lease_timeout_s + 30.0
#: how long a new group waits for its workers' resources before it gives up
PLACEMENT_TIMEOUT_S = 300.0
#: how long a failed call waits for rank 0's checkpoint uploads to finish
SETTLE_S = 60.0
#: the longest rank 0 may take for one MLflow step beside the loop (MLflow's own retries included),
#: and for the job's last step (logging the model, scoring the champion): then the group is retired
STEP_TIMEOUT_S = 600.0
AFTER_FIT_TIMEOUT_S = 3600.0


class GroupFailed(RuntimeError):
    """A worker of the group failed during the call (the group is retired)."""


class Rank0Lost(RuntimeError):
    """Rank 0 died during the job's last step, after the loop (the group is retired). The loop's work
    is whole in the run's checkpoints: the job's driver does the step instead."""


def group_key(
    scaling: Mapping[str, Any], runtime_env: Mapping[str, Any], code: str = "", tenant: str = ""
) -> str:
    """The name of the group for this configuration, code (:func:`keys.code_identity`) and tenant (the
    job's connections): equal inputs, equal name; any difference, another."""
    return keys.pool_key(
        NAME_PREFIX,
        {"scaling": dict(scaling), "runtime_env": dict(runtime_env), "code": code, "tenant": tenant},
    )


class TrainWorker:
    """One rank: a process with torch imported and the process group joined, that runs a loop per call."""

    def __init__(self, rank: int, world_size: int, use_gpu: bool) -> None:
        import torch  # what every Ray Train fit would import again

        self.rank, self.world_size, self.use_gpu = rank, world_size, use_gpu
        self.device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")  # Ray sets the visible GPU
        self.reports: list[dict[str, Any]] = []
        self.call = ""  # the running call's id: reports are read by call, never another job's
        self.uploads: Any = (
            None  # the running call's checkpoint uploads (train_checkpoints.BackgroundUploads)
        )
        self._login = threading.Lock()  # one call's MLflow login in the environment at a time

    def address(self) -> tuple[str, int]:
        """This node's address and a free port: where rank 0 hosts the process group's rendezvous."""
        import socket

        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            return ip, s.getsockname()[1]

    def join(self, master: str, port: int) -> None:
        if self.world_size == 1:
            return
        import torch.distributed as dist

        dist.init_process_group(
            "nccl" if self.use_gpu else "gloo",
            init_method=f"tcp://{master}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(minutes=30),
        )

    def run(
        self,
        call: str,
        train_loop: str,
        config: dict[str, Any],
        options: Any,
        run_uri: str,
        resume_path: str | None,
    ) -> Ran:
        """Run the loop once with this call's storage options; rank 0 stores each epoch's checkpoint.
        The value is the number of reports."""
        import tempfile

        from emr_ray.cluster import storage
        from emr_ray.cluster import train as emr_train
        from emr_ray.cluster.jobs import train_checkpoints
        from emr_ray.cluster.spec import import_by_path

        self.call, self.reports = call, []
        fsys, run_path = storage.resolve(run_uri, options)
        uploads = self.uploads = train_checkpoints.BackgroundUploads(fsys, run_path)

        def report(metrics: dict[str, Any], directory: str | None) -> None:
            """Off the training step's path: the checkpoint is stored (and the report published) in
            the background, in order, while the next epoch runs."""
            uploads.submit(metrics, directory, self.reports.append)

        with CallLog.capture() as lines:
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    resume_dir = train_checkpoints.download(fsys, resume_path, tmp) if resume_path else None
                    context = emr_train.WarmGroupContext(
                        self.rank,
                        self.world_size,
                        self.device,
                        options,
                        resume_dir,
                        report,
                        emr_train.inputs_of_plan(config),
                    )
                    with emr_train.running_in(context):
                        import_by_path(train_loop)(config)
            except BaseException:
                uploads.finish(raise_failed=False)  # the loop's own error is the call's
                raise
            uploads.finish()  # every checkpoint stored before the call ends (raises the first failure)
        return Ran(len(self.reports), lines)

    def after_fit(
        self, call: str, fn: Callable[..., Any], kwargs: dict[str, Any], env: dict[str, str]
    ) -> Ran:
        """Run ``fn`` once after this call's loop, with ``env`` (the job's MLflow credentials) in the
        environment for this call only; returns its value and its log lines.

        The job's last step runs here rather than in its fresh driver (``jobs/train_finish.py``): this
        process outlives the job, so what a first model log imports and checks, it does once.
        """
        from emr_ray.cluster.mlflow_auth import scoped_environ

        if call != self.call:
            raise RuntimeError(f"after_fit for call {call}, but this worker last ran call {self.call}")
        with CallLog.capture() as lines, self._login, scoped_environ(env):
            value = fn(**kwargs)
        return Ran(value, lines)

    def mlflow_step(self, fn: Callable[..., Any], kwargs: dict[str, Any], env: dict[str, str]) -> Any:
        """Run ``fn`` (the job's MLflow run start, an epoch's metrics) in the control
        group, beside the loop, with ``env`` (the job's MLflow login) set for this call only.

        The job's fresh driver would import MLflow and open its store for these (2-3 s a job); this
        process did once. Only the lease holder passes a login this way (its loop is the only job's
        code running here meanwhile); after its lease, a job uses :meth:`after_lease`.
        """
        from emr_ray.cluster.mlflow_auth import scoped_environ

        with self._login, scoped_environ(env):
            return fn(**kwargs)

    def after_lease(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        """Run ``fn`` for a job whose lease has ended (its usage on its MLflow run), beside the next
        job's calls: in a concurrency group of its own (``after_lease``), so a slow MLflow never
        queues the next job's steps behind it, and without touching the environment: ``kwargs``
        carries the login, which ``fn`` hands to its request alone (``train_mlflow.log_usage_as``)."""
        return fn(**kwargs)

    def alive(self) -> bool:
        """Answers while the process lives: a group is leased only when every worker answers."""
        return True

    def reports_since(self, call: str, seen: int) -> list[dict[str, Any]]:
        """This call's reports after the first ``seen`` (none while an earlier call's are still held)."""
        return self.reports[seen:] if call == self.call else []

    def settle(self, call: str, seen: int, timeout_s: float) -> list[dict[str, Any]]:
        """After another worker failed: this call's checkpoint uploads finished (at most ``timeout_s``),
        and the reports after the first ``seen``. Every epoch stored whole is reported, so the job
        logs it before it restarts in a fresh group (which resumes from that checkpoint)."""
        if call == self.call and self.uploads is not None:
            self.uploads.settle(timeout_s)
        return self.reports_since(call, seen)


def remote_worker() -> Any:
    """:class:`TrainWorker` as a Ray actor class. Its calls run in three lanes: the loop; ``control``
    (one at a time: the lease holder's MLflow steps, liveness, reports); ``after_lease`` (a finished
    job's usage), so a slow MLflow after one job's lease never queues the next job's steps."""
    import ray

    return ray.remote(max_restarts=0, concurrency_groups={"control": 1, "after_lease": 2})(TrainWorker)  # type: ignore[call-overload]


class WarmTrainGroup(WarmActor):
    """The group's coordinator (a detached actor): owns the workers; the lease is the base's."""

    NAMESPACE = NAMESPACE
    WHAT = "Warm worker group"

    def __init__(self, name: str, scaling: ScalingSpec, **lifecycle: Any) -> None:
        self.scaling = scaling
        super().__init__(name, **lifecycle)

    def start(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        workers, resources = self.scaling.num_workers, self.scaling.per_worker()
        # a placement group made by a detached actor lives as long as that actor: no leak when it is killed
        self.placement = placement_group([resources] * workers, strategy=self.scaling.placement_strategy)
        ready_ref, deadline = self.placement.ready(), time.monotonic() + PLACEMENT_TIMEOUT_S
        while not ray.wait([ready_ref], timeout=2.0)[0]:
            if time.monotonic() > deadline:
                ray.util.remove_placement_group(self.placement)
                raise RuntimeError(
                    f"Warm worker group {self.name}: {workers} x {resources} not placeable in "
                    f"{PLACEMENT_TIMEOUT_S:.0f}s; the cluster lacks the resources."
                )
            # a pool that was busy when this group was asked for may be idle now: it gives way
            registry.release_idle(self.scaling.cpus, keep=self.name)
        extra = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
        worker_class = remote_worker()
        self.workers = [
            worker_class.options(
                num_cpus=resources.get("CPU", 0.0),
                num_gpus=resources.get("GPU", 0),
                resources=extra or None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement, placement_group_bundle_index=rank
                ),
            ).remote(rank, workers, self.scaling.use_gpu)
            for rank in range(workers)
        ]
        master, port = ray.get(self.workers[0].address.remote())
        ray.get([worker.join.remote(master, port) for worker in self.workers])

    def stop(self) -> None:
        import ray

        for worker in self.workers:  # the actor's exit takes its placement group with it
            ray.kill(worker, no_restart=True)

    def figures(self) -> PoolFigures:
        gpus = self.scaling.per_worker().get("GPU", 0.0) * self.scaling.num_workers
        return PoolFigures(cpus=self.scaling.cpus, gpus=gpus, workers=tuple(self.workers))

    def broken(self, timeout_s: float = 30.0) -> str | None:
        """A group is leased only when every worker answers (one may die while idle: an OOM kill, a
        lost node); a dead one's call fails at once, a hung one times out."""
        import ray

        try:
            ray.get(
                [w.alive.options(concurrency_group="control").remote() for w in self.workers],
                timeout=timeout_s,
            )
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return "lost a worker while idle"
        return None


class GroupCallback:
    """What a training job does around its call on a warm group, in the style of Ray Train's worker
    group callbacks: each hook runs in the job's driver, within the lease. The defaults do nothing.

    Errors raised by :meth:`before_loop` and :meth:`after_loop` are the job's, not the group's: they end
    the call without retiring the group (one that loses rank 0 meanwhile is retired)."""

    def before_loop(self, call: GroupCall) -> None:
        """Once the lease is taken, before the loop: ``call.step`` runs a function on rank 0."""

    def resume_path(self) -> str | None:
        """The checkpoint the loop resumes from (asked once per call, after :meth:`before_loop`)."""
        return None

    def on_report(self, report: dict[str, Any]) -> None:
        """One of rank 0's reports (an epoch's metrics and checkpoint), as it comes."""

    def after_loop(self, call: GroupCall) -> Any:
        """Once the loop has succeeded, still within the lease: ``call.after_fit`` runs a function on
        rank 0 (raising :class:`Rank0Lost` if rank 0 dies). What it returns is the call's value."""
        return None


@dataclass
class GroupCall:
    """One job's call on a leased group: rank 0's steps beside the loop, the loop, rank 0's last step.
    A failure that may leave the workers broken retires the group (:meth:`Replica.retire`)."""

    group: Replica
    log: list[str] = field(default_factory=list)

    @property
    def workers(self) -> tuple[Any, ...]:
        return self.group.grant.figures.workers

    @property
    def rank0(self) -> Any:
        return self.workers[0]

    def step(self, fn: Callable[..., Any], kwargs: dict[str, Any], env: dict[str, str]) -> Any:
        """``fn(**kwargs)`` on rank 0 beside the loop (:meth:`TrainWorker.mlflow_step`); its errors are
        the job's, raised as they are (a refused login is a JobInputError: exit 2)."""
        import ray

        ref = self.rank0.mlflow_step.options(concurrency_group="control").remote(fn, kwargs, env)
        try:
            return self._on_rank0(ref, GroupFailed, "rank 0 died", STEP_TIMEOUT_S)
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, Exception):
                raise e.cause from e
            raise

    def after_fit(self, fn: Callable[..., Any], kwargs: dict[str, Any], env: dict[str, str]) -> Any:
        """``fn(**kwargs)`` on rank 0 once the loop has succeeded (:meth:`TrainWorker.after_fit`); its value."""
        ref = self.rank0.after_fit.remote(self.group.token, fn, kwargs, env)
        ran: Ran = self._on_rank0(ref, Rank0Lost, "rank 0 died after the loop", AFTER_FIT_TIMEOUT_S)
        self.log.extend(ran.log)
        return ran.value

    def _on_rank0(self, ref: Any, lost: type[Exception], what: str, timeout_s: float) -> Any:
        import ray

        try:  # the lease is beaten meanwhile: a slow MLflow does not lapse it, a hung one is bounded
            return ray.get(ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            self.group.retire()
            raise lost(
                f"Warm worker group {self.group.name}: rank 0 did not answer in {timeout_s:.0f}s"
            ) from e
        except ray.exceptions.RayActorError as e:
            self.group.retire()
            raise lost(f"Warm worker group {self.group.name}: {what}: {e}") from e

    def _settle(self, call: str, seen: int, callback: GroupCallback) -> None:
        """The reports of checkpoints rank 0 stored before the failure (their uploads run beside the
        loop), when rank 0 still answers; a dead rank 0's are left to the next group's start, which
        logs the run's stored epochs that MLflow lacks (``train_mlflow.begin_run``)."""
        import ray

        try:
            late = ray.get(
                self.rank0.settle.options(concurrency_group="control").remote(call, seen, SETTLE_S),
                timeout=SETTLE_S + 30,
            )
        except Exception:  # rank 0 is gone, or hung in a collective beyond the bound
            return
        for report in late:
            callback.on_report(report)

    def loop(
        self,
        train_loop: str,
        config: dict[str, Any],
        options: Any,
        run_uri: str,
        resume: str | None,
        callback: GroupCallback,
    ) -> None:
        """Run ``train_loop`` on every worker; the callback gets rank 0's reports as they come."""
        import ray

        call = self.group.token
        refs = [w.run.remote(call, train_loop, config, options, run_uri, resume) for w in self.workers]
        pending, seen = list(refs), 0
        while True:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
            try:  # a worker's loop failed, or rank 0 died between two waits (its reports lost with it)
                ray.get(done)
                reports = ray.get(
                    self.rank0.reports_since.options(concurrency_group="control").remote(call, seen)
                )
            except Exception as e:
                self._settle(call, seen, callback)
                raise GroupFailed(f"Warm worker group {self.group.name}: a worker failed: {e}") from e
            seen += len(reports)
            for report in reports:
                callback.on_report(report)
            if not pending:
                break
        self.log = list(ray.get(refs)[0].log)


def fit_shared(
    train_loop: str,
    config: dict[str, Any],
    scaling: ScalingSpec,
    options: Any,
    run_uri: str,
    callback: GroupCallback,
    *,
    job_runtime_env: Mapping[str, Any],
    policy: PoolPolicy = DEFAULT,
    tenant: str = "",
) -> PoolCall:
    """Run ``train_loop`` once on the warm group for ``scaling`` (started if there is none), with
    ``callback``'s hooks around the loop (:class:`GroupCallback`). Returns the call (its value:
    what ``callback.after_loop`` returned). Raises :class:`GroupFailed` (group retired) when a
    worker fails. ``tenant`` (the job's connections) is part of the group's key: groups are
    single-tenant."""
    runtime_env = keys.pool_runtime_env(job_runtime_env)
    key = group_key(scaling.to_dict(), runtime_env, keys.code_identity([train_loop]), tenant)
    with lease(
        WarmTrainGroup, key, scaling.cpus, (scaling,), runtime_env, tag=run_uri, policy=policy
    ) as group:
        call = GroupCall(group)
        callback.before_loop(call)
        with group.at_risk():  # a failed loop may leave the workers stuck in a collective
            call.loop(train_loop, config, options, run_uri, callback.resume_path(), callback)
        value = callback.after_loop(call)
    return group.outcome(value, call.log)


def groups() -> list[str]:
    """The names of the live warm worker groups."""
    return registry.pools(NAMESPACE)


def wait_for_abandoned_calls(run_uri: str, timeout_s: float = ABANDONED_WAIT_S) -> list[str]:
    """Wait until no warm group runs a call on ``run_uri``; returns the groups waited for.

    A job killed outright (SIGKILL, a lost node) leaves its call running in the group until the
    lease lapses and the group retires. A retry that trained the same run meanwhile, in any group or
    in Ray Train's, would be a second writer of its checkpoints (and would resume from checkpoints
    whose epochs no driver logged), so every training job waits here first. A group still serving
    the run after ``timeout_s`` (a job that is alive) fails this one; an Airflow retry tries again.
    """
    import ray

    asked: dict[str, Any] = {}
    for name in groups():
        try:
            asked[name] = (
                ray.get_actor(name, namespace=NAMESPACE).serving.options(concurrency_group="control").remote()
            )
        except ValueError:  # gone meanwhile
            continue
    # a group still starting (placing its workers) answers only when started: it serves nobody yet
    answered, _ = ray.wait(list(asked.values()), num_returns=len(asked), timeout=2.0) if asked else ([], [])
    serving: list[str] = []
    for name, ref in asked.items():
        try:
            if ref in answered and ray.get(ref) == run_uri:
                serving.append(name)
        except Exception:  # died meanwhile
            continue
    if not serving:
        return []
    log.warning(
        "Warm worker group(s) %s still run a call on %s (a killed job's: its lease lapses within "
        "%.0fs); waiting for them to stop, so that the run has one writer",
        ", ".join(serving),
        run_uri,
        DEFAULT.lease_timeout_s,
    )
    deadline = time.monotonic() + timeout_s
    for name in serving:
        registry.wait_gone(name, NAMESPACE, timeout=max(deadline - time.monotonic(), 0.0))
    if alive := [name for name in serving if registry.exists(name, NAMESPACE)]:
        raise RuntimeError(
            f"Warm worker group(s) {', '.join(alive)} still train {run_uri} after "
            f"{timeout_s:.0f}s: another job trains this run; stop it, or retry later."
        )
    return serving
