"""Daily housekeeping of the staged partitions the retraining DAGs produce.

Removes what no one needs any more, by the rules of ``emr_ray.cluster.retention``: a generation
stays while a live version of one of the models names it (or a training's or a person's pin does),
and at least 7 days after a newer commit superseded it; an uncommitted one goes once its writer
was inactive for 6 hours. Each run logs what it removed and why; trigger it with ``dry_run`` to
see what it would remove. From a shell: ``python -m emr_ray.housekeeping sweep ...``.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from emr_ray.operators.housekeeping import PartitionHousekeepingOperator
from emr_ray.params import history_start, task_defaults

STAGING = "{{ var.value.get('emr_ray_staging_uri', 'cos://emr-ray-demo-1250000000/staging') }}"
#: each dataset a retraining DAG stages, and the models trained on it
DATASETS = ["tabular", "digits", "recsys", "text", "predictions"]
MODELS = ["tabular-mlp", "digits-cnn", "recsys-two-tower", "text-sentiment"]

with DAG(
    dag_id="partition_housekeeping",
    description="Remove superseded and abandoned generations no model version, pin or reader needs.",
    schedule="@daily",
    start_date=history_start(),
    catchup=False,
    max_active_runs=1,
    tags=["emr-ray", "housekeeping"],
    default_args=task_defaults(),
    params={"dry_run": Param(False, type="boolean", description="Only log what would be removed.")},
    doc_md=__doc__,
) as dag:
    PartitionHousekeepingOperator(
        task_id="housekeeping",
        dataset_uris=[f"{STAGING}/{name}" for name in DATASETS],
        model_names=MODELS,
        remove="{{ not params.dry_run }}",
    )
