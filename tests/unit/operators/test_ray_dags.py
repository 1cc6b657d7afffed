"""The shipped DAGs state their scaling once, on their tasks: each cluster check reads what its own
downstream preprocess and train tasks will request, rendered for the run, so a change to a task's
scaling is what the check asks for, with no second statement to keep equal."""

from __future__ import annotations

import pytest

from emr_ray.run_request import RunRequest, parse_memory


@pytest.mark.parametrize("dag_id", ["retrain_tabular", "retrain_digits", "retrain_recsys", "retrain_text"])
def test_the_cluster_check_asks_for_what_the_tasks_request(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    check, train, preprocess = (dag.get_task(task_id) for task_id in ("check_cluster", "train", "preprocess"))
    assert check.stated_request() == RunRequest()  # nothing stated twice
    context = {"params": dict(dag.params) | {"num_workers": 3}}
    asked = check.run_request(context)
    assert asked == RunRequest(
        workers=3,  # the run's own param, as train renders it
        resources_per_worker=train.resources_per_worker,
        use_gpu=bool(train.use_gpu),
        spark_executors=int(preprocess.num_executors),
        spark_executor_cores=float(preprocess.executor_cores),
        spark_executor_memory=parse_memory(preprocess.executor_memory),
        driver_cpus=max(float(train.entrypoint_num_cpus or 0), float(preprocess.entrypoint_num_cpus or 0)),
    )


def test_the_rl_check_asks_for_the_learner_and_a_cpu_per_env_runner(dagbag):
    dag = dagbag.dags["retrain_rl"]
    asked = dag.get_task("check_cluster").run_request({"params": dict(dag.params) | {"num_env_runners": 2}})
    assert (asked.workers, dict(asked.resources_per_worker or {}), asked.driver_cpus) == (
        2,
        {"CPU": 1.0},
        1.0,
    )


def test_stated_numbers_win_and_a_check_with_no_ray_task_after_it_asks_for_nothing():
    from emr_ray.operators.ray import RayConnectOperator

    stated = RayConnectOperator(task_id="check", workers=4, resources_per_worker={"CPU": 2})
    assert stated.run_request({"params": {}}).workers == 4
    assert RayConnectOperator(task_id="alone").run_request({"params": {}}) == RunRequest()
