"""MLflowJobOperator: the base of Ray jobs that log to MLflow (the training operators)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from emr_ray.cluster.spec import MLflowSection
from emr_ray.identity import TaskIdentity
from emr_ray.operators.ray import RayJobOperator
from emr_ray.params import run_partition

if TYPE_CHECKING:
    from emr_ray.hooks.mlflow import MLflowHook


class MLflowJobOperator(RayJobOperator):
    """A Ray job that logs to MLflow: the connection's login reaches the job only as secret
    environment variables, and a login MLflow refuses fails the task before any cluster work.

    The base of the training operators (:class:`~emr_ray.operators.torch.TorchTrainOperator`,
    :class:`~emr_ray.operators.rllib.RLlibTrainOperator`), which call :meth:`check_mlflow_access`
    and put :meth:`mlflow_section` in their spec.

    :param mlflow_conn_id: the ``mlflow`` connection the job logs to. Its login and password (or
        token) reach the job only as ``MLFLOW_TRACKING_*`` secret environment variables
        (:meth:`job_secrets`), never in its spec, entrypoint or runtime_env. Before submitting, one
        request checks that MLflow accepts them (:meth:`check_mlflow_access`): a refusal fails the task
        at once (no retries) with a message that names the connection.
    :param experiment_name: MLflow experiment (templated); default the DAG id.
    :param run_tags: extra tags of the MLflow run, over the task's identity and its ``partition``
        (default :func:`emr_ray.params.run_partition`). Pass the lineage tags the DAG gives the model
        version (``MLflowRegisterOperator(version_tags=...)``): the run and its version then name the
        same partition and generation (templated).
    """

    template_fields: Sequence[str] = (*RayJobOperator.template_fields, "experiment_name", "run_tags")
    template_fields_renderers = {**RayJobOperator.template_fields_renderers, "run_tags": "json"}

    def __init__(
        self,
        *,
        mlflow_conn_id: str = "mlflow_default",
        experiment_name: str | None = None,
        run_tags: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.mlflow_conn_id = mlflow_conn_id
        self.experiment_name = experiment_name
        self.run_tags = run_tags

    @cached_property
    def mlflow_hook(self) -> MLflowHook:
        """The hook of ``mlflow_conn_id`` (one per task: the connection is read once)."""
        from emr_ray.hooks.mlflow import MLflowHook

        return MLflowHook(self.mlflow_conn_id)

    def job_secrets(self, context: Any, spec: Mapping[str, Any]) -> dict[str, str]:
        """The base class's secrets (COS keys) plus MLflow's credential variables."""
        hook = self.mlflow_hook
        return super().job_secrets(context, spec) | hook.credential_env() | hook.secret_uris()

    def check_mlflow_access(self) -> None:
        """Fail before any cluster work when an http(s) MLflow refuses the connection's credentials
        (:class:`~emr_ray.exceptions.MLflowAuthError`, not retried); when MLflow cannot be reached
        from here, the job still tries from the cluster."""
        from emr_ray.exceptions import MLflowAuthError

        hook = self.mlflow_hook
        if not hook.tracking_uri.startswith(("http://", "https://")):
            return
        try:
            hook.check_access()
        except MLflowAuthError:
            raise
        except Exception as e:
            self.log.warning(
                "Could not check the MLflow login before submitting (%s: %s); the job will "
                "try from the cluster",
                type(e).__name__,
                e,
            )

    def mlflow_section(self, context: Any, identity: TaskIdentity) -> MLflowSection:
        """Where the job logs: the connection's public settings; as run tags, the task's identity, the
        run's partition (the model version's default too), then ``run_tags``."""
        settings = self.mlflow_hook.job_settings()
        partition = run_partition(context)
        return MLflowSection(
            tracking_uri=settings["tracking_uri"],
            registry_uri=settings.get("registry_uri"),
            artifact_location=settings.get("artifact_location"),
            experiment_name=self.experiment_name or identity.dag_id,
            tags=identity.tags()
            | ({"partition": partition} if partition else {})
            | {str(k): str(v) for k, v in (self.run_tags or {}).items()},
        )
