"""What a run asks of the cluster (``emr_ray.operators.ray.RunRequest``) and how the cluster check words
a shortfall. The check against a real head is in ``tests/integration/test_ray_jobs.py``."""

from __future__ import annotations

import pytest

from emr_ray.operators.ray import RayConnectOperator
from emr_ray.run_request import RunRequest, parse_memory

GIB = 1024**3


def test_training_is_workers_times_the_per_worker_resources_plus_the_driver():
    request = RunRequest(workers=4, resources_per_worker={"CPU": 2, "GPU": 0}, driver_cpus=1)
    assert request.per_worker == {"CPU": 2.0}  # zero amounts are dropped, as Ray Train does
    assert request.training() == {"CPU": 9.0}


@pytest.mark.parametrize(
    ("resources", "use_gpu", "per_worker"),
    [
        (None, False, {"CPU": 1.0}),              # Ray Train's default
        (None, True, {"GPU": 1.0}),               # use_gpu alone asks for no CPU
        ({"CPU": 4}, True, {"CPU": 4.0, "GPU": 1.0}),
        ({"CPU": 1, "GPU": 2}, True, {"CPU": 1.0, "GPU": 2.0}),
        ({"CPU": 1, "custom": 0.5}, False, {"CPU": 1.0, "custom": 0.5}),
    ],
)  # fmt: skip
def test_per_worker_resources_follow_ray_trains_rule(resources, use_gpu, per_worker):
    assert RunRequest(workers=1, resources_per_worker=resources, use_gpu=use_gpu).per_worker == per_worker


def test_the_peak_is_the_larger_phase_per_resource_not_the_sum():
    """Spark is stopped before training starts: the phases never hold resources at the same time."""
    request = RunRequest(workers=2, spark_executors=3, spark_executor_cores=2, spark_executor_memory=GIB)
    assert request.training() == {"CPU": 2.0}
    assert request.spark() == {"CPU": 6.0, "memory": 3.0 * GIB}
    assert request.peak() == {"CPU": 6.0, "memory": 3.0 * GIB}
    assert RunRequest(workers=4, spark_executors=1).peak() == {"CPU": 4.0}
    assert RunRequest().peak() == {}


def test_negative_counts_are_refused():
    with pytest.raises(ValueError, match="workers=-1: use 0 or more"):
        RunRequest(workers=-1)


@pytest.mark.parametrize(
    ("text", "size"),
    [("1g", GIB), ("512m", 512 * 1024**2), ("2GiB", 2 * GIB), ("1.5G", 1.5 * GIB), ("1024", 1024.0),
     (2048, 2048.0), (None, 0.0), ("", 0.0)],
)  # fmt: skip
def test_memory_sizes_read_like_raydp(text, size):
    assert parse_memory(text) == size


def test_a_bad_memory_size_says_how_to_write_it():
    with pytest.raises(ValueError, match="write it like '1g'"):
        parse_memory("lots")


def check(**kwargs) -> RayConnectOperator:
    return RayConnectOperator(task_id="check", **kwargs)


def test_a_shortfall_names_each_phase_the_rule_and_the_fix():
    op = check(workers="4", resources_per_worker={"CPU": 1}, spark_executors="1", spark_executor_cores="1")
    lines = op.shortfalls(op.run_request(), {"CPU": 2.0, "memory": 8 * GIB})
    assert lines == [
        "CPU: training asks 4 worker(s) x 1 CPU = 4 CPU; Spark asks 1 executor(s) x 1 core(s) = 1 CPU; "
        "Spark stops before training, so the run needs the larger: 4 CPU; the cluster has 2 CPU in total: "
        "add nodes or lower num_workers or resources_per_worker"
    ]


def test_rendered_templates_are_read_and_gpus_and_memory_are_checked_too():
    op = check(workers="2", resources_per_worker="{'CPU': 1, 'GPU': 1}", use_gpu="True",
               spark_executors="2", spark_executor_memory="8g", driver_cpus="1")  # fmt: skip
    lines = op.shortfalls(op.run_request(), {"CPU": 8.0, "memory": 4 * GIB})
    assert len(lines) == 2
    gpu, memory = lines
    assert gpu.startswith("GPU: training asks 2 worker(s) x 1 GPU = 2 GPU;") and "has 0 GPU in total" in gpu
    assert memory.startswith("memory: Spark asks 2 executor(s) x 8 GiB memory = 16 GiB memory;")
    assert memory.endswith("lower num_executors, executor_cores or executor_memory")


def test_the_driver_cpus_count_in_both_phases():
    op = check(workers=2, spark_executors=2, driver_cpus=1)
    (cpu,) = op.shortfalls(op.run_request(), {"CPU": 2.0})
    assert "2 worker(s) x 1 CPU + 1 for the job driver = 3 CPU" in cpu
    assert "2 executor(s) x 1 core(s) + 1 for the job driver = 3 CPU" in cpu


def test_the_fixed_requirements_still_work_beside_the_computed_request():
    op = check(required_cpus=64, required_gpus="1", required_memory_gb=2, required_resources={"T4": 1})
    assert op.shortfalls(op.run_request(), {"CPU": 2.0, "memory": GIB}) == [
        "CPU: need 64, cluster has 2 in total",
        "GPU: need 1, cluster has 0 in total",
        "T4: need 1, cluster has 0 in total",
        "memory: need 2 GiB, cluster has 1 GiB in total",
    ]
    assert check(workers=2, required_cpus=2).shortfalls(check(workers=2).run_request(), {"CPU": 2.0}) == []


def test_a_worker_that_fits_no_single_node_is_refused_though_the_total_suffices():
    """Four 4-CPU workers on four 3-CPU nodes: 16 of 12 CPUs fails the total; on six such nodes (18 CPUs)
    the total passes, and Ray would still never place one worker: that is what the node check catches."""
    request = RunRequest(workers=4, resources_per_worker={"CPU": 4}, spark_executors=2,
                         spark_executor_cores=2, spark_executor_memory=6 * GIB)  # fmt: skip
    nodes = [{"CPU": 3.0, "memory": 4 * GIB}] * 6
    assert check().shortfalls(request, {"CPU": 18.0, "memory": 24 * GIB}) == []
    assert request.unplaceable(nodes) == [
        "a training worker needs 4 CPU on one node; the 6 node(s) have at most 3 CPU each (not necessarily "
        "on the same node): add a node that size or lower resources_per_worker",
        "a Spark executor needs 2 CPU, 6 GiB memory on one node; the 6 node(s) have at most 3 CPU, 4 GiB "
        "memory each (not necessarily on the same node): add a node that size or lower executor_cores or "
        "executor_memory",
    ]
    assert request.unplaceable([*nodes, {"CPU": 4.0, "memory": 8 * GIB}]) == []  # one big node will do
