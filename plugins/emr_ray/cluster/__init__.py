"""The provider's cluster side: what runs on Ray, never imports Airflow, ships with a job and is
hashed into its code version (:func:`emr_ray.cluster.reuse.cluster_side_files`)."""
