"""Batch scoring with the champion model, run whenever a new tabular-mlp version is registered.

Scheduled on the registered model's Airflow Asset (``x-mlflow://models/tabular-mlp``), which
``MLflowRegisterOperator`` updates on every registration. Resolves ``tabular-mlp@champion`` to a
version once, loads that version, scores the staged test split of the partition and generation it
was trained on (its ``partition`` and ``generation`` tags), and commits the predictions as a new
generation of ``<staging>/predictions/dt=<partition>/`` (see ``include/scoring/tabular.py``).
"""

from __future__ import annotations

from airflow.sdk import DAG, task

from emr_ray.operators.mlflow import mlflow_model_asset
from emr_ray.params import history_start, task_defaults

MODEL = "tabular-mlp"
STAGING = "{{ var.value.get('emr_ray_staging_uri', 'cos://emr-ray-demo-1250000000/staging') }}"

with DAG(
    dag_id="score_tabular",
    description="Score the staged partition with the champion whenever a model version is registered.",
    schedule=[mlflow_model_asset(MODEL)],
    start_date=history_start(),
    catchup=False,
    max_active_runs=1,
    tags=["emr-ray", "scoring", "tabular"],
    default_args=task_defaults(),
    doc_md=__doc__,
) as dag:

    @task
    def score(staging_uri: str, model: str = MODEL, alias: str = "champion") -> dict:
        """Predict with the version ``<model>@<alias>`` points at and commit the predictions partition."""
        from emr_ray.cluster import storage
        from emr_ray.hooks.mlflow import MLflowHook
        from include.scoring.tabular import score_partition

        options = None
        if staging_uri.startswith("cos://"):
            from emr_ray.hooks.cos import COSHook

            options = storage.StorageOptions(**COSHook().pyarrow_s3_options())
        hook = MLflowHook()
        version = hook.get_model_version_by_alias(model, alias)
        return score_partition(
            staging_uri,
            version.tags["partition"],
            hook.load_pyfunc_model(model, version.version),
            model_name=model,
            version=version.version,
            generation=version.tags.get("generation"),
            options=options,
        )

    score(STAGING)
