"""Airflow 3 provider for data+AI training pipelines on Ray.

Two sides, one folder boundary:

- **Cluster side**: ``cluster/`` (and this file): what runs on Ray. ``cluster/jobs`` are the job
  entrypoints, ``cluster/train`` the public API for user training code, ``cluster/spec`` the typed
  contract both sides share, ``cluster/storage`` and ``cluster/partitions`` the data layout. It
  never imports Airflow. Exactly these files ship with a job (code="ship") and are hashed into the
  code version that decides whether a retry may reattach (``cluster/reuse.py``).
- **Airflow side**: everything else: ``hooks``, ``operators``, ``sensors``, ``triggers``, ``links``,
  ``fs`` and the DAG helpers (``params``, ``deadlines``, ``lineage``, ``templating``,
  ``run_request``, ``identity``, ``exceptions``, ``provider_info``). It imports fast and holds no
  bulk data; editing it never changes a job's digest.

The local stack for the demo and the tests is not part of this package (``devstack/`` in the repo).
"""

__version__ = "0.1.0"
