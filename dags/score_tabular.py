"""Batch scoring with the champion model, run whenever a new tabular-mlp version is registered.

Scheduled on the registered model's Airflow Asset (``x-mlflow://models/tabular-mlp``), which
``MLflowRegisterOperator`` updates on every registration. Loads ``models:/tabular-mlp@champion``,
scores the staged test split of the partition the champion was trained on, and commits the
predictions as ``<staging>/predictions/dt=<partition>/``.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, task

from emr_ray.operators.mlflow import mlflow_model_asset

MODEL = "tabular-mlp"
STAGING = "{{ var.value.get('emr_ray_staging_uri', 'cos://emr-ray-demo-1250000000/staging') }}"

with DAG(
    dag_id="score_tabular",
    description="Score the staged partition with the champion whenever a model version is registered.",
    schedule=[mlflow_model_asset(MODEL)],
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["emr-ray", "scoring", "tabular"],
    default_args={"retries": 2, "retry_delay": timedelta(minutes=2), "owner": "ml-platform"},
    doc_md=__doc__,
) as dag:

    @task
    def score(staging_uri: str, model: str = MODEL, alias: str = "champion") -> dict:
        """Predict with ``models:/<model>@<alias>`` and commit the predictions partition."""
        import mlflow
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        from emr_ray import storage
        from emr_ray.hooks.mlflow import MLflowHook

        options = None
        if staging_uri.startswith("cos://"):
            from emr_ray.hooks.cos import COSHook

            options = storage.StorageOptions(**COSHook().pyarrow_s3_options())
        hook = MLflowHook()
        version = hook.client.get_model_version_by_alias(model, alias)
        partition = version.tags["partition"]
        source = storage.join(staging_uri, "tabular", f"dt={partition}")
        files = storage.list_parquet_files(storage.join(source, "test"), options)
        fsys = storage.filesystem(source, options)
        table = pa.concat_tables([pq.read_table(f, filesystem=fsys) for f in files])
        features = [c for c in table.column_names if c != "label"]
        x = np.column_stack([table[c].to_numpy() for c in features]).astype(np.float32)
        with hook.credentials():
            mlflow.set_tracking_uri(hook.tracking_uri)
            loaded = mlflow.pyfunc.load_model(f"models:/{model}@{alias}")
        predicted = np.asarray(loaded.predict(x)).argmax(axis=1)
        accuracy = float((predicted == table["label"].to_numpy()).mean())
        final = storage.join(staging_uri, "predictions", f"dt={partition}")
        tmp = storage.staging_uri(final)
        tmp_path = storage.split_uri(tmp)[1]
        fsys.create_dir(tmp_path, recursive=True)
        pq.write_table(
            table.append_column("prediction", pa.array(predicted)),
            f"{tmp_path}/part-0.parquet",
            filesystem=fsys,
        )
        storage.commit(tmp, final, {"rows": table.num_rows, "model": model, "version": version.version,
                                    "accuracy": accuracy, "partition": partition}, options)  # fmt: skip
        print(
            f"Scored {table.num_rows} rows of {source} with {model} v{version.version}: accuracy {accuracy:.4f}"
        )
        return {"partition": partition, "version": version.version, "rows": table.num_rows,
                "accuracy": accuracy, "predictions_uri": final}  # fmt: skip

    score(STAGING)
