"""The Airflow pools: every Ray task of every DAG queues in the pool of its kind of work, the local
Airflow creates exactly those pools, and each Ray pool is sized from the lanes the cluster holds."""

from __future__ import annotations

import pytest

from devstack.airflow import POOLS, ray_pool_slots
from emr_ray.operators.mlflow import MLflowRegisterOperator
from emr_ray.operators.predict import RayBatchPredictOperator
from emr_ray.operators.ray import RayJobOperator
from emr_ray.operators.raydp import RayDPSparkOperator
from emr_ray.params import PROMOTION_POOL, SPARK_POOL, TRAIN_POOL


@pytest.fixture(scope="module")
def dags(dagbag):
    assert not dagbag.import_errors, dagbag.import_errors
    return dagbag.dags


def expected_pool(task) -> str | None:
    if isinstance(task, RayDPSparkOperator | RayBatchPredictOperator):  # data work: the Spark lane
        return SPARK_POOL
    if isinstance(task, RayJobOperator):  # every other Ray job of the DAGs trains
        return TRAIN_POOL
    if isinstance(task, MLflowRegisterOperator):
        return PROMOTION_POOL
    return None


def test_a_run_s_training_never_queues_behind_the_next_runs_preprocessing(dags):
    """Spark jobs and trainings take slots of different pools: in a backfill, run 1's training starts
    while run 2's preprocessing runs, instead of every preprocessing taking the shared slots first."""
    seen = set()
    for dag in dags.values():
        for task in dag.tasks:
            if (pool := expected_pool(task)) is not None:
                assert task.pool == pool, (
                    f"{dag.dag_id}.{task.task_id} is in pool {task.pool!r}, not {pool!r}"
                )
                seen.add(pool)
    assert seen == {SPARK_POOL, TRAIN_POOL, PROMOTION_POOL}


def test_the_local_airflow_creates_every_pool_the_dags_use(dags):
    used = {task.pool for dag in dags.values() for task in dag.tasks}
    assert used - {"default_pool"} <= set(POOLS)


@pytest.mark.parametrize(
    ("cpus", "gpus", "kwargs", "slots"),
    [
        (2, 0, {}, 1),  # smaller than a lane: one of each kind; the training's placement group waits
        (3, 0, {}, 2),  # a warm session's executor beside a 2-worker group: one job runs, one waits
        (6, 0, {}, 4),
        (3, 0, {"warm": False}, 1),  # each job starts its own Spark or worker group: 4 CPUs a lane
        (8, 0, {"warm": False}, 2),
        (64, 8, {"gpus_per_lane": 4}, 4),  # GPU training: the GPUs bound the lanes
    ],
)
def test_each_ray_pool_gets_slots_per_lane_and_never_none(cpus, gpus, kwargs, slots):
    """Warm: two per lane, one task's job running in the lane's replica while the next starts and
    waits at it; cold: one per lane, so each job finds its whole request free."""
    assert ray_pool_slots(cpus, gpus, **kwargs) == slots
