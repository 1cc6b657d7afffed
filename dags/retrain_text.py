"""Daily retraining of a sentiment classifier on the day's reviews: the same pipeline shape as the
tabular and digits DAGs, on text.

The raw partition holds short product and film reviews (``doc_id``, ``text``, ``label`` 1 positive
/ 0 negative; :mod:`include.data.text` generates them): untidy user text where negation flips the
sentiment ("not good", "I don't hate it"), so word counts alone are not enough. Spark on Ray
tokenises (words and adjacent pairs), builds the vocabulary on the training split and maps tokens to
ids; Ray Train fits a bag-of-token-embeddings classifier; MLflow logs it WITH its vocabulary as a
model that takes raw text, registers ``text-sentiment`` and promotes it only when it beats the
champion on this run's test rows.
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
RAW = "{{ var.value.get('emr_ray_text_raw_uri', 'cos://emr-ray-demo-1250000000/raw_text') }}"
STAGING = "{{ var.value.get('emr_ray_staging_uri', 'cos://emr-ray-demo-1250000000/staging') }}"
CHECKPOINTS = "{{ var.value.get('emr_ray_checkpoint_uri', 'cos://emr-ray-demo-1250000000') }}"
STAGED = f"{STAGING}/text/dt={PARTITION}"
#: what the MLflow run and its model version are both tagged with: the same partition and generation
LINEAGE_TAGS = {"partition": PARTITION, "data_uri": STAGED, "generation": committed_generation("preprocess")}
VOCAB_SIZE = 8000  # the preprocess step's vocabulary and the model's embedding table must agree
MAX_TOKENS = 96  # tokens per review fed to the model (words and pairs); longer reviews are cut

with DAG(
    dag_id="retrain_text",
    description="Retrain the review sentiment classifier on the day's partition and promote it if it beats the champion.",
    schedule=daily_partitions(),  # one run per completed day
    start_date=history_start(),
    catchup=False,
    max_active_runs=MAX_ACTIVE_RUNS,  # the Ray pools guard the cluster
    tags=["emr-ray", "retraining", "text"],
    default_args=task_defaults(),
    params={
        **pipeline_params(),
        "spark_session": spark_session_param(),
        "worker_group": worker_group_param(),
        "epochs": Param(6, type="integer", minimum=1, maximum=200),
        "lr": Param(0.02, type="number", exclusiveMinimum=0),
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
        preprocess="include.preprocessing.text:tokenize",
        input_uri=RAW,
        output_uri=f"{STAGING}/text",
        partition=PARTITION,
        config={
            "schema": {"doc_id": "string", "text": "string", "label": "int64"},
            "required_columns": ["doc_id", "text", "label"],
            "text_column": "text",
            "id_column": "doc_id",
            "label_column": "label",
            "vocab_size": VOCAB_SIZE,
            "min_count": 2,  # a token seen once in training teaches nothing
            "test_fraction": 0.2,
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
        train_loop="include.models.text:train_loop",
        # exactly the generation this run's preprocessing committed, vocabulary included
        datasets={name: committed_output("preprocess", name) for name in ("train", "test", "vocab")},
        storage_path=CHECKPOINTS,
        config={
            "inputs": [
                {"name": "tokens", "column": "tokens", "dtype": "int64", "length": MAX_TOKENS, "pad": 0}
            ],
            "label_column": "label",
            "text_column": "text",
            "num_classes": 2,
            "vocab_size": VOCAB_SIZE,
            "embedding_dim": 32,
            "epochs": "{{ params.epochs }}",
            "lr": "{{ params.lr }}",
            "batch_size": 64,
        },
        num_workers="{{ params.num_workers }}",
        score_attribute="test_accuracy",
        score_order="max",
        experiment_name="retrain_text",
        run_tags=LINEAGE_TAGS,  # the model version's tags too
        compare_with_model="text-sentiment",  # scores the champion on this run's raw test rows, for register
        force_recompute="{{ params.force_recompute }}",
        pool=TRAIN_POOL,
        execution_timeout=timedelta(hours=1),
    )
    register = MLflowRegisterOperator(
        task_id="register",
        model_name="text-sentiment",
        run_id="{{ ti.xcom_pull(task_ids='train')['mlflow_run_id'] }}",
        metric="test_accuracy",
        direction="max",
        version_tags=LINEAGE_TAGS,  # the training run's run_tags
        promote_historical="{{ params.promote_historical }}",
        pool=PROMOTION_POOL,  # one slot: promotions of a model never interleave
    )

    wait_for_partition >> check_cluster >> preprocess >> train >> register
