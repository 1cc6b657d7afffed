"""The provider's metadata for Airflow (connection types, hooks, links, triggers): Airflow side only.

Read through the ``apache_airflow_provider`` entry point (pyproject.toml). It lives outside the
package's ``__init__`` so that editing a connection field's description never changes the code that
ships to the cluster (:func:`emr_ray.cluster.reuse.cluster_side_files`).
"""

from __future__ import annotations

from emr_ray import __version__

_TEXT = {"type": ["string", "null"]}

#: how long after its deferral a trigger holds a finished job's event. Airflow 3.3 fails a resumed task
#: whose trigger fired before the executor had reported the deferring process's exit ("finished with
#: state success, but the task instance's state attribute is queued"); the executor usually reports it
#: within a heartbeat or two, so the hold narrows the race without closing it (a loaded machine's late
#: report can still lose it: one retry in a 30-partition backfill, bench/results/SUMMARY.md). A job
#: still running when the task defers rarely ends inside this window, so the hold costs little; a job
#: already done is never deferred (``RayJobOperator.execute``). The
#: default of ``[emr_ray] deferral_settle_seconds``; here, because this module imports nothing Airflow
#: imports (the hooks do, and Airflow reads this module while it starts).
DEFERRAL_SETTLE_SECONDS = 5.0


def get_provider_info() -> dict:
    """Provider metadata Airflow reads through the ``apache_airflow_provider`` entry point."""
    return {
        "package-name": "emr-ray-provider",
        "name": "EMR Ray",
        "description": "Ray (Jobs API), RayDP Spark, Ray Train, MLflow model registry, Tencent COS and HDFS.",
        "versions": [__version__],
        "connection-types": [
            {
                "connection-type": "ray",
                "hook-class-name": "emr_ray.hooks.ray.RayHook",
                "hook-name": "Ray",
                "conn-fields": {
                    "verify": {
                        "label": "Verify TLS",
                        "schema": {"type": ["boolean", "null"], "default": True},
                    },
                    "ca_bundle": {
                        "label": "CA bundle (path)",
                        "schema": _TEXT,
                        "description": "PEM file with the CA(s) that signed the dashboard's certificate",
                    },
                    "ca_pem": {
                        "label": "CA certificate (PEM text)",
                        "schema": _TEXT,
                        "description": "the CA PEM itself, instead of or besides a CA bundle path",
                    },
                    "client_cert": {"label": "Client certificate (path, mutual TLS)", "schema": _TEXT},
                    "client_key": {"label": "Client key (path, mutual TLS)", "schema": _TEXT},
                    "allow_insecure_http": {
                        "label": "Allow the token over plain http to another machine",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                    "uds": {"label": "Unix socket path (optional)", "schema": _TEXT},
                    "headers": {"label": "Extra HTTP headers (JSON)", "schema": {"type": ["object", "null"]}},
                    "runtime_env": {
                        "label": "Default runtime_env (JSON)",
                        "schema": {"type": ["object", "null"]},
                    },
                    "code": {
                        "label": "Job code",
                        "schema": {"type": ["string", "null"], "enum": ["installed", "ship", None]},
                        "description": "installed (default): the cluster has emr_ray and include/; "
                        "ship: upload them with every job (Jobs API packages)",
                    },
                    "include_dir": {
                        "label": "include/ folder to ship (path)",
                        "schema": _TEXT,
                        "description": "default: include/ next to the DAGs folder; empty: ship none",
                    },
                },
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "port"],
                    "relabeling": {
                        "host": "Dashboard address (https://head:8265 or auto)",
                        "password": "Auth token",
                    },
                    "placeholders": {"host": "https://head:8265"},
                },
            },
            {
                "connection-type": "cos",
                "hook-class-name": "emr_ray.hooks.cos.COSHook",
                "hook-name": "Tencent COS",
                "conn-fields": {
                    "region": {
                        "label": "Region",
                        "schema": _TEXT,
                        "description": "e.g. ap-guangzhou (required)",
                    },
                    "bucket": {"label": "Default bucket", "schema": _TEXT, "description": "name-APPID"},
                    "scheme": {"label": "Scheme", "schema": {"type": ["string", "null"], "default": "https"}},
                    "endpoint": {
                        "label": "Endpoint",
                        "schema": _TEXT,
                        "description": "host:port of a private endpoint",
                    },
                    "token": {
                        "label": "Session token",
                        "schema": {"type": ["string", "null"], "format": "password"},
                    },
                },
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "schema", "port"],
                    "relabeling": {"login": "SecretId", "password": "SecretKey"},
                },
            },
            {
                "connection-type": "mlflow",
                "hook-class-name": "emr_ray.hooks.mlflow.MLflowHook",
                "hook-name": "MLflow",
                "conn-fields": {
                    "token": {
                        "label": "Bearer token",
                        "schema": {"type": ["string", "null"], "format": "password"},
                    },
                    "registry_uri": {"label": "Registry URI (if different)", "schema": _TEXT},
                    "artifact_location": {"label": "Artifact root for new experiments", "schema": _TEXT},
                    "ui_url": {"label": "UI URL for links", "schema": _TEXT},
                },
                "ui-field-behaviour": {"relabeling": {"host": "Tracking URI or host"}},
            },
        ],
        "hooks": [
            {"integration-name": "Ray", "python-modules": ["emr_ray.hooks.ray"]},
            {"integration-name": "Tencent COS", "python-modules": ["emr_ray.hooks.cos"]},
            {"integration-name": "MLflow", "python-modules": ["emr_ray.hooks.mlflow"]},
            {"integration-name": "HDFS", "python-modules": ["emr_ray.hooks.hdfs"]},
        ],
        "operators": [
            {
                "integration-name": "Ray",
                "python-modules": [
                    "emr_ray.operators.ray",
                    "emr_ray.operators.ray_check",
                    "emr_ray.operators.raydp",
                    "emr_ray.operators.torch",
                    "emr_ray.operators.rllib",
                    "emr_ray.operators.predict",
                    "emr_ray.operators.mlflow_job",
                ],
            },
            {"integration-name": "MLflow", "python-modules": ["emr_ray.operators.mlflow"]},
            {"integration-name": "Tencent COS", "python-modules": ["emr_ray.operators.cos"]},
            {"integration-name": "Partitions", "python-modules": ["emr_ray.operators.housekeeping"]},
        ],
        "sensors": [{"integration-name": "Tencent COS", "python-modules": ["emr_ray.sensors.cos"]}],
        "triggers": [
            {"integration-name": "Ray", "python-modules": ["emr_ray.triggers.ray"]},
            {"integration-name": "Tencent COS", "python-modules": ["emr_ray.triggers.cos"]},
        ],
        "filesystems": ["emr_ray.fs.cos"],
        "extra-links": [
            "emr_ray.links.ray.RayJobLink",
            "emr_ray.links.mlflow.MLflowRunLink",
            "emr_ray.links.mlflow.MLflowModelVersionLink",
            "emr_ray.links.cos.COSObjectLink",
        ],
        "config": {
            "emr_ray": {
                "description": "The EMR Ray provider's settings.",
                "options": {
                    "deferral_settle_seconds": {
                        "description": "How long after a Ray task defers its trigger holds a finished "
                        "job's event, so that the event never arrives before the executor has reported "
                        "the deferring process's exit (a race that fails the resumed task). 0 where no "
                        "executor runs the task (airflow dags test).",
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": None,
                        "default": f"{DEFERRAL_SETTLE_SECONDS:g}",
                    },
                },
            },
        },
    }
