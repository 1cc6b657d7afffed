"""Registers the provider's extra links with Airflow (the only file Airflow loads from plugins/)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from emr_ray.links.cos import COSObjectLink
from emr_ray.links.mlflow import MLflowModelVersionLink, MLflowRunLink
from emr_ray.links.ray import RayJobLink


class EmrRayPlugin(AirflowPlugin):
    name = "emr_ray"
    operator_extra_links = [RayJobLink(), MLflowRunLink(), MLflowModelVersionLink(), COSObjectLink()]
