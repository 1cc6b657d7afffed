"""Airflow 3 provider for data+AI training pipelines on Ray.

Airflow side: ``hooks``, ``operators``, ``sensors``, ``triggers``, ``links`` (import fast, no bulk data).
Cluster side: ``jobs`` (runs on Ray workers, never imports Airflow). Shared by both: ``storage``,
``identity``, ``spec``. Embedded local services for the demo and tests: ``local``.
"""

from __future__ import annotations

__version__ = "0.1.0"


def get_provider_info() -> dict:
    """Provider metadata Airflow reads through the ``apache_airflow_provider`` entry point."""
    return {
        "package-name": "emr-ray-provider",
        "name": "EMR Ray",
        "description": "Ray (Jobs API), RayDP Spark, Ray Train, MLflow model registry and Tencent COS.",
        "versions": [__version__],
        "connection-types": [
            {"connection-type": "ray", "hook-class-name": "emr_ray.hooks.ray.RayHook"},
            {"connection-type": "cos", "hook-class-name": "emr_ray.hooks.cos.COSHook"},
            {"connection-type": "mlflow", "hook-class-name": "emr_ray.hooks.mlflow.MLflowHook"},
        ],
        "hooks": [
            {"integration-name": "Ray", "python-modules": ["emr_ray.hooks.ray"]},
            {"integration-name": "Tencent COS", "python-modules": ["emr_ray.hooks.cos"]},
            {"integration-name": "MLflow", "python-modules": ["emr_ray.hooks.mlflow"]},
        ],
        "operators": [
            {
                "integration-name": "Ray",
                "python-modules": [
                    "emr_ray.operators.ray",
                    "emr_ray.operators.raydp",
                    "emr_ray.operators.torch",
                ],
            },
            {"integration-name": "MLflow", "python-modules": ["emr_ray.operators.mlflow"]},
        ],
        "sensors": [{"integration-name": "Tencent COS", "python-modules": ["emr_ray.sensors.cos"]}],
        "extra-links": [
            "emr_ray.links.ray.RayJobLink",
            "emr_ray.links.mlflow.MLflowRunLink",
        ],
    }
