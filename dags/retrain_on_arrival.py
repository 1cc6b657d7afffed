"""Event-driven retraining: a ``retrain_tabular`` run for each raw partition as soon as it lands.

Instead of a daily schedule, an asset watcher (``COSKeyTrigger`` in the triggerer) watches for new
``raw/dt=YYYY-MM-DD/_SUCCESS`` markers in COS. Each new marker is an asset event; this DAG runs on
those events and triggers ``retrain_tabular`` once per landed partition, with the ``partition``
param, so the partition is processed by the same DAG (pool, retries, promotion rules) as a manual
run. Markers already there when the watcher first starts are history, not news: backfill those.
The triggered runs take ``retrain_tabular``'s default Params, or those of the ``emr_ray_arrival_conf``
Variable (a JSON object, for example ``{"epochs": 1}``), read when each run is triggered.

The watched location is fixed when the DAG is parsed (a trigger's arguments are not templated), so
it comes from the environment where Airflow parses DAGs: ``EMR_RAY_RAW_URI`` (default: the local
demo bucket), and the ``cos`` connection ``EMR_RAY_WATCH_CONN_ID`` (default ``cos_default``).
"""

from __future__ import annotations

import logging
import os

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, Asset, AssetWatcher, task

from emr_ray.params import ARRIVAL_CONF_VARIABLE, arrival_conf, history_start, task_defaults
from emr_ray.triggers.cos import COSKeyTrigger

RAW_URI = os.environ.get("EMR_RAY_RAW_URI", "cos://emr-ray-demo-1250000000/raw").rstrip("/")
WATCH_CONN_ID = os.environ.get("EMR_RAY_WATCH_CONN_ID", "cos_default")
#: the model retrain_tabular registers
MODEL = "tabular-mlp"

raw_partitions = Asset(
    name="emr_ray_raw_partitions",
    uri=RAW_URI,
    watchers=[
        AssetWatcher(
            name="raw_partition_landed",
            trigger=COSKeyTrigger(
                bucket_keys=[f"{RAW_URI}/dt=*/_SUCCESS"],
                wildcard_match=True,
                cos_conn_id=WATCH_CONN_ID,
                poke_interval=float(os.environ.get("EMR_RAY_WATCH_INTERVAL", "60")),
            ),
        )
    ],
)

with DAG(
    dag_id="retrain_on_arrival",
    description="Trigger retrain_tabular for each raw partition as soon as its _SUCCESS lands in COS.",
    schedule=[raw_partitions],
    start_date=history_start(),
    catchup=False,
    tags=["emr-ray", "retraining", "event-driven"],
    default_args=task_defaults(retries=1),
    doc_md=__doc__,
) as dag:

    @task
    def landed_partitions(triggering_asset_events=None) -> list[dict]:
        """The conf of a run for each partition of the asset events behind this run (several may
        have landed at once): its partition and the ``emr_ray_arrival_conf`` Variable's Params; none
        for a partition already trained on with the same raw listing."""
        from airflow.sdk import Variable
        from airflow.sdk.exceptions import AirflowFailException

        from emr_ray.arrivals import unprocessed

        dates = {
            (event.extra or {}).get("payload", {}).get("partition")
            for events in (triggering_asset_events or {}).values()
            for event in events
        }
        variable = Variable.get(ARRIVAL_CONF_VARIABLE, default=None)
        try:
            confs = [arrival_conf(day, variable) for day in sorted(d for d in dates if d)]
        except ValueError as e:  # a retry reads the same Variable
            raise AirflowFailException(str(e)) from e
        return unprocessed(
            confs,
            RAW_URI,
            MODEL,
            cos_conn_id=WATCH_CONN_ID,
            mlflow_conn_id="mlflow_default",
            log=logging.getLogger("airflow.task"),
        )

    TriggerDagRunOperator.partial(
        task_id="retrain",
        trigger_dag_id="retrain_tabular",
        logical_date=None,
        wait_for_completion=False,
    ).expand(conf=landed_partitions())
