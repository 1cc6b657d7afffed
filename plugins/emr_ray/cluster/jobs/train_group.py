"""A training worker group that outlives one job: the warm path of ``emr_ray.cluster.jobs.train`` (cluster side).

Ray Train builds a worker group for every ``fit()``: a controller actor, the workers, torch imported
in each, the process group, then tears it all down; 10-15 s per training here whatever the data's
size (``bench/results/SUMMARY.md``). With ``worker_group="shared"`` the training job hands its fit to
a warm group instead: a detached coordinator actor (:class:`WarmTrainGroup`) that owns one
:class:`TrainWorker` actor per rank, torch imported and the process group joined once, and runs
each job's loop on them. The loop is the same code (it sees the group through :mod:`emr_ray.cluster.train`).

**Lifecycle** (shared with the Spark sessions: :mod:`emr_ray.cluster.jobs.warm`)

- *One per configuration*: the name hashes the scaling (workers, GPUs, resources, placement) and the
  job's runtime_env less per-job variables (shipped code, packages, Python). Other code, another group.
- *One job at a time per group*: a job takes a group's lease; another job with the same
  configuration takes a free replica, or waits for a busy one at most its start-up time, then starts
  one if the cluster has room, or waits (:func:`emr_ray.cluster.jobs.warm.serve`). The lease holder's job
  beats every poll; a lease without a beat for ``LEASE_TIMEOUT_S`` (its job was killed) retires the
  group, so an abandoned loop never runs on; until then no other job trains the same run
  (:func:`wait_for_abandoned_calls`): one writer per run.
- *Idle timeout*, *gives way* to jobs that need its CPUs (``release_if_idle``), like a Spark session.
- *Never reused after a failure*: a call that fails retires the group (its workers may be stuck in a
  collective); the job restarts in a fresh group from the latest checkpoint, up to ``max_failures``
  times, as Ray Train does. A group is leased only when every worker answers (one may die while
  idle). If rank 0 dies in the job's last step, after the loop, the job's driver does that step.
- *Credentials per call*: the workers read with the job's storage options, passed with the call;
  the group's environment has no job's secret reference.
- *Checkpoints* go to the run's folder (:mod:`emr_ray.cluster.jobs.train_checkpoints`), so a retry of the
  Airflow task resumes from them in whichever group serves it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from emr_ray.cluster.jobs import warm
from emr_ray.cluster.spec import worker_resources

log = logging.getLogger("emr_ray.cluster.jobs.train_group")

NAMESPACE = "emr_ray_train_groups"
NAME_PREFIX = warm.POOLS[NAMESPACE]
#: a lease whose job has not polled for this long is abandoned (the job was killed)
LEASE_TIMEOUT_S = 30.0
#: how long a training job waits for an abandoned call on its run to end (lease lapse, then retirement)
ABANDONED_WAIT_S = LEASE_TIMEOUT_S + 30.0
#: how long a new group waits for its workers' resources before it gives up
PLACEMENT_TIMEOUT_S = 300.0


class GroupFailed(RuntimeError):
    """A worker of the group failed during the call (the group is retired)."""


class Rank0Lost(RuntimeError):
    """Rank 0 died during the job's last step, after the loop (the group is retired). The loop's work
    is whole in the run's checkpoints: the job's driver does the step instead."""


def group_key(scaling: Mapping[str, Any], runtime_env: Mapping[str, Any]) -> str:
    """The name of the group for this configuration: equal inputs, equal name; any difference, another."""
    return warm.pool_key(NAME_PREFIX, {"scaling": dict(scaling), "runtime_env": dict(runtime_env)})


def bundle(scaling: Mapping[str, Any]) -> dict[str, float]:
    """One worker's placement bundle: :func:`emr_ray.cluster.spec.worker_resources`, the rule Ray
    Train and the cluster check use (with ``use_gpu``, 1 GPU and no CPU unless asked)."""
    return worker_resources(scaling.get("resources_per_worker"), bool(scaling.get("use_gpu")))


class TrainWorker:
    """One rank: a process with torch imported and the process group joined, that runs a loop per call."""

    def __init__(self, rank: int, world_size: int, use_gpu: bool) -> None:
        import torch  # what every Ray Train fit would import again

        self.rank, self.world_size, self.use_gpu = rank, world_size, use_gpu
        self.device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")  # Ray sets the visible GPU
        self.reports: list[dict[str, Any]] = []
        self.call = ""  # the running call's id: reports are read by call, never another job's
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

        dist.init_process_group("nccl" if self.use_gpu else "gloo", init_method=f"tcp://{master}:{port}",
                                rank=self.rank, world_size=self.world_size, timeout=timedelta(minutes=30))  # fmt: skip

    def run(self, call: str, train_loop: str, config: dict[str, Any], options: Any, run_uri: str,
            resume_path: str | None) -> dict[str, Any]:  # fmt: skip
        """Run the loop once with this call's storage options; rank 0 stores each epoch's checkpoint."""
        import tempfile

        from emr_ray.cluster import storage
        from emr_ray.cluster import train as emr_train
        from emr_ray.cluster.jobs import train_checkpoints
        from emr_ray.cluster.spec import import_by_path

        self.call, self.reports = call, []
        fsys, run_path = storage.resolve(run_uri, options)
        lines = warm.CallLog.attach()

        def report(metrics: dict[str, Any], directory: str | None) -> None:
            stored = (
                train_checkpoints.upload(directory, fsys, run_path, metrics["epoch"]) if directory else None
            )
            self.reports.append({"metrics": metrics, "checkpoint": stored})

        try:
            with tempfile.TemporaryDirectory() as tmp:
                resume_dir = train_checkpoints.download(fsys, resume_path, tmp) if resume_path else None
                emr_train._warm = emr_train.WarmCall(self.rank, self.world_size, self.device, options, resume_dir,
                                                     report)  # fmt: skip
                try:
                    import_by_path(train_loop)(config)
                finally:
                    emr_train._warm = None
        finally:
            warm.CallLog.detach()
        return {"log": lines, "reports": len(self.reports)}

    def after_fit(self, call: str, fn: str, kwargs: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
        """Run ``fn`` (an import path) once after this call's loop, with ``env`` (the job's MLflow
        credentials) in the environment for this call only; returns its value and its log lines.

        The job's last step runs here rather than in its fresh driver (``jobs/train_finish.py``): this
        process outlives the job, so what a first model log imports and checks, it does once.
        """
        from emr_ray.cluster.mlflow_auth import scoped_environ
        from emr_ray.cluster.spec import import_by_path

        if call != self.call:
            raise RuntimeError(f"after_fit for call {call}, but this worker last ran call {self.call}")
        lines = warm.CallLog.attach()
        try:
            with self._login, scoped_environ(env):
                value = import_by_path(fn)(**kwargs)
        finally:
            warm.CallLog.detach()
        return {"value": value, "log": lines}

    def mlflow_step(self, fn: str, kwargs: dict[str, Any], env: dict[str, str]) -> Any:
        """Run ``fn`` (an import path: the job's MLflow run start, an epoch's metrics) in the control
        group, beside the loop, with ``env`` (the job's MLflow login) set for this call only.

        The job's fresh driver would import MLflow and open its store for these (2-3 s a job); this
        process did once. Only the lease holder passes a login this way (its loop is the only job's
        code running here meanwhile); after its lease, a job passes its login inside ``kwargs`` to a
        function that hands it to the request alone (``train_mlflow.log_usage_as``).
        """
        from emr_ray.cluster.mlflow_auth import scoped_environ
        from emr_ray.cluster.spec import import_by_path

        with self._login, scoped_environ(env):
            return import_by_path(fn)(**kwargs)

    def alive(self) -> bool:
        """Answers while the process lives: a group is leased only when every worker answers."""
        return True

    def reports_since(self, call: str, seen: int) -> list[dict[str, Any]]:
        """This call's reports after the first ``seen`` (none while an earlier call's are still held)."""
        return self.reports[seen:] if call == self.call else []


class WarmTrainGroup:
    """The group's coordinator (a detached actor): owns the workers, the lease and the idle timeout."""

    def __init__(self, name: str, scaling: dict[str, Any], idle_timeout_s: float) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        started = time.monotonic()
        self.name, self.idle_timeout_s = name, warm.idle_timeout(name, idle_timeout_s)
        workers = int(scaling["num_workers"])
        resources = bundle(scaling)
        # a placement group made by a detached actor lives as long as that actor: no leak when it is killed
        self.placement = placement_group(
            [resources] * workers, strategy=scaling.get("placement_strategy", "PACK")
        )
        ready_ref, deadline = self.placement.ready(), time.monotonic() + PLACEMENT_TIMEOUT_S
        while not ray.wait([ready_ref], timeout=2.0)[0]:
            if time.monotonic() > deadline:
                ray.util.remove_placement_group(self.placement)
                raise RuntimeError(f"Warm worker group {name}: {workers} x {resources} not placeable in "
                                   f"{PLACEMENT_TIMEOUT_S:.0f}s; the cluster lacks the resources.")  # fmt: skip
            # a pool that was busy when this group was asked for may be idle now: it gives way
            warm.release_idle(resources["CPU"] * workers, keep=name)
        extra = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
        worker_class = ray.remote(max_restarts=0, concurrency_groups={"control": 1})(TrainWorker)  # type: ignore[call-overload]
        self.workers = [
            worker_class.options(
                num_cpus=resources.get("CPU", 0.0), num_gpus=resources.get("GPU", 0), resources=extra or None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement, placement_group_bundle_index=rank),
            ).remote(rank, workers, bool(scaling.get("use_gpu")))
            for rank in range(workers)
        ]  # fmt: skip
        master, port = ray.get(self.workers[0].address.remote())
        ray.get([worker.join.remote(master, port) for worker in self.workers])
        self.start_seconds = round(time.monotonic() - started, 2)
        self.cpus = resources.get("CPU", 0.0) * workers
        self.gpus = resources.get("GPU", 0.0) * workers
        self.calls = 0
        self.lease: str | None = None
        self.run_uri: str | None = None  # the leased call's run: its checkpoints' folder
        self.beat = time.monotonic()
        self.retired = False
        self.last_used = time.monotonic()
        self._cond = threading.Condition()
        threading.Thread(target=self._watch, name="idle-and-lease", daemon=True).start()
        log.info("Warm worker group %s: %d worker(s) ready in %.1fs", name, workers, self.start_seconds)

    def acquire(self, wait_s: float, run_uri: str | None = None) -> dict[str, Any] | None:
        """The lease (for a call on ``run_uri``) and the workers, or None if another job still holds
        the lease after ``wait_s``, at most this group's own start-up time (what another would cost)."""
        with self._cond:
            warm.wait_while(
                self._cond,
                lambda: self.lease is not None and not self.retired,
                min(wait_s, self.start_seconds),
            )
            if self.retired:
                raise warm.PoolRetired(f"Warm worker group {self.name} is stopping")
            if self.lease is not None:
                return None
            self.lease, self.beat, self.run_uri = uuid.uuid4().hex, time.monotonic(), run_uri
            return {"lease": self.lease, "workers": self.workers, "calls": self.calls,
                    "start_seconds": self.start_seconds, "cpus": self.cpus, "gpus": self.gpus}  # fmt: skip

    def heartbeat(self, lease: str) -> bool:
        with self._cond:
            if lease != self.lease:
                return False
            self.beat = time.monotonic()
            return True

    def finish(self, lease: str, ok: bool) -> int:
        """End the lease; a failed call retires the group. Returns the calls served."""
        with self._cond:
            if lease == self.lease:
                self.lease, self.run_uri = None, None
                self.calls += 1
                self.last_used = time.monotonic()
                if not ok:
                    self.retired = True
            self._cond.notify_all()
            stop = self.retired
        if stop:
            threading.Thread(target=self._stop, daemon=True).start()
        return self.calls

    def serving(self) -> str | None:
        """The run whose call holds the lease (None when idle)."""
        with self._cond:
            return self.run_uri if self.lease is not None else None

    def release_if_idle(self) -> bool:
        """Stop and exit if no job holds the lease (another job needs the cluster's CPUs)."""
        with self._cond:
            if self.lease is not None or self.retired:
                return False
            self.retired = True
            self._cond.notify_all()
        threading.Thread(target=self._stop, daemon=True).start()
        return True

    def _watch(self) -> None:
        while True:
            time.sleep(min(5.0, max(self.idle_timeout_s / 4, 0.5)))
            with self._cond:
                if self.retired:
                    return
                now = time.monotonic()
                if self.lease is not None and now - self.beat > LEASE_TIMEOUT_S:
                    reason = f"its job stopped polling {now - self.beat:.0f}s ago"
                elif self.lease is None and now - self.last_used > self.idle_timeout_s:
                    reason = f"idle for {self.idle_timeout_s:.0f}s"
                else:
                    continue
                self.retired = True
                self._cond.notify_all()
            log.info("Warm worker group %s: %s, stopping", self.name, reason)
            self._stop()
            return

    def _stop(self) -> None:
        import ray

        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)  # its placement group goes with it


_ACTOR: Any = None


def actor_class() -> Any:
    """:class:`WarmTrainGroup` as a Ray actor: threaded, so a waiting ``acquire`` blocks nothing else."""
    global _ACTOR
    if _ACTOR is None:
        import ray

        _ACTOR = ray.remote(  # type: ignore[call-overload]  # concurrency_groups: actors only
            num_cpus=0,  # its workers hold the CPUs
            max_restarts=0,
            max_concurrency=8,
            concurrency_groups={"control": 1},
        )(WarmTrainGroup)
    return _ACTOR


def fit_shared(
    train_loop: str,
    config: dict[str, Any],
    scaling: dict[str, Any],
    options: Any,
    run_uri: str,
    *,
    resume_path: Callable[[], str | None],
    on_report: Callable[[dict[str, Any]], None],
    idle_timeout_s: float,
    job_runtime_env: Mapping[str, Any],
    before: Callable[[Callable[..., Any]], Any] | None = None,
    after: Callable[[Callable[..., Any]], Any] | None = None,
) -> dict[str, Any]:
    """Run ``train_loop`` once on the warm group for ``scaling`` (started if there is none), from the
    checkpoint ``resume_path()`` names; ``on_report`` gets rank 0's reports as they come. Returns the
    group's figures for the call. Raises :class:`GroupFailed` (group retired) when a worker fails.

    ``before(step)``, when given, runs once the lease is taken, before the loop: ``step(fn, kwargs, env)``
    runs ``fn`` on rank 0 beside the loop (:meth:`TrainWorker.mlflow_step`), and ``before`` may keep
    it for ``on_report`` until this call returns. Its errors are the job's: the group stays sound
    (one that loses rank 0 raises :class:`GroupFailed`).

    ``after(run_on_rank0)``, when given, runs once the loop has succeeded, still within the lease:
    ``run_on_rank0(fn, kwargs, env)`` runs ``fn`` on rank 0 (:meth:`TrainWorker.after_fit`) and returns
    its value; what ``after`` returns is the result's ``after``. Its errors are the job's, not the
    group's: they end the call without retiring the group. If rank 0 dies meanwhile, the group is
    retired and ``run_on_rank0`` raises :class:`Rank0Lost`."""
    import ray

    runtime_env = warm.pool_runtime_env(job_runtime_env)
    lease = _lease(group_key(scaling, runtime_env), scaling, idle_timeout_s, runtime_env, run_uri)
    group, workers, name = lease.pop("group"), lease["workers"], lease["name"]
    began, ok, seen = time.time(), True, 0  # ok: the group is sound (until the loop starts)

    def step(fn: str, kwargs: dict[str, Any], env: dict[str, str]) -> Any:
        nonlocal ok
        ref = workers[0].mlflow_step.options(concurrency_group="control").remote(fn, kwargs, env)
        while not ray.wait([ref], timeout=1.0)[0]:  # a slow MLflow must not lapse the lease
            group.heartbeat.options(concurrency_group="control").remote(lease["lease"])
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as e:
            ok = False
            raise GroupFailed(f"Warm worker group {name}: rank 0 died: {e}") from e
        except ray.exceptions.RayTaskError as e:  # the step's own error, as raised (a refused login is
            if isinstance(e.cause, Exception):  # a JobInputError: exit 2)
                raise e.cause from e
            raise

    try:
        if before is not None:
            before(step)
        ok = False  # a failed loop may leave the workers stuck in a collective
        call, resume = lease["lease"], resume_path()
        refs = [w.run.remote(call, train_loop, config, options, run_uri, resume) for w in workers]
        pending = list(refs)
        while True:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
            try:
                ray.get(done)
            except Exception as e:
                raise GroupFailed(f"Warm worker group {name}: a worker failed: {e}") from e
            reports = ray.get(
                workers[0].reports_since.options(concurrency_group="control").remote(call, seen)
            )
            seen += len(reports)
            for report in reports:
                on_report(report)
            if not pending:
                break
            group.heartbeat.options(concurrency_group="control").remote(lease["lease"])
        outs = ray.get(refs)
        ok = True  # the loop ran: what follows is the job's step, which leaves the group sound

        def run_on_rank0(fn: str, kwargs: dict[str, Any], env: dict[str, str]) -> Any:
            nonlocal ok
            ref = workers[0].after_fit.remote(call, fn, kwargs, env)
            while not ray.wait([ref], timeout=1.0)[0]:
                group.heartbeat.options(concurrency_group="control").remote(lease["lease"])
            try:
                done = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                ok = False
                raise Rank0Lost(f"Warm worker group {name}: rank 0 died after the loop: {e}") from e
            outs[0]["log"].extend(done["log"])
            return done["value"]

        finished = after(run_on_rank0) if after is not None else None
    finally:
        try:
            calls = ray.get(group.finish.options(concurrency_group="control").remote(lease["lease"], ok))
        except Exception as e:  # the group is gone already (killed): nothing left to end
            log.warning("Warm worker group %s: could not end the lease (%s)", name, e)
            calls = lease["calls"] + 1
    return {
        "name": name, "calls": calls, "reused": lease["calls"] > 0, "start_seconds": lease["start_seconds"],
        "cpus": lease["cpus"], "gpus": lease["gpus"], "call_started_at": began, "call_ended_at": time.time(),
        "log": outs[0]["log"], "after": finished, "rank0": workers[0],
    }  # fmt: skip


def _lease(
    key: str, scaling: dict[str, Any], idle_timeout_s: float, runtime_env: dict[str, Any], run_uri: str
) -> dict[str, Any]:
    """A free group's lease: a live replica's, or a new group's when all are busy and the cluster
    has room for it (else wait for one)."""
    import ray

    gone: list[str] = []

    def attempt(name: str, wait_s: float) -> dict[str, Any] | None:
        group = (
            actor_class()
            .options(name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, runtime_env=runtime_env)
            .remote(name, scaling, idle_timeout_s)
        )  # fmt: skip
        try:
            lease = ray.get(group.acquire.remote(wait_s, run_uri))
        except ray.exceptions.RayTaskError as e:
            if not isinstance(e.cause, warm.PoolRetired):
                raise
            warm.wait_gone(name, NAMESPACE)
            return None
        except ray.exceptions.RayActorError:
            gone.append(name)  # died meanwhile (released, killed), or could not start (then say why)
            if len(gone) > 2:
                raise
            warm.wait_gone(name, NAMESPACE)
            return None
        if lease is None:
            return None
        if not _workers_alive(lease["workers"]):  # one died while idle (OOM kill, lost node): retire it
            log.warning("Warm worker group %s lost a worker while idle; retiring it", name)
            with contextlib.suppress(ray.exceptions.RayActorError):
                ray.get(group.finish.options(concurrency_group="control").remote(lease["lease"], False))
            warm.wait_gone(name, NAMESPACE)
            return None
        return lease | {"group": group, "name": name}

    cpus = bundle(scaling).get("CPU", 0.0) * int(scaling["num_workers"])
    return warm.serve(NAMESPACE, key, cpus, attempt, what="warm worker group")


def _workers_alive(workers: list[Any], timeout_s: float = 30.0) -> bool:
    """Whether every worker answers (a dead one's call fails at once; a hung one times out)."""
    import ray

    try:
        ray.get([w.alive.options(concurrency_group="control").remote() for w in workers], timeout=timeout_s)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return False
    return True


def groups() -> list[str]:
    """The names of the live warm worker groups."""
    return warm.pools(NAMESPACE)


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
    log.warning("Warm worker group(s) %s still run a call on %s (a killed job's: its lease lapses within "
                "%.0fs); waiting for them to stop, so that the run has one writer", ", ".join(serving), run_uri,
                LEASE_TIMEOUT_S)  # fmt: skip
    deadline = time.monotonic() + timeout_s
    for name in serving:
        warm.wait_gone(name, NAMESPACE, timeout=max(deadline - time.monotonic(), 0.0))
    if alive := [name for name in serving if warm.exists(name, NAMESPACE)]:
        raise RuntimeError(f"Warm worker group(s) {', '.join(alive)} still train {run_uri} after "
                           f"{timeout_s:.0f}s: another job trains this run; stop it, or retry later.")  # fmt: skip
    return serving
