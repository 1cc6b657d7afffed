"""The audit of a deployment's runs, data, models, jobs and logs: ``python -m emr_ray.audit`` (:mod:`emr_ray.audit.cli`)."""
