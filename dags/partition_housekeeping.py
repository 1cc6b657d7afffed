"""Daily housekeeping of the staged partitions the retraining DAGs produce.

Removes what no one needs any more, by the rules of ``emr_ray.cluster.retention``: a generation
stays while a model version the registry says was trained on it is kept (it holds an alias, is
among the 3 newest of its model, or was registered in the last 7 days; no list of models is kept
here), while a person's pin names it, and at least 7 days after a newer commit superseded it; an
uncommitted one goes once its writer was inactive for 6 hours. A staged date that nothing holds goes
whole 30 days after its newest commit (its preprocessing produces it again when a run needs it);
predictions never expire. When the registry cannot answer
completely, no committed data is removed and the run fails saying why. Each run logs what it removed and why; trigger it with ``dry_run`` to
see what it would remove. From a shell: ``python -m emr_ray.housekeeping sweep ...``.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from emr_ray.operators.housekeeping import PartitionHousekeepingOperator
from emr_ray.params import history_start, task_defaults

STAGING = "{{ var.value.get('emr_ray_staging_uri', 'cos://emr-ray-demo-1250000000/staging') }}"
#: each dataset a retraining DAG stages: its preprocessing produces a date again when asked
STAGED = ["tabular", "digits", "recsys", "text"]
#: what the scoring DAG writes for people to read: superseded generations go, dates never expire
OUTPUTS = ["predictions"]

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
        dataset_uris=[f"{STAGING}/{name}" for name in STAGED],
        keep_versions=3,
        keep_version_days=7,
        expire_after=timedelta(days=30),
        remove="{{ not params.dry_run }}",
    )
    PartitionHousekeepingOperator(
        task_id="housekeeping_outputs",
        dataset_uris=[f"{STAGING}/{name}" for name in OUTPUTS],
        remove="{{ not params.dry_run }}",
    )
