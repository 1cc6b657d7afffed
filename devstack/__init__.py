"""The local development stack: what ``make demo``, ``make airflow``, the tests and the benchmarks run on.

A Ray head (``ray_head``), a COS stand-in (``cos_server``) and a WebHDFS stand-in (``webhdfs_server``),
an embedded Airflow with a fixed login (``airflow``, ``airflow_db``), a port forwarder out of the
loopback namespace (``forward``), and the stack that ties them together (``stack``), all on 127.0.0.1
with the demo credentials of ``constants``. Nothing here is for production: it is never installed
(the wheel holds only ``emr_ray``) and never copied into the Docker image. Run from the repository
root (``python -m scripts.demo``, ``python -m devstack.cos_server``), where ``devstack`` is importable.
"""
