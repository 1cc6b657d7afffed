"""Daily retraining of the two-tower recommender on the day's interaction log.

**The data**: one partition a day of implicit feedback, ``user_id``, ``item_id``, ``ts`` (and the
``event``: view, click, purchase), written under ``raw_interactions/dt=<date>/`` with ``_SUCCESS``. In
the demo and the tests it comes from :mod:`include.data.interactions`: users and items with hidden
taste factors plus a popularity skew, so recommending the most popular items is a real baseline.

**The steps**: Spark on Ray indexes the ids (``users`` and ``items`` datasets, kept with the model),
holds out each user's last item as the test positive, samples negatives for training, and ranks
each held-out item by popularity, so the baseline's ``recall@10`` is exact; Ray Train fits the
two-tower model and reports its own ``recall_at_10`` beside ``popularity_recall_at_10`` every epoch;
the best epoch by ``recall_at_10`` is logged to MLflow as a pyfunc model over raw ids (it carries its
indexes); MLflow registers ``recsys-two-tower`` and promotes it only when its ``recall_at_10`` on
this run's test rows beats the champion's on the same rows.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

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

PARTITION = PARTITION_TEMPLATE
RAW = "{{ var.value.get('emr_ray_interactions_raw_uri', 'cos://emr-ray-demo-1250000000/raw_interactions') }}"
STAGING = "{{ var.value.get('emr_ray_staging_uri', 'cos://emr-ray-demo-1250000000/staging') }}"
CHECKPOINTS = "{{ var.value.get('emr_ray_checkpoint_uri', 'cos://emr-ray-demo-1250000000') }}"
STAGED = f"{STAGING}/recsys/dt={PARTITION}"
#: what the MLflow run and its model version are both tagged with: the same partition and generation
LINEAGE_TAGS = {"partition": PARTITION, "data_uri": STAGED, "generation": committed_generation("preprocess")}
MAX_HISTORY = 64  # the recent items a user carries: the model's history input and the ranking's exclusions
# the index sizes of exactly the generation this run's preprocessing committed (its rows_out)
NUM_USERS = "{{ ti.xcom_pull(task_ids='preprocess')['rows_out']['users'] }}"
NUM_ITEMS = "{{ ti.xcom_pull(task_ids='preprocess')['rows_out']['items'] }}"

with DAG(
    dag_id="retrain_recsys",
    description="Retrain the two-tower recommender on the day's interactions; promote it if its recall@10 wins.",
    schedule=daily_partitions(),  # one run per completed day
    start_date=history_start(),
    catchup=False,
    max_active_runs=MAX_ACTIVE_RUNS,  # the Ray pools guard the cluster
    tags=["emr-ray", "retraining", "recsys"],
    default_args=task_defaults(),
    params={
        **pipeline_params(),
        "spark_session": spark_session_param(),
        "worker_group": worker_group_param(),
        "epochs": Param(4, type="integer", minimum=1, maximum=200),
        "lr": Param(0.02, type="number", exclusiveMinimum=0),
        "embedding_dim": Param(32, type="integer", minimum=2, maximum=1024),
        "negatives": Param(4, type="integer", minimum=1, maximum=100),
        "num_workers": Param(2, type="integer", minimum=1, maximum=64),
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
        preprocess="include.preprocessing.recsys:features",
        input_uri=RAW,
        output_uri=f"{STAGING}/recsys",
        partition=PARTITION,
        config={
            "schema": {"user_id": "string", "item_id": "string"},
            "required_columns": ["user_id", "item_id", "ts"],
            "negatives": "{{ params.negatives }}",
            "max_history": MAX_HISTORY,
            "min_interactions": 3,
            "seed": 42,
        },
        force_recompute="{{ params.force_recompute }}",
        pool=SPARK_POOL,
        execution_timeout=timedelta(minutes=30),
    )
    train = TorchTrainOperator(
        task_id="train",
        defer_after=DEFER_AFTER_TEMPLATE,
        worker_group=WORKER_GROUP_TEMPLATE,
        worker_group_idle_timeout=WORKER_GROUP_IDLE_TIMEOUT_TEMPLATE,
        train_loop="include.models.recsys:train_loop",
        # exactly the generation this run's preprocessing committed; the indexes travel with the model
        datasets={name: committed_output("preprocess", name) for name in ("train", "test", "users", "items")},
        storage_path=CHECKPOINTS,
        config={
            "inputs": [
                {"name": "user", "column": "user_idx", "dtype": "int64"},
                {"name": "item", "column": "item_idx", "dtype": "int64"},
                {"name": "history", "column": "history", "dtype": "int64", "length": MAX_HISTORY, "pad": 0},
            ],
            "label_column": "label",
            "metric_columns": ["popularity_hit_at_10"],  # the baseline's exact hits, from Spark
            "num_users": NUM_USERS,
            "num_items": NUM_ITEMS,
            "embedding_dim": "{{ params.embedding_dim }}",
            "epochs": "{{ params.epochs }}",
            "lr": "{{ params.lr }}",
            "batch_size": 1024,
        },
        num_workers="{{ params.num_workers }}",
        score_attribute="recall_at_10",
        score_order="max",
        experiment_name="retrain_recsys",
        run_tags=LINEAGE_TAGS,  # the model version's tags too
        compare_with_model="recsys-two-tower",  # scores the champion on this run's test rows, for register
        force_recompute="{{ params.force_recompute }}",
        pool=TRAIN_POOL,
        execution_timeout=timedelta(hours=1),
    )
    register = MLflowRegisterOperator(
        task_id="register",
        model_name="recsys-two-tower",
        run_id="{{ ti.xcom_pull(task_ids='train')['mlflow_run_id'] }}",
        metric="recall_at_10",
        direction="max",
        version_tags=LINEAGE_TAGS,  # the training run's run_tags
        promote_historical="{{ params.promote_historical }}",
        pool=PROMOTION_POOL,  # one slot: promotions of a model never interleave
    )

    wait_for_partition >> check_cluster >> preprocess >> train >> register
