"""The model registry half of :class:`~emr_ray.hooks.mlflow.MLflowHook`: models, versions, aliases.

A mixin, so callers keep one hook (``hook.set_alias(...)``) while ``hooks/mlflow.py`` keeps the
connection, credentials, links and runs. Every method runs its MLflow calls inside the hook's
:meth:`~emr_ray.hooks.mlflow.MLflowHook.credentials` and imports ``mlflow`` only when called.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

    from emr_ray.cluster.model_retention import VersionFacts

#: Model version tag that records the model's name in the run (``log_model(name=...)``).
TAG_ARTIFACT_PATH = "artifact_path"


class _Host(Protocol):
    """What the mixin needs from the hook it is mixed into."""

    @property
    def client(self) -> MlflowClient: ...

    @property
    def log(self) -> Any: ...  # Airflow's logger

    @property
    def tracking_uri(self) -> str: ...

    @property
    def registry_uri(self) -> str: ...

    def credentials(self) -> AbstractContextManager[None]: ...

    def fail_fast(self) -> AbstractContextManager[None]: ...


class MLflowRegistryMixin:
    """Registered models, model versions and aliases, through the hook's client and credentials."""

    def ensure_registered_model(self: _Host, name: str) -> bool:
        """
        Create registered model ``name`` unless it exists; True when this call created it.

        Safe against a concurrent task creating the same model between the check and the create.

        :param name: registered model name.
        """
        from mlflow.exceptions import MlflowException

        with self.credentials():
            denied = None
            try:
                self.client.get_registered_model(name)
                return False
            except MlflowException as e:
                # An auth server whose default permission is NO_PERMISSIONS answers 403, not 404, for
                # a model nobody created yet: creating it tells the two apart (the creator may manage it).
                if e.error_code == "PERMISSION_DENIED":
                    denied = e
                elif e.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
            try:
                self.client.create_registered_model(name)
            except MlflowException as e:  # created concurrently by another task
                if e.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
                    raise
                if denied is not None:  # it exists, and this login may not read it
                    raise denied from None
                return False
        self.log.info("Created registered model %s", name)
        return True

    def find_version_from_run(self: _Host, name: str, run_id: str, artifact_path: str) -> ModelVersion | None:
        """
        The earliest version of ``name`` registered from ``run_id`` and ``artifact_path``, or None.

        This is what makes registration idempotent: a retry finds the version its first try made.
        Versions without an ``artifact_path`` tag count as registered from ``artifact_path``.

        :param name: registered model name.
        :param run_id: MLflow run the version was registered from.
        :param artifact_path: the model's name in the run.
        """
        from mlflow.exceptions import MlflowException

        with self.credentials():
            try:
                versions = self.client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
            except MlflowException as e:
                if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                    return None
                raise
        same = [v for v in versions if v.tags.get(TAG_ARTIFACT_PATH, artifact_path) == artifact_path]
        return min(same, key=lambda v: int(v.version)) if same else None

    def get_aliases(self: _Host, name: str) -> dict[str, str]:
        """
        The aliases of registered model ``name``, alias to version (as a string).

        :param name: registered model name.
        """
        with self.credentials():
            aliases = self.client.get_registered_model(name).aliases or {}
        return {str(alias): str(version) for alias, version in aliases.items()}

    def get_aliases_once(self: _Host, name: str) -> dict[str, str]:
        """
        :meth:`get_aliases` asked once, without retries and with a short timeout: for a page that must
        answer even when MLflow does not.

        :param name: registered model name.
        """
        with self.fail_fast():
            return MLflowRegistryMixin.get_aliases(self, name)

    def aliases_of_version(self: _Host, name: str, version: str | int) -> list[str]:
        """
        The aliases that point at ``version`` of ``name``, sorted.

        :param name: registered model name.
        :param version: model version.
        """
        with self.credentials():
            aliases = self.client.get_registered_model(name).aliases or {}
        return sorted(str(alias) for alias, v in aliases.items() if str(v) == str(version))

    def live_versions(self: _Host, name: str) -> list[ModelVersion]:
        """
        Every version of ``name`` that is not deleted or archived (stage ``Archived``), all pages;
        none when the model does not exist. What retention keeps data for (:mod:`emr_ray.housekeeping`).

        :param name: registered model name.
        """
        from mlflow.exceptions import MlflowException

        found: list[ModelVersion] = []
        token = None
        with self.credentials():
            while True:
                try:
                    page = self.client.search_model_versions(f"name = '{name}'", page_token=token)
                except MlflowException as e:
                    if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                        return []
                    raise
                found += [v for v in page if (v.current_stage or "").lower() != "archived"]
                token = page.token
                if not token:
                    return found

    def registered_model_names(self: _Host) -> list[str]:
        """
        Every registered model this login may see, all pages. MLflow's auth app leaves out, without a
        word, the models a login may not read: what is missing here proves nothing.
        """
        names: list[str] = []
        token = None
        with self.credentials():
            while True:
                page = self.client.search_registered_models(max_results=1000, page_token=token)
                names += [m.name for m in page]
                token = page.token
                if not token:
                    return names

    def version_facts(self: _Host, name: str) -> list[VersionFacts]:
        """
        Every version of ``name`` with its aliases and rank (:mod:`emr_ray.cluster.model_retention`);
        none when the model does not exist. Read after the model itself, so an answer is complete:
        a login that may not read the model raises :class:`~emr_ray.exceptions.MLflowAuthError`.

        :param name: registered model name.
        """
        from mlflow.exceptions import MlflowException

        from emr_ray.cluster.model_retention import versions_of_model

        rows: list[tuple[str, str | None, int | None, dict[str, str]]] = []
        token = None
        with self.credentials():
            try:
                model = self.client.get_registered_model(name)
            except MlflowException as e:
                if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                    return []
                raise
            while True:
                page = self.client.search_model_versions(f"name = '{name}'", page_token=token)
                rows += [(str(v.version), v.run_id, v.creation_timestamp, dict(v.tags or {})) for v in page]
                token = page.token
                if not token:
                    break
        return versions_of_model(name, rows, {str(a): str(v) for a, v in (model.aliases or {}).items()})

    def run_tags(self: _Host, run_id: str) -> dict[str, str] | None:
        """
        The tags of MLflow run ``run_id`` (a deleted run's too); None when the run is gone for good.

        :param run_id: MLflow run id.
        """
        from mlflow.exceptions import MlflowException

        with self.credentials():
            try:
                return dict(self.client.get_run(run_id).data.tags)
            except MlflowException as e:
                if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                    return None
                raise

    def record_registration(self: _Host, run_id: str, run_tags: dict[str, str], name: str) -> None:
        """
        Name ``name`` on run ``run_id`` (:data:`~emr_ray.cluster.model_retention.REGISTERED_MODELS_TAG`)
        before a version of it is registered from the run: retention then finds the version from
        the run, across all models, without a list (:mod:`emr_ray.registry_lineage`).

        :param run_id: the MLflow run the version is registered from.
        :param run_tags: the run's tags as read.
        :param name: registered model name.
        """
        from emr_ray.cluster.model_retention import REGISTERED_MODELS_TAG, with_registered_model

        value = with_registered_model(run_tags, name)
        if value is not None:
            with self.credentials():
                self.client.set_tag(run_id, REGISTERED_MODELS_TAG, value)

    def versions_of_partition(self: _Host, name: str, partition: str) -> list[ModelVersion]:
        """
        The versions of ``name`` whose ``partition`` tag is ``partition``, all pages; none when the model
        does not exist.

        :param name: registered model name.
        :param partition: the partition (``YYYY-MM-DD``) a run processed.
        """
        from mlflow.exceptions import MlflowException

        found: list[ModelVersion] = []
        token = None
        with self.credentials():
            while True:
                try:
                    page = self.client.search_model_versions(
                        f"name = '{name}' and tags.partition = '{partition}'", page_token=token
                    )
                except MlflowException as e:
                    if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                        return []
                    raise
                found += list(page)
                token = page.token
                if not token:
                    return found

    def get_model_version(self: _Host, name: str, version: str | int) -> ModelVersion:
        """
        Model version ``version`` of ``name``.

        :param name: registered model name.
        :param version: model version.
        """
        with self.credentials():
            return self.client.get_model_version(name, str(version))

    def get_model_version_by_alias(self: _Host, name: str, alias: str) -> ModelVersion:
        """
        The version of ``name`` that ``alias`` points at.

        :param name: registered model name.
        :param alias: alias, e.g. ``champion``.
        """
        with self.credentials():
            return self.client.get_model_version_by_alias(name, alias)

    def create_model_version(
        self: _Host,
        name: str,
        *,
        source: str,
        run_id: str,
        tags: dict[str, str] | None = None,
        description: str | None = None,
        model_id: str | None = None,
    ) -> ModelVersion:
        """
        Register a new version of ``name`` from ``source`` (see ``resolve_model_source``).

        :param name: registered model name (must exist: :meth:`ensure_registered_model`).
        :param source: where the model's files live.
        :param run_id: MLflow run that logged the model.
        :param tags: model version tags.
        :param description: model version description.
        :param model_id: the MLflow 3 logged model id, when there is one.
        """
        with self.credentials():
            return self.client.create_model_version(
                name=name,
                source=source,
                run_id=run_id,
                tags=tags,
                description=description,
                model_id=model_id,
            )

    def set_alias(self: _Host, name: str, alias: str, version: str | int) -> None:
        """
        Point ``alias`` of ``name`` at ``version`` (moving it from any other version).

        :param name: registered model name.
        :param alias: alias, e.g. ``champion``.
        :param version: model version.
        """
        with self.credentials():
            self.client.set_registered_model_alias(name, alias, str(version))

    def link_logged_model(self: _Host, model_id: str, name: str, version: str | int) -> bool:
        """
        Record ``name`` v``version`` on MLflow 3 logged model ``model_id``, as ``mlflow.register_model`` does.

        Cosmetic (the UI shows the model's versions): a failure is logged as a warning and returns False.

        :param model_id: the logged model's id (``m-...``).
        :param name: registered model name.
        :param version: model version.
        """
        try:
            from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

            with self.credentials():
                model = self.client.get_logged_model(model_id)
                linked: list[Any] = json.loads(model.tags.get(MLFLOW_MODEL_VERSIONS) or "[]")
                linked.append({"name": name, "version": str(version)})
                self.client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(linked)})
        except Exception as e:  # cosmetic: the registry entry exists either way
            self.log.warning("Could not link logged model %s to %s v%s: %s", model_id, name, version, e)
            return False
        return True

    def load_pyfunc_model(self: _Host, name: str, version: str | int) -> Any:
        """
        Version ``version`` of ``name`` as an MLflow pyfunc model (downloaded to a temporary folder).

        The files are located through this hook's client and downloaded with its URIs, never
        through MLflow's process-wide default tracking URI, which this leaves unset.

        :param name: registered model name.
        :param version: model version (resolve an alias first: :meth:`get_model_version_by_alias`).
        """
        import mlflow.pyfunc
        from mlflow.artifacts import download_artifacts

        with self.credentials():
            source = self.client.get_model_version_download_uri(name, str(version))
            local = download_artifacts(
                artifact_uri=source, tracking_uri=self.tracking_uri, registry_uri=self.registry_uri
            )
        return mlflow.pyfunc.load_model(local)
