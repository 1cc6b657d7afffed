"""The shipped DAGs' cluster checks ask for what their own preprocess and train tasks will request, so a
change to one task's scaling that the check does not follow fails here, not on a too-small cluster."""

from __future__ import annotations

import pytest

from emr_ray.run_request import RunRequest, parse_memory


def tasks_request(dag) -> RunRequest:
    """What the DAG's preprocess and train tasks will ask for, read from the tasks themselves."""
    preprocess, train = dag.get_task("preprocess"), dag.get_task("train")
    return RunRequest(
        workers=0,  # the templated worker count is compared as text below
        resources_per_worker=train.resources_per_worker,
        use_gpu=bool(train.use_gpu),
        spark_executors=int(preprocess.num_executors),
        spark_executor_cores=float(preprocess.executor_cores),
        spark_executor_memory=parse_memory(preprocess.executor_memory),
        driver_cpus=float(train.entrypoint_num_cpus or 0),
    )


@pytest.mark.parametrize("dag_id", ["retrain_tabular", "retrain_digits", "retrain_recsys"])
def test_the_cluster_check_asks_for_what_the_tasks_request(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    check, train, preprocess = (
        dag.get_task("check_cluster"),
        dag.get_task("train"),
        dag.get_task("preprocess"),
    )
    assert check.workers == train.num_workers == "{{ params.num_workers }}"
    check.render_template_fields({"params": {"num_workers": dag.params["num_workers"]}})
    asked = check.run_request()
    assert asked.workers == dag.params["num_workers"]
    wanted = tasks_request(dag)
    assert asked.per_worker == RunRequest(workers=1, resources_per_worker=train.resources_per_worker,
                                          use_gpu=bool(train.use_gpu)).per_worker  # fmt: skip
    assert asked.spark() == wanted.spark()
    assert float(check.driver_cpus or 0) == float(preprocess.entrypoint_num_cpus or 0) == wanted.driver_cpus
