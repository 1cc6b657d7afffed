"""Daily retraining of a reinforcement-learning policy: RLlib's PPO learns to balance CartPole.

The environment is Gymnasium's ``CartPole-v1`` (it ships with the package, so no data comes in):
an episode ends when the pole falls or after 500 steps, one point per step; a random policy scores
about 20. ``train`` runs PPO for ``iterations`` iterations in a Ray job, checkpointing each one (a
retry resumes from the last), logs every iteration's episode return to MLflow and the greedy policy
as the run's model (observations in, actions out). ``register`` makes it ``cartpole-ppo``'s
``champion`` only when its mean episode return beats the current champion's.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from emr_ray.operators.mlflow import MLflowRegisterOperator
from emr_ray.operators.ray import RayConnectOperator
from emr_ray.operators.rllib import RLlibTrainOperator
from emr_ray.params import (
    DEFER_AFTER_TEMPLATE,
    MAX_ACTIVE_RUNS,
    PROMOTION_POOL,
    TRAIN_POOL,
    daily_partitions,
    history_start,
    pipeline_params,
    task_defaults,
)

CHECKPOINTS = "{{ var.value.get('emr_ray_checkpoint_uri', 'cos://emr-ray-demo-1250000000') }}"

with DAG(
    dag_id="retrain_rl",
    description="Retrain a PPO policy on CartPole-v1 and promote it if its mean episode return beats the champion.",
    schedule=daily_partitions(),  # one run per completed day, like the other retraining DAGs
    start_date=history_start(),
    catchup=False,
    max_active_runs=MAX_ACTIVE_RUNS,  # the Ray pools guard the cluster
    tags=["emr-ray", "retraining", "reinforcement-learning"],
    default_args=task_defaults(),
    params={
        # no input partition here: only the two reliability switches
        **{k: v for k, v in pipeline_params().items() if k != "partition"},
        "iterations": Param(15, type="integer", minimum=1, maximum=1000),
        "lr": Param(0.001, type="number", exclusiveMinimum=0),
        "num_env_runners": Param(
            0,
            type="integer",
            minimum=0,
            maximum=64,
            description="EnvRunner actors that sample (1 CPU each); 0 samples in the job's driver.",
        ),
        "seed": Param(0, type="integer", minimum=0),
    },
    doc_md=__doc__,
) as dag:
    check_cluster = RayConnectOperator(
        task_id="check_cluster",
        min_ray_version="2.50",  # and room for train below, read from it: its driver, a CPU per EnvRunner
    )
    train = RLlibTrainOperator(
        task_id="train",
        defer_after=DEFER_AFTER_TEMPLATE,
        algorithm="PPO",
        env="CartPole-v1",
        # measured on a loaded 2-core machine: past 150 within 6-8 iterations of 2,000 steps, ~1 s each
        config={
            "lr": "{{ params.lr }}",
            "train_batch_size_per_learner": 2000,
            "minibatch_size": 256,
            "num_epochs": 6,
            "vf_loss_coeff": 0.01,
        },
        iterations="{{ params.iterations }}",
        num_env_runners="{{ params.num_env_runners }}",
        num_envs_per_env_runner=8,  # one forward pass steps 8 environments
        seed="{{ params.seed }}",
        storage_path=CHECKPOINTS,
        experiment_name="retrain_rl",
        force_recompute="{{ params.force_recompute }}",
        pool=TRAIN_POOL,
        execution_timeout=timedelta(hours=1),
    )
    register = MLflowRegisterOperator(
        task_id="register",
        model_name="cartpole-ppo",
        run_id="{{ ti.xcom_pull(task_ids='train')['mlflow_run_id'] }}",
        metric="episode_return_mean",
        direction="max",
        promote_historical="{{ params.promote_historical }}",
        pool=PROMOTION_POOL,  # one slot: promotions of a model never interleave
    )

    check_cluster >> train >> register
