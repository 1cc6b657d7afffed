"""Code that runs ON the Ray cluster, as Ray job entrypoints. Never imports Airflow.

Each job is ``python -m emr_ray.cluster.jobs.<name> --spec-b64 ...`` (or ``--spec spec.json`` by hand).
"""
