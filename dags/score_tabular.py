"""Batch scoring with the champion model on the cluster, run whenever a new tabular-mlp version is registered.

Scheduled on the registered model's Airflow Asset (``x-mlflow://models/tabular-mlp``), which
``MLflowRegisterOperator`` updates on every registration. ``resolve`` reads ``tabular-mlp@champion``
once per run: its version, and the staged test split of the partition and generation it was trained
on (its ``partition`` and ``generation`` tags). ``score`` scores those rows with that version on
the Ray cluster (``RayBatchPredictOperator``: Ray Data, rows streamed, never in the Airflow worker)
and commits the predictions as a new generation of ``<staging>/predictions/dt=<partition>/``. A retry
of ``score`` keeps the version ``resolve`` chose; clearing the whole run scores with the champion of then.
"""

from __future__ import annotations

from airflow.sdk import DAG, task

from emr_ray.operators.mlflow import mlflow_model_asset
from emr_ray.operators.predict import RayBatchPredictOperator
from emr_ray.params import SPARK_POOL, history_start, task_defaults

MODEL = "tabular-mlp"
STAGING = "{{ var.value.get('emr_ray_staging_uri', 'cos://emr-ray-demo-1250000000/staging') }}"

with DAG(
    dag_id="score_tabular",
    description="Score the staged partition with the champion on the cluster whenever a version is registered.",
    schedule=[mlflow_model_asset(MODEL)],
    start_date=history_start(),
    catchup=False,
    max_active_runs=1,
    tags=["emr-ray", "scoring", "tabular"],
    default_args=task_defaults(),
    doc_md=__doc__,
) as dag:

    @task
    def resolve(staging_uri: str, model: str = MODEL, alias: str = "champion") -> dict:
        """The version ``<model>@<alias>`` points at, once per run, and the rows it was tested on."""
        from emr_ray.cluster import partitions
        from emr_ray.hooks.mlflow import MLflowHook
        from include.scoring.tabular import predictions_uri, staged_uri

        version = MLflowHook().get_model_version_by_alias(model, alias)
        partition, generation = version.tags.get("partition"), version.tags.get("generation")
        if not partition or not generation:
            raise ValueError(
                f"{model} v{version.version} has no partition or generation tag; register versions with "
                "MLflowRegisterOperator's lineage tags (the retraining DAGs do)."
            )
        return {
            "version": str(version.version),
            "partition": partition,
            "input_uri": partitions.output_uri(staged_uri(staging_uri, partition), generation, "test"),
            "output_uri": predictions_uri(staging_uri, partition),
        }

    chosen = resolve(STAGING)
    RayBatchPredictOperator(
        task_id="score",
        model_name=MODEL,
        model_version=chosen["version"],
        input_uri=chosen["input_uri"],
        output_uri=chosen["output_uri"],
        partition=chosen["partition"],
        predict="include.scoring.tabular:predict_batch",
        config={"label_column": "label"},
        num_workers=1,
        pool=SPARK_POOL,
    )
