"""RLlibTrainOperator resumes instead of restarting, on the real local Ray cluster and MLflow store.

The Airflow side is killed while PPO trains (the first try's Ray job is stopped after it has
checkpointed some iterations); the retry restores RLlib's latest checkpoint, continues from its
iteration into the same MLflow run, and every iteration reaches MLflow exactly once. A third try
reattaches to the finished job; a new job for the same finished training returns its stored
result. The Airflow task context is the small stand-in from ``test_ray_jobs``; Ray, RLlib and
MLflow are real.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from emr_ray.cluster.jobs.rllib import STEP_METRIC
from emr_ray.hooks.ray import RayHook
from emr_ray.identity import TaskIdentity
from emr_ray.operators.rllib import RLlibTrainOperator
from tests.integration.test_ray_jobs import FakeTaskInstance, wait_for

pytestmark = pytest.mark.integration
ITERATIONS = 10
CONTEXT = {"ds": "2026-11-05"}


def make_operator(checkpoints: Path) -> RLlibTrainOperator:
    return RLlibTrainOperator(
        task_id="train",
        env="CartPole-v1",
        storage_path=f"file://{checkpoints}",
        config={"lr": 0.001, "train_batch_size_per_learner": 1000, "minibatch_size": 256, "num_epochs": 4},
        iterations=ITERATIONS,
        num_envs_per_env_runner=8,
        seed=0,
        evaluation_episodes=2,
        experiment_name="rllib-resume-tests",
        entrypoint_num_cpus=0,
        poll_interval=0.5,
    )


def wait_for_checkpointed(run_dir: Path, tracking_uri: str, iterations: int, timeout: float = 300) -> dict:
    """Block until the run's state names a checkpoint of at least ``iterations`` and MLflow has them."""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"no checkpoint of {iterations} iterations under {run_dir}"
        path = run_dir / "_emr_ray_state.json"
        state = json.loads(path.read_text()) if path.exists() else {}
        if state.get("iteration", 0) >= iterations and logged_steps(tracking_uri, state["mlflow_run_id"]):
            return state
        time.sleep(0.2)


def logged_steps(tracking_uri: str, run_id: str, metric: str = STEP_METRIC) -> list[int]:
    """Every step ``metric`` was logged at, repeats included."""
    import mlflow

    return sorted(
        m.step for m in mlflow.MlflowClient(tracking_uri=tracking_uri).get_metric_history(run_id, metric)
    )


def test_a_retry_resumes_from_the_last_rllib_checkpoint_into_the_same_mlflow_run(
    ray_conn, mlflow_conn, tmp_path
):
    hook = RayHook(ray_conn)
    first = FakeTaskInstance("train", try_number=1)
    op = make_operator(tmp_path)
    identity = TaskIdentity.from_context({"ti": first})
    op._submission_id = op._reattach_or_submit(identity, op.job_payload(CONTEXT, identity), {})
    run_dir = Path(identity.checkpoint_path(str(tmp_path))) / identity.run_name
    stopped_at = wait_for_checkpointed(run_dir, mlflow_conn.tracking_uri, 2)
    op.on_kill()  # the Airflow worker was killed: its job is stopped, nothing is left running
    assert wait_for(hook, op._submission_id, {"STOPPED", "FAILED", "SUCCEEDED"}) == "STOPPED"
    checkpointed = json.loads((run_dir / "_emr_ray_state.json").read_text())["iteration"]
    assert 2 <= stopped_at["iteration"] <= checkpointed < ITERATIONS, "the first try was not stopped midway"

    retry = FakeTaskInstance("train", try_number=2, run_id=first.run_id)
    result = make_operator(tmp_path).execute({"ti": retry, **CONTEXT})

    assert result["start_iteration"] == checkpointed, "the retry did not continue from the last checkpoint"
    assert result["iterations_completed"] == ITERATIONS
    assert result["mlflow_run_id"] == stopped_at["mlflow_run_id"]
    for metric in (STEP_METRIC, "episode_return_mean"):
        assert logged_steps(mlflow_conn.tracking_uri, result["mlflow_run_id"], metric) == list(
            range(1, ITERATIONS + 1)
        ), f"{metric}: an iteration is missing or was logged twice"
    kept = sorted(p.name for p in run_dir.glob("checkpoint_*"))
    assert kept == [f"checkpoint_{ITERATIONS - 1:06d}", f"checkpoint_{ITERATIONS:06d}"]
    assert result["checkpoint_uri"] == f"file://{run_dir}/checkpoint_{ITERATIONS:06d}"

    third = FakeTaskInstance("train", 3, first.run_id)
    reattached = make_operator(tmp_path).execute({"ti": third, **CONTEXT})
    assert reattached == result  # try 2's finished job: nothing trained again
    assert hook.get_job(TaskIdentity.from_context({"ti": third}).submission_id()) is None

    # a new job for the same finished training (another runtime_env, so no reattaching): the stored result
    fourth = FakeTaskInstance("train", 4, first.run_id)
    rerun = make_operator(tmp_path)
    rerun.runtime_env = {"env_vars": {"EMR_RAY_TEST_RERUN": "1"}}
    again = rerun.execute({"ti": fourth, **CONTEXT})
    assert hook.get_job(TaskIdentity.from_context({"ti": fourth}).submission_id()) is not None
    assert again["reused"] is True
    same = ("mlflow_run_id", "checkpoint_uri", "final_metrics", "iterations_completed", "start_iteration")
    assert {k: again[k] for k in same} == {k: result[k] for k in same}
    assert logged_steps(mlflow_conn.tracking_uri, result["mlflow_run_id"]) == list(range(1, ITERATIONS + 1))
