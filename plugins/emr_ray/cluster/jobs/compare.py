"""The training job's last step: score the champion and the new model on the same test rows.

Promotion must compare like with like. The metric a champion once scored on another day's rows
says little about the rows the new model was tested on, so after fit the job resolves
``models:/<model_name>@<alias>`` (the spec's ``compare`` part) to a version, loads it (the torch module,
or the serving model of a training module with ``serving_model``: see :func:`as_scored`), and scores it and the newly trained best model with the training
module's own ``evaluate(model, config, table)`` on exactly the rows the workers evaluated on: every
file the plan lists for the ``test`` dataset.

The champion is scored where nothing of it outlives the job: in the job's driver, or, on a warm
group's rank 0 (a process that serves the next jobs), in a process of its own that ends with the call
(``isolated``: :mod:`emr_ray.cluster.jobs.clean_process`). There, rank 0 copies the version's files
with its open store and writes the test rows to a file; the child only unpickles and scores them,
with no MLflow store to open (a second here against a database store), no storage options and no
login for the model's code to see, and answers with numbers (JSON, never unpickled by rank 0).
Loading a registered model still runs its code (a pickled flavour): whoever may move ``@champion``
may run code on the cluster, in that child (docs/security.md).

This runs in the job's driver (or rank 0), not on the Ray Train workers: a test split is small (the default
split keeps a fifth of a partition; 10k rows of 16 features is under 1 MB), so the driver reads it
whole with :func:`emr_ray.cluster.jobs.shards.read` and scores it on the CPU. A test split too large
for one process is a reason to evaluate a sample instead; this step does not.

Recorded in the challenger's MLflow run, for ``MLflowRegisterOperator``: the tags
``compare.model``, ``compare.alias``, ``compare.champion_version`` (``none`` when there is no
champion yet) and ``compare.rows``, and the metrics ``compare.champion.<m>`` and
``compare.challenger.<m>`` for every metric ``evaluate`` returns; or the tag ``compare.skipped``
with the reason (no ``evaluate`` in the module, no test dataset, a champion that cannot be
loaded or scored on these rows). A skipped comparison never fails the training: the register
task then falls back to the champion's recorded metric, and says so.

Against an MLflow that requires a login, every call goes through :func:`train_mlflow.client
<emr_ray.cluster.jobs.train_mlflow.client>` (or runs after it), which makes the job's credentials visible
first (:func:`~emr_ray.cluster.jobs.train_mlflow.ensure_credentials`); the artifact downloads read the same
``MLFLOW_TRACKING_*`` variables.

Runs on the cluster: never imports Airflow.
"""

from __future__ import annotations

import importlib
import logging
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from emr_ray.cluster import storage
from emr_ray.cluster import train as emr_train
from emr_ray.cluster.jobs import clean_process, shards, train_datasets
from emr_ray.cluster.jobs import train_mlflow as tracking
from emr_ray.cluster.promotion import (
    NO_CHAMPION,
    TAG_COMPARE_ALIAS,
    TAG_COMPARE_MODEL,
    TAG_COMPARE_ROWS,
    TAG_COMPARE_SKIPPED,
    TAG_COMPARE_VERSION,
    compare_metric,
)
from emr_ray.cluster.results import ChampionScores, TrainResult
from emr_ray.cluster.reuse import record_value
from emr_ray.cluster.spec import CompareSection, TrainJobSpec, import_by_path

log = logging.getLogger("emr_ray.cluster.jobs.compare")


class Skipped(Exception):
    """The comparison cannot be made; the message says why (it goes to the run's ``compare.skipped``)."""


def with_champion(
    spec: TrainJobSpec,
    plan: dict[str, Any],
    options: storage.StorageOptions,
    mlflow_run_id: str,
    challenger: Any,
    *,
    isolated: bool = False,
) -> ChampionScores | None:
    """
    Score the champion and ``challenger`` on the plan's test rows; log and return the figures
    (None when the spec asks for no comparison).

    :param spec: the training spec (its ``compare`` and ``mlflow`` parts, its ``config``).
    :param plan: the training's shard plan (its ``test`` entry lists the files).
    :param options: storage settings to read the files.
    :param mlflow_run_id: the challenger's MLflow run, where the figures are logged.
    :param challenger: the newly trained model (``build_model`` with the best checkpoint's weights), or its
        serving model when the training module has ``serving_model`` (see :func:`as_scored`).
    :param isolated: score the champion in a process of its own that ends with the call (in a process
        that outlives the job: a warm group's rank 0).
    """
    section = spec.compare
    if section is None:
        return None
    client = tracking.client(spec)
    try:
        figures = _compare(spec, section, plan, options, challenger, client, isolated)
    except Skipped as e:
        return _record_skip(client, mlflow_run_id, section, str(e))
    except Exception as e:  # a finished training is never failed by its comparison
        log.warning("Comparison with %s@%s failed", section.model_name, section.alias, exc_info=True)
        return _record_skip(client, mlflow_run_id, section, f"{type(e).__name__}: {e}")
    _record(client, mlflow_run_id, section, figures, plan)
    return ChampionScores(model_name=section.model_name, alias=section.alias, **figures)


def refresh(
    spec: TrainJobSpec,
    result: TrainResult,
    plan_of: Callable[[], dict[str, Any]],
    options: storage.StorageOptions,
) -> ChampionScores | None:
    """
    The comparison for a finished training whose stored result the job returns again.

    The stored comparison while the champion is still the version it scored; otherwise (the
    champion changed, none was made, or it was skipped) the comparison is made again with the
    stored best checkpoint, so clearing the training task re-scores the current champion on the
    same rows without training again.

    :param spec: the training spec.
    :param result: the stored result (``mlflow_run_id``, ``checkpoint_uri``, ``comparison``).
    :param plan_of: builds the shard plan (only called when the comparison is made again).
    :param options: storage settings.
    """
    section = spec.compare
    stored = result.comparison
    if section is None:
        return stored
    current = champion_version(tracking.client(spec), section)
    if (
        stored
        and stored.skipped is None
        and (stored.model_name, stored.alias) == (section.model_name, section.alias)
        and stored.champion_version == current
    ):
        return stored
    log.info(
        "The stored comparison scored %s; %s@%s is now %s: scoring again on the same rows.",
        f"v{stored.champion_version}" if stored and stored.champion_version else "no champion",
        section.model_name,
        section.alias,
        f"v{current}" if current else "unset",
    )
    try:
        plan = plan_of()
        challenger = as_scored(
            spec, model_from_checkpoint(spec, result.checkpoint_uri, options), plan, options
        )
    except Exception as e:  # a pruned generation or checkpoint: the stored result stands, uncompared
        reason = f"the stored model or its test rows cannot be read again ({type(e).__name__}: {e})"
        return _record_skip(tracking.client(spec), result.mlflow_run_id, section, reason)
    return with_champion(spec, plan, options, result.mlflow_run_id, challenger)


def champion_version(client: Any, section: CompareSection) -> str | None:
    """The version ``section.alias`` of ``section.model_name`` points at, or None (no model or no alias)."""
    from mlflow.exceptions import MlflowException

    try:
        aliases = client.get_registered_model(section.model_name).aliases or {}
    except MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    version = aliases.get(section.alias)
    return None if version is None else str(version)


def read_test_rows(plan: dict[str, Any], options: storage.StorageOptions):
    """Every row of the plan's ``test`` dataset, all columns, as one pyarrow Table."""
    entry = plan["datasets"].get("test")
    if not entry or not entry["files"]:
        raise Skipped("the training has no 'test' dataset to score both models on")
    table = shards.read_dataset_entry(entry, storage.filesystem(entry["uri"], options))
    if table is None or table.num_rows == 0:
        raise Skipped(f"the test dataset {entry['uri']} has no rows")
    return table


def download_version(spec: TrainJobSpec, client: Any, name: str, version: str, folder: str) -> str:
    """Version ``version`` of ``name``'s files, copied into ``folder`` (nothing is unpickled); their path."""
    from mlflow.artifacts import download_artifacts

    return download_artifacts(
        artifact_uri=client.get_model_version_download_uri(name, version),
        dst_path=folder,
        tracking_uri=spec.mlflow.tracking_uri,
        registry_uri=spec.mlflow.registry_uri or spec.mlflow.tracking_uri,
    )


def load_downloaded(local: str) -> Any:
    """The model in ``local``: the torch module of a ``pytorch``-flavoured model, or the Python model
    object of one logged by ``serving_model``."""
    import mlflow.pyfunc
    import mlflow.pytorch
    from mlflow.models import Model

    if "pytorch" in Model.load(local).flavors:
        return mlflow.pytorch.load_model(local)
    return mlflow.pyfunc.load_model(local).unwrap_python_model()


def load_version(spec: TrainJobSpec, client: Any, name: str, version: str) -> Any:
    """Version ``version`` of ``name``, downloaded to a temporary folder and loaded (:func:`load_downloaded`)."""
    with tempfile.TemporaryDirectory() as tmp:
        return load_downloaded(download_version(spec, client, name, version, tmp))


def as_scored(spec: TrainJobSpec, model: Any, plan: dict[str, Any], options: storage.StorageOptions) -> Any:
    """What ``evaluate`` scores for the new model: the torch module itself, or, when the training module
    logs a serving model (``serving_model``), that model, as the champion is loaded."""
    serving = getattr(importlib.import_module(spec.model_module), "serving_model", None)
    if serving is None:
        return model
    python_model, _ = serving(model, spec.config, shards.dataset_reader(plan, options))
    return python_model


def model_from_checkpoint(spec: TrainJobSpec, checkpoint_uri: str, options: storage.StorageOptions) -> Any:
    """``build_model(config)`` with the weights of the checkpoint at ``checkpoint_uri`` (any storage)."""
    fsys, path = storage.resolve(checkpoint_uri, options)
    model = import_by_path(f"{spec.model_module}:build_model")(spec.config)
    with tempfile.TemporaryDirectory() as tmp:
        with (
            fsys.open_input_stream(f"{path}/{emr_train.STATE_FILE}") as f,
            open(os.path.join(tmp, emr_train.STATE_FILE), "wb") as out,
        ):
            out.write(f.read())
        emr_train.load_weights(model, tmp)
    model.eval()
    return model


def _compare(
    spec: TrainJobSpec,
    section: CompareSection,
    plan: dict[str, Any],
    options: storage.StorageOptions,
    challenger: Any,
    client: Any,
    isolated: bool,
) -> dict[str, Any]:
    evaluate = _evaluate_of(spec)
    version = champion_version(client, section)
    if version is None:
        log.info("%s@%s does not exist yet: nothing to compare with.", section.model_name, section.alias)
        return {"champion_version": None, "rows": None, "champion": {}, "challenger": {}}
    started = time.monotonic()
    table = read_test_rows(plan, options)
    log.info("Read %d test rows in %.1fs", table.num_rows, time.monotonic() - started)
    kwargs: dict[str, Any] = {"spec": spec, "version": version, "plan": plan, "options": options}
    if isolated:
        # this process copies the files with its open store and the job's login, and hands the child
        # the rows: the child only unpickles and scores, with no store, no storage options, no login
        with tempfile.TemporaryDirectory() as tmp:
            rows = write_rows(table, os.path.join(tmp, "rows.arrow"))
            copying = time.monotonic()
            try:
                local = download_version(spec, client, section.model_name, version, tmp)
            except Exception as e:
                raise Skipped(
                    f"{section.model_name} v{version} could not be loaded: {type(e).__name__}: {e}"
                ) from e
            log.info(
                "Copied %s v%s's files in %.1fs", section.model_name, version, time.monotonic() - copying
            )
            champion_figures = clean_process.call(
                f"{__name__}:score_rows",
                {"spec": spec, "version": version, "rows": rows, "local": local},
                {},
                errors={"Skipped": Skipped},
            )
    else:
        champion_figures = score_champion(**kwargs)
    challenger_figures = _numbers(evaluate(challenger, spec.config, table))
    print(
        f"[emr_ray] compared on the same {table.num_rows} test rows in {time.monotonic() - started:.1f}s: "
        f"{section.alias} v{version} {_text(champion_figures)} | new model {_text(challenger_figures)}",
        flush=True,
    )
    return {
        "champion_version": version,
        "rows": table.num_rows,
        "champion": champion_figures,
        "challenger": challenger_figures,
    }


def write_rows(table: Any, path: str) -> str:
    """The test rows as an Arrow file for the scoring child: it reads them, never the store."""
    import pyarrow as pa

    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return path


def score_rows(spec: TrainJobSpec, version: str, rows: str, local: str) -> dict[str, float]:
    """In the scoring child (:func:`with_champion`'s ``isolated``): the downloaded version ``local``
    scored on the rows rank 0 wrote to ``rows``. No storage options, no login: only data in, numbers out."""
    import pyarrow as pa

    with pa.memory_map(rows) as source:
        table = pa.ipc.open_file(source).read_all()
    return _score(spec, version, table, local=local)


def score_champion(
    spec: TrainJobSpec,
    version: str,
    plan: dict[str, Any],
    options: storage.StorageOptions,
    local: str | None = None,
) -> dict[str, float]:
    """Version ``version`` of the compared model scored by ``evaluate`` on the plan's test rows, in the
    caller's process (the clean process's is :func:`score_rows`)."""
    return _score(spec, version, read_test_rows(plan, options), local=local)


def _score(spec: TrainJobSpec, version: str, table: Any, *, local: str | None) -> dict[str, float]:
    assert spec.compare is not None
    name, evaluate = spec.compare.model_name, _evaluate_of(spec)
    try:
        champion = (
            load_downloaded(local) if local else load_version(spec, tracking.client(spec), name, version)
        )
    except Exception as e:
        raise Skipped(f"{name} v{version} could not be loaded: {type(e).__name__}: {e}") from e
    try:
        return _numbers(evaluate(champion, spec.config, table))
    except Exception as e:
        raise Skipped(
            f"{name} v{version} could not be scored on these rows ({type(e).__name__}: {e}); "
            "was it trained on other columns?"
        ) from e


def _evaluate_of(spec: TrainJobSpec) -> Callable[..., Any]:
    evaluate = getattr(importlib.import_module(spec.model_module), "evaluate", None)
    if evaluate is None:
        raise Skipped(
            f"{spec.model_module} has no evaluate(model, config, table); add one "
            "(see emr_ray.cluster.train.EvaluatingModule) to score both models on the same rows"
        )
    return evaluate


def _record(
    client: Any, mlflow_run_id: str, section: CompareSection, figures: dict[str, Any], plan: dict[str, Any]
) -> None:
    """The figures as the run's ``compare.*`` metrics and tags, and the rows both models were scored
    on as an input of the run (:func:`train_datasets.log_compared_rows`)."""
    import mlflow

    tags = {
        TAG_COMPARE_MODEL: section.model_name,
        TAG_COMPARE_ALIAS: section.alias,
        TAG_COMPARE_VERSION: figures["champion_version"] or NO_CHAMPION,
    }
    if figures["rows"] is not None:
        tags[TAG_COMPARE_ROWS] = str(figures["rows"])
    stamp = int(time.time() * 1000)
    metrics = [
        mlflow.entities.Metric(compare_metric(side, name), value, stamp, 0)
        for side in ("champion", "challenger")
        for name, value in figures[side].items()
    ]
    client.log_batch(
        mlflow_run_id, metrics=metrics, tags=[mlflow.entities.RunTag(k, v) for k, v in tags.items()]
    )
    if figures["champion_version"] is not None:
        train_datasets.log_compared_rows(
            client, mlflow_run_id, plan, section.model_name, figures["champion_version"], figures["rows"]
        )


def _record_skip(client: Any, mlflow_run_id: str, section: CompareSection, reason: str) -> ChampionScores:
    log.warning("Not comparing with %s@%s: %s", section.model_name, section.alias, reason)
    print(f"[emr_ray] comparison skipped: {reason}", flush=True)
    client.set_tag(
        mlflow_run_id, TAG_COMPARE_SKIPPED, record_value(TAG_COMPARE_SKIPPED, reason)
    )  # the version's too
    return ChampionScores(model_name=section.model_name, alias=section.alias, skipped=reason)


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in metrics.items() if isinstance(v, int | float)}


def _text(figures: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in sorted(figures.items()))
