"""Registers the provider's extra links and its Retraining view with Airflow (the only file Airflow
loads from plugins/; cheap to import: the view's app is built on its first request)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from emr_ray.links.cos import COSObjectLink
from emr_ray.links.mlflow import MLflowModelVersionLink, MLflowRunLink
from emr_ray.links.ray import RayJobLink
from emr_ray.views.registration import EXTERNAL_VIEWS, FASTAPI_APP


class EmrRayPlugin(AirflowPlugin):
    name = "emr_ray"
    operator_extra_links = [RayJobLink(), MLflowRunLink(), MLflowModelVersionLink(), COSObjectLink()]
    fastapi_apps = [FASTAPI_APP]
    external_views = EXTERNAL_VIEWS
