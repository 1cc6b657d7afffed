"""The reinforcement-learning DAG end to end through ``airflow dags test``: RLlib's PPO learns
CartPole-v1 in a Ray job, checkpoints to the COS stand-in, logs each iteration to MLflow, and
``cartpole-ppo`` is registered as champion. Real Airflow, Ray, RLlib, MLflow and COS stand-in.
"""

from __future__ import annotations

import pytest

from emr_ray.cluster.jobs.rllib import STEP_METRIC
from tests.fixtures.mlflow import use_tracking_uri
from tests.fixtures.pipeline import GOOD, WORKLOADS

pytestmark = pytest.mark.integration
ITERATIONS = WORKLOADS["retrain_rl"]["iterations"]
#: a random CartPole policy scores about 20; the episode cap is 500
RANDOM_RETURN = 20


@pytest.fixture(scope="module")
def run(workload_runs):
    return workload_runs["retrain_rl"]


@pytest.fixture(scope="module")
def champion(stack, run):
    import mlflow

    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    client = mlflow.MlflowClient(tracking_uri=stack.tracking_uri)
    version = client.get_model_version_by_alias("cartpole-ppo", "champion")
    return client, version, client.get_run(version.run_id)


def test_rl_dag_succeeds_and_streams_one_line_per_iteration(run):
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    log = run.stdout + run.stderr
    for iteration in (1, ITERATIONS):
        assert f"[emr_ray] iteration {iteration}/{ITERATIONS} episode_return_mean=" in log


def test_the_champion_balances_the_pole_far_better_than_chance(champion):
    _, version, source = champion
    episode_return = source.data.metrics["episode_return_mean"]
    assert episode_return > 150, (
        f"mean episode return {episode_return:.1f} (a random policy scores ~{RANDOM_RETURN})"
    )
    assert source.data.metrics["eval_episode_return_mean"] > 150
    assert version.tags["partition"] == GOOD
    assert source.info.status == "FINISHED"


def test_every_iteration_is_in_mlflow_once_with_its_return(champion):
    client, version, _ = champion
    for metric in (STEP_METRIC, "episode_return_mean", "total_loss"):
        history = client.get_metric_history(version.run_id, metric)
        assert sorted(m.step for m in history) == list(range(1, ITERATIONS + 1)), metric
    returns = [
        m.value
        for m in sorted(
            client.get_metric_history(version.run_id, "episode_return_mean"), key=lambda m: m.step
        )
    ]
    assert returns[0] < 50 < returns[-1], f"no learning curve: {returns}"


def test_the_logged_policy_loads_and_keeps_the_pole_up(stack, champion):
    import gymnasium
    import mlflow
    import numpy as np

    _, version, _ = champion
    with use_tracking_uri(stack.tracking_uri):
        policy = mlflow.pyfunc.load_model(f"models:/cartpole-ppo/{version.version}")
    assert policy.metadata.get_input_schema().inputs[0].shape == (-1, 4)
    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=123)
    steps, done = 0, False
    while not done:
        action = policy.predict(np.asarray([obs], dtype=np.float32))
        assert action.shape == (1,) and int(action[0]) in (0, 1)
        obs, _, terminated, truncated, _ = env.step(int(action[0]))
        steps, done = steps + 1, terminated or truncated
    assert steps > 150, f"the loaded policy kept the pole up for {steps} steps only"
