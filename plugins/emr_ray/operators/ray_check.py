"""RayConnectOperator: check that the Ray cluster can take this run before any job is submitted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator

from emr_ray.exceptions import RayClusterUnfitError
from emr_ray.hooks.ray import RayHook
from emr_ray.links.ray import RayJobLink
from emr_ray.run_request import RunRequest, mapping_of, number_of, parse_memory
from emr_ray.templating import as_bool


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3] if p.isdigit())


class RayConnectOperator(BaseOperator):
    """Check that the Ray cluster is reachable, recent enough and big enough for this run; push its facts to XCom.

    Fails at once (no retries: a retry cannot grow the cluster) with a message that names the
    problem and the fix: missing or wrong token, a Ray version below ``min_ray_version``, or fewer
    resources in total than the run will ask for. A Jobs API that does not answer (refused, reset,
    503) is retried with backoff for ``unreachable_retry_seconds`` first, as the job monitors do: a
    30-90 s outage of the dashboard (a restart) otherwise failed every run that reached its check
    then, each try at once (found by the chaos soak). Past that, it fails naming the address.

    What the run asks for is read from the training and Spark tasks downstream of this one, their own
    arguments rendered for this run (a DAG states its scaling once). A check without such tasks
    downstream states it here, in the same numbers: ``workers`` and ``resources_per_worker`` (and
    ``use_gpu``) of the training task, ``spark_executors``, ``spark_executor_cores`` and
    ``spark_executor_memory`` of the Spark task, and ``driver_cpus`` (their ``entrypoint_num_cpus``);
    stated numbers win over the tasks'. Spark is stopped before training starts, so each resource is
    checked against the larger of the two phases, not their sum (:class:`RunRequest`). The cluster's
    total is what counts: resources that other jobs hold now are free again later. Each training
    worker, Spark executor and job driver must also fit on one node (Ray never splits one across
    nodes): four 4-CPU workers on four 3-CPU nodes pass the total and would wait forever.

    :param ray_conn_id: the ``ray`` connection.
    :param min_ray_version: lowest acceptable Ray version, e.g. ``"2.50"`` (templated).
    :param workers: Ray Train workers of the training task, e.g. ``"{{ params.num_workers }}"`` (templated).
    :param resources_per_worker: per training worker, e.g. ``{"CPU": 1, "GPU": 0}``; default as
        Ray Train: 1 CPU, or 1 GPU with ``use_gpu`` (templated).
    :param use_gpu: the training task's ``use_gpu`` (templated).
    :param spark_executors: Spark executors of the Spark task (templated).
    :param spark_executor_cores: cores per executor (templated).
    :param spark_executor_memory: memory per executor, e.g. ``"1g"`` (templated).
    :param driver_cpus: CPUs reserved for each job's driver (``entrypoint_num_cpus``; templated).
    :param required_cpus: CPUs the pipeline needs in total, checked besides the computed request (templated).
    :param required_gpus: GPUs the pipeline needs in total (templated).
    :param required_memory_gb: memory the pipeline needs in total, in GiB (templated).
    :param required_resources: custom resources, e.g. ``{"accelerator_type:T4": 1}`` (templated).
    :param unreachable_retry_seconds: how long to retry a Jobs API that does not answer (0: fail at once).
    """

    template_fields: Sequence[str] = (
        "min_ray_version",
        "required_cpus",
        "required_gpus",
        "required_memory_gb",
        "required_resources",
        "workers",
        "resources_per_worker",
        "use_gpu",
        "spark_executors",
        "spark_executor_cores",
        "spark_executor_memory",
        "driver_cpus",
    )
    ui_color = "#e8f4fd"
    operator_extra_links = (RayJobLink(),)  # the dashboard's overview of the cluster it checked

    def __init__(
        self,
        *,
        ray_conn_id: str = RayHook.default_conn_name,
        min_ray_version: str | None = None,
        workers: int | str = 0,
        resources_per_worker: dict[str, float] | str | None = None,
        use_gpu: bool | str = False,
        spark_executors: int | str = 0,
        spark_executor_cores: float | str = 1,
        spark_executor_memory: str | float | None = None,
        driver_cpus: float | str = 0,
        required_cpus: float | str = 0,
        required_gpus: float | str = 0,
        required_memory_gb: float | str = 0,
        required_resources: dict[str, float] | None = None,
        unreachable_retry_seconds: float = 120.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.ray_conn_id = ray_conn_id
        self.unreachable_retry_seconds = float(unreachable_retry_seconds)
        self.min_ray_version = min_ray_version
        self.workers = workers
        self.resources_per_worker = resources_per_worker
        self.use_gpu = use_gpu
        self.spark_executors = spark_executors
        self.spark_executor_cores = spark_executor_cores
        self.spark_executor_memory = spark_executor_memory
        self.driver_cpus = driver_cpus
        self.required_cpus = required_cpus
        self.required_gpus = required_gpus
        self.required_memory_gb = required_memory_gb
        self.required_resources = required_resources or {}

    @cached_property
    def hook(self) -> RayHook:
        return RayHook(self.ray_conn_id, retry_seconds=self.unreachable_retry_seconds)

    def run_request(self, context: Any = None) -> RunRequest:
        """The rendered arguments as a :class:`RunRequest`; when they name neither workers nor Spark
        executors, what this run's downstream training and Spark tasks will ask for, their own
        arguments rendered in ``context`` (:meth:`downstream_request`): one statement of the scaling."""
        stated = self.stated_request()
        if context is None or stated.workers or stated.spark_executors:
            return stated
        return self.downstream_request(context) or stated

    def downstream_request(self, context: Any) -> RunRequest | None:
        """What the Ray tasks after this one ask for: a training's workers (Ray Train workers, or an
        RLlib training's EnvRunners at 1 CPU each), a Spark task's executors, the largest driver
        reservation. None when no such task follows (a DAG of other operators)."""
        from emr_ray.operators.ray import RayJobOperator
        from emr_ray.operators.raydp import RayDPSparkOperator
        from emr_ray.operators.rllib import RLlibTrainOperator
        from emr_ray.operators.torch import TorchTrainOperator

        def rendered(task: BaseOperator, value: Any) -> Any:
            return task.render_template(value, context)

        fields: dict[str, Any] = {}
        drivers = [0.0]
        for task in self.get_flat_relatives(upstream=False):
            if isinstance(task, TorchTrainOperator):
                fields |= {
                    "workers": int(number_of(rendered(task, task.num_workers))),
                    "resources_per_worker": mapping_of(rendered(task, task.resources_per_worker)),
                    "use_gpu": as_bool(rendered(task, task.use_gpu)),
                }
            elif isinstance(task, RLlibTrainOperator):
                fields |= {
                    "workers": int(number_of(rendered(task, task.num_env_runners))),
                    "resources_per_worker": {"CPU": 1.0},
                }
            elif isinstance(task, RayDPSparkOperator):
                fields |= {
                    "spark_executors": int(number_of(rendered(task, task.num_executors))),
                    "spark_executor_cores": number_of(rendered(task, task.executor_cores), 1.0),
                    "spark_executor_memory": parse_memory(rendered(task, task.executor_memory)),
                }
            if isinstance(task, RayJobOperator):
                drivers.append(number_of(task.entrypoint_num_cpus))
        if not fields:
            return None
        return RunRequest(driver_cpus=max(drivers), **fields)

    def stated_request(self) -> RunRequest:
        """The rendered arguments as a :class:`RunRequest`."""
        return RunRequest(
            workers=int(number_of(self.workers)),
            resources_per_worker=mapping_of(self.resources_per_worker),
            use_gpu=as_bool(self.use_gpu),
            spark_executors=int(number_of(self.spark_executors)),
            spark_executor_cores=number_of(self.spark_executor_cores, 1.0),
            spark_executor_memory=parse_memory(self.spark_executor_memory),
            driver_cpus=number_of(self.driver_cpus),
        )

    def shortfalls(self, request: RunRequest, total: Mapping[str, float]) -> list[str]:
        """One line per resource the cluster has too little of in total, saying what asks for it."""
        required = {
            "CPU": number_of(self.required_cpus),
            "GPU": number_of(self.required_gpus),
            "memory": number_of(self.required_memory_gb) * 1024**3,
        }
        required.update({k: float(v) for k, v in (mapping_of(self.required_resources) or {}).items()})
        peak = request.peak()
        lines = []
        for resource in sorted({*peak, *required}):
            have = float(total.get(resource, 0.0))
            if peak.get(resource, 0.0) > have:
                lines.append(request.explain(resource, have))
            elif required.get(resource, 0.0) > have:
                need, has = (
                    (f"{required[resource] / 1024**3:g} GiB", f"{have / 1024**3:g} GiB")
                    if resource == "memory"
                    else (f"{required[resource]:g}", f"{have:g}")
                )
                lines.append(f"{resource}: need {need}, cluster has {has} in total")
        return lines

    def execute(self, context: Any) -> dict[str, Any]:
        version = self.hook.get_version()
        resources = self.hook.get_cluster_resources()
        total = resources["total"]
        ray_version = version.get("ray_version", "unknown")
        self.log.info(
            "Ray %s at %s: %d node(s), resources %s",
            ray_version,
            self.hook.dashboard_url,
            len(resources["nodes"]),
            total,
        )
        if self.min_ray_version and _version_tuple(ray_version) < _version_tuple(str(self.min_ray_version)):
            raise RayClusterUnfitError(
                f"Ray cluster at {self.hook.dashboard_url} runs Ray {ray_version}, older than the required "
                f"{self.min_ray_version}; upgrade the cluster or lower min_ray_version."
            )
        request = self.run_request(context)
        if request.peak():
            self.log.info(
                "This run asks for at most %s (training %s, Spark %s)",
                request.peak(),
                request.training(),
                request.spark(),
            )
        short = self.shortfalls(request, total)
        sizes = [n["resources"] for n in resources["nodes"] if n.get("resources")]
        if sizes:
            short += request.unplaceable(sizes)
        if short:
            raise RayClusterUnfitError(
                f"Ray cluster at {self.hook.dashboard_url} is too small for this run; no retry can fix "
                "that:\n  " + "\n  ".join(short)
            )
        facts = {
            "address": self.hook.dashboard_url,
            "ray_version": ray_version,
            "nodes": len(resources["nodes"]),
            "cpus": total.get("CPU", 0.0),
            "gpus": total.get("GPU", 0.0),
            "memory_gb": round(total.get("memory", 0.0) / 1024**3, 2),
            "resources": total,
            "request": request.peak(),
        }
        RayJobLink.persist(context, self.hook.dashboard_url)
        return facts
