"""The batch scoring job (``python -m emr_ray.cluster.jobs.predict``): score one committed input with
one registered model version on Ray Data, and commit the predictions as a new generation.

- *One model per run*: the spec names a version number (the operator resolved the alias once), and
  this driver fetches that version's files once (:func:`model_files`), with the job's MLflow login.
- *The model's code never sees a key*: a pyfunc model unpickles code from the registry. It is loaded
  in the Ray Data actors that score (:class:`Scorer`), from the files this driver hands them through
  the object store: no MLflow store, no login, no storage keys in their processes. The reads and
  writes run in Ray Data's own tasks, with the job's storage options, never fused into the scorers
  (``tests/integration/test_batch_predict.py`` looks for a key from inside them).
- *Rows stream*: Ray Data reads the input's files, scores batches of ``batch_size`` rows on
  ``num_workers`` replicas and writes Parquet as it goes; no process holds the partition.
- *Whole or absent*: the predictions go into a new generation of ``output_uri``, committed by the
  same atomic step as every generation, which refuses it unless it holds exactly the input's rows.

Runs on the cluster: never imports Airflow.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
import zipfile
from typing import Any

from emr_ray.cluster import partitions, retention, storage
from emr_ray.cluster.jobs import _usage
from emr_ray.cluster.jobs._runtime import JobInputError, main
from emr_ray.cluster.results import PredictResult
from emr_ray.cluster.spec import PredictJobSpec, import_by_path

log = logging.getLogger("emr_ray.cluster.jobs.predict")
#: the output the predictions are committed as
OUTPUT = "predictions"


def run(spec: PredictJobSpec) -> PredictResult:
    import ray

    options = spec.storage.options()
    committed, output = partitions.for_output_uri(spec.input_uri, options)
    files = [path for path, _ in partitions.dataset_files(committed, output, options)]
    rows = storage.count_parquet_rows(files, spec.input_uri, options) if files else 0
    if rows == 0:
        raise JobInputError(f"Input {spec.input_uri} has no rows; nothing to score.")
    log.info("Scoring %d rows of %s (generation %s)", rows, spec.input_uri, committed.generation)
    _usage.lap("check_inputs")

    ray.init(address="auto", logging_level=logging.WARNING, ignore_reinit_error=True)
    model = ray.put(model_files(spec))  # once: every replica loads the same version
    _usage.lap("model_files")
    generation = partitions.new_generation()
    committed_out = None
    unknown = False  # the commit failed with its outcome unknown: perhaps current, its files stay
    try:
        with partitions.writer_lease(spec.output_uri, generation, options):
            fsys, out_path = storage.resolve(
                partitions.output_uri(spec.output_uri, generation, OUTPUT), options
            )
            source = storage.filesystem(spec.input_uri, options)
            # the files' own columns only: no column inferred from the path's ``dt=...``
            scored = ray.data.read_parquet(files, filesystem=source, partitioning=None)
            scored = scored.map_batches(
                Scorer,
                fn_constructor_args=([model], spec.predict, spec.config),
                batch_size=spec.batch_size,
                batch_format="numpy",
                # from one replica up to num_workers: a pool that took every CPU first would leave none
                # for the reads and writes it waits on (a 2-CPU cluster deadlocked at 2 replicas)
                concurrency=(1, spec.num_workers),
                num_gpus=1 if spec.use_gpu else 0,
                # remote args the read has not: Ray Data then never fuses the read (whose tasks carry
                # the storage keys) into the scorers, where the registry's code runs
                max_restarts=0,
            )
            scored.write_parquet(out_path, filesystem=fsys)
            _usage.lap("score")
            manifest = {
                "partition": spec.partition,
                "input_uri": spec.input_uri,
                "input_generation": committed.generation,
                "model": spec.model_name,
                "version": spec.model_version,
                "outputs": {OUTPUT: {"rows": rows}},  # the commit refuses other than the input's rows
                "producer": spec.identity,
            }
            try:
                committed_out = partitions.commit(spec.output_uri, generation, manifest, options)
            except partitions.CommitStateUnknown:
                unknown = True
                raise
        retention.tidy(spec.output_uri, options)
        _usage.lap("commit")
    finally:
        if committed_out is None and not unknown:
            partitions.discard(spec.output_uri, generation, options)
    print(
        f"[emr_ray] scored {rows} rows of {spec.input_uri} with {spec.model_name} v{spec.model_version}: "
        f"generation {generation} of {spec.output_uri}",
        flush=True,
    )
    return PredictResult(
        partition=spec.partition,
        input_uri=spec.input_uri,
        input_generation=committed.generation,
        model_name=spec.model_name,
        model_version=str(spec.model_version),
        rows=rows,
        output_uri=spec.output_uri,
        generation=generation,
        predictions_uri=committed_out.output_uri(OUTPUT),
        superseded_by=committed_out.superseded_by,
    )


def model_files(spec: PredictJobSpec) -> bytes:
    """The version's files (its MLmodel, weights and code), zipped: fetched once with the job's MLflow
    login, nothing unpickled here."""
    import mlflow
    from mlflow.artifacts import download_artifacts

    from emr_ray.cluster import secrets

    secrets.ensure_env()
    settings = spec.mlflow
    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri, registry_uri=settings.registry_uri)
    try:
        uri = client.get_model_version_download_uri(spec.model_name, str(spec.model_version))
    except mlflow.exceptions.MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            raise JobInputError(
                f"{spec.model_name} v{spec.model_version} does not exist in the registry at "
                f"{settings.tracking_uri}; check the model name and version."
            ) from e
        raise
    with tempfile.TemporaryDirectory() as tmp:
        local = download_artifacts(
            artifact_uri=uri,
            dst_path=tmp,
            tracking_uri=settings.tracking_uri,
            registry_uri=settings.registry_uri or settings.tracking_uri,
        )
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for root, _, names in os.walk(local):
                for name in names:
                    path = os.path.join(root, name)
                    archive.write(path, os.path.relpath(path, local))
    return buffer.getvalue()


class Scorer:
    """One replica of the model (a Ray Data actor): loads the version from its files once, then adds
    ``predict(model, batch, config)``'s columns to each batch."""

    def __init__(self, model: list[Any], predict: str, config: dict[str, Any]) -> None:
        import mlflow.pyfunc
        import ray

        self.folder = tempfile.mkdtemp(prefix="emr_ray_model_")
        with zipfile.ZipFile(io.BytesIO(ray.get(model[0]))) as archive:
            archive.extractall(self.folder)
        self.model = mlflow.pyfunc.load_model(self.folder)
        self.predict = import_by_path(predict)
        self.config = config

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {**batch, **self.predict(self.model, batch, self.config)}


if __name__ == "__main__":
    main(run, spec_type=PredictJobSpec, fast_exit=True)
