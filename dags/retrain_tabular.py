"""Daily retraining of the tabular MLP: wait for the raw partition, check the cluster, preprocess with
Spark on Ray, train with Ray Train, register in MLflow and promote by alias only when better.

The partition is the run's logical date, or the ``partition`` param of a manual run (see
``emr_ray.params.PARTITION_TEMPLATE``). A scheduled run owns the day that has completed: the run made
at midnight of 2026-12-01 processes 2026-11-30 (``emr_ray.params.daily_partitions``).
Storage locations come from Airflow Variables (``emr_ray_raw_uri``, ``emr_ray_staging_uri``,
``emr_ray_checkpoint_uri``), so the same file runs on the embedded demo and on a real cluster.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param, task

from emr_ray.deadlines import warn_after
from emr_ray.operators.mlflow import MLflowRegisterOperator
from emr_ray.operators.ray import RayConnectOperator
from emr_ray.operators.raydp import RayDPSparkOperator
from emr_ray.operators.torch import TorchTrainOperator
from emr_ray.params import (
    DEFER_AFTER_TEMPLATE,
    MAX_ACTIVE_RUNS,
    PARTITION_TEMPLATE,
    PROMOTION_POOL,
    SPARK_IDLE_TIMEOUT_TEMPLATE,
    SPARK_POOL,
    SPARK_SESSION_TEMPLATE,
    TRAIN_POOL,
    WORKER_GROUP_IDLE_TIMEOUT_TEMPLATE,
    WORKER_GROUP_TEMPLATE,
    committed_generation,
    committed_output,
    daily_partitions,
    history_start,
    pipeline_params,
    spark_session_param,
    task_defaults,
    worker_group_param,
)
from emr_ray.sensors.cos import COSSensor

FEATURES = [f"f{i:02d}" for i in range(16)]
LABEL = "label"
PARTITION = PARTITION_TEMPLATE
RAW = "{{ var.value.get('emr_ray_raw_uri', 'cos://emr-ray-demo-1250000000/raw') }}"
STAGING = "{{ var.value.get('emr_ray_staging_uri', 'cos://emr-ray-demo-1250000000/staging') }}"
CHECKPOINTS = "{{ var.value.get('emr_ray_checkpoint_uri', 'cos://emr-ray-demo-1250000000') }}"
STAGED = f"{STAGING}/tabular/dt={PARTITION}"
#: what the MLflow run and its model version are both tagged with: the same partition and generation
LINEAGE_TAGS = {"partition": PARTITION, "data_uri": STAGED, "generation": committed_generation("preprocess")}

with DAG(
    dag_id="retrain_tabular",
    description="Retrain the tabular MLP on the day's partition and promote it if it beats the champion.",
    schedule=daily_partitions(),  # one run per completed day
    start_date=history_start(),
    catchup=False,
    max_active_runs=MAX_ACTIVE_RUNS,  # the Ray pools guard the cluster
    tags=["emr-ray", "retraining", "tabular"],
    default_args=task_defaults(),
    # Airflow 3's successor of SLAs: warn (the run goes on) when a run is not done 3 hours after it was queued
    deadline=warn_after(timedelta(hours=3)),
    params={
        **pipeline_params(),
        "spark_session": spark_session_param(),
        "worker_group": worker_group_param(),
        "epochs": Param(5, type="integer", minimum=1, maximum=200),
        "lr": Param(0.003, type="number", exclusiveMinimum=0),
        "batch_size": Param(256, type="integer", minimum=8),
        "num_workers": Param(2, type="integer", minimum=1, maximum=64),
        "register_only_if_better": Param(
            False, type="boolean", description="Register nothing unless it beats the champion."
        ),
        "dry_run": Param(
            False, type="boolean", description="Validate the partition and the cluster; train nothing."
        ),
    },
    doc_md=__doc__,
) as dag:
    wait_for_partition = COSSensor(
        task_id="wait_for_partition",
        bucket_key=f"{RAW}/dt={PARTITION}/_SUCCESS",
        poke_interval=60,
        timeout=6 * 3600,
        mode="reschedule",
    )
    check_cluster = RayConnectOperator(
        task_id="check_cluster",
        min_ray_version="2.50",  # and room for what preprocess and train below ask for, read from them
    )
    preprocess = RayDPSparkOperator(
        task_id="preprocess",
        defer_after=DEFER_AFTER_TEMPLATE,
        spark_session=SPARK_SESSION_TEMPLATE,
        spark_idle_timeout=SPARK_IDLE_TIMEOUT_TEMPLATE,
        preprocess="include.preprocessing.tabular:standardize",
        input_uri=RAW,
        output_uri=f"{STAGING}/tabular",
        partition=PARTITION,
        config={
            "feature_columns": FEATURES,
            "label_column": LABEL,
            "schema": {**dict.fromkeys(FEATURES, "double"), LABEL: "int64"},
            "finite_columns": [*FEATURES, LABEL],
            "test_fraction": 0.2,
            "seed": 42,
        },
        num_executors=1,
        executor_cores=1,
        executor_memory="1g",
        validate_only="{{ params.dry_run }}",
        force_recompute="{{ params.force_recompute }}",
        pool=SPARK_POOL,
        execution_timeout=timedelta(minutes=30),
    )

    @task.short_circuit
    def unless_dry_run(params=None) -> bool:
        """Stop here on a dry run: the partition and the cluster were checked, nothing is trained."""
        return not params["dry_run"]

    train = TorchTrainOperator(
        task_id="train",
        defer_after=DEFER_AFTER_TEMPLATE,
        worker_group=WORKER_GROUP_TEMPLATE,
        worker_group_idle_timeout=WORKER_GROUP_IDLE_TIMEOUT_TEMPLATE,
        train_loop="include.models.tabular:train_loop",
        # exactly the generation this run's preprocessing committed, never "whatever is current"
        datasets={name: committed_output("preprocess", name) for name in ("train", "test")},
        storage_path=CHECKPOINTS,
        config={
            "feature_columns": FEATURES,
            "label_column": LABEL,
            "epochs": "{{ params.epochs }}",
            "lr": "{{ params.lr }}",
            "batch_size": "{{ params.batch_size }}",
            "hidden": 64,
        },
        num_workers="{{ params.num_workers }}",
        use_gpu=False,
        experiment_name="retrain_tabular",
        run_tags=LINEAGE_TAGS,  # the model version's tags too
        compare_with_model="tabular-mlp",  # scores the champion on this run's test rows, for register
        force_recompute="{{ params.force_recompute }}",
        pool=TRAIN_POOL,
        execution_timeout=timedelta(hours=2),
    )
    register = MLflowRegisterOperator(
        task_id="register",
        model_name="tabular-mlp",
        run_id="{{ ti.xcom_pull(task_ids='train')['mlflow_run_id'] }}",
        metric="test_accuracy",
        direction="max",
        version_tags=LINEAGE_TAGS,  # the training run's run_tags
        description="tabular MLP trained on partition " + PARTITION,
        register_only_if_better="{{ params.register_only_if_better }}",
        promote_historical="{{ params.promote_historical }}",
        pool=PROMOTION_POOL,  # one slot: promotions of a model never interleave
    )

    wait_for_partition >> check_cluster >> preprocess >> unless_dry_run() >> train >> register
