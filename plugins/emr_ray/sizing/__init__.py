"""What a backfill will take on a cluster, before you run it: ``python -m emr_ray.sizing``.

:mod:`.model` predicts a backfill's wall time, partitions per hour, reserved CPU- and GPU-hours and
its bottleneck from measured per-task costs and a cluster shape (pure); :mod:`.shapes` reads the
costs and prints the table for shapes. Measuring the costs starts servers and lives in
``bench/sizing.py``; predicting starts none.
"""
