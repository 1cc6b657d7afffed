"""Batch scoring of a staged tabular partition: read its test split, predict, commit the predictions.

Called by the scoring DAG's task (``dags/score_tabular.py``), which resolves the model version and
loads the model through ``MLflowHook``. This module imports neither Airflow nor MLflow: the model is
anything with ``predict(x) -> class scores`` for a float32 feature matrix (an MLflow pyfunc model).

Input: the ``test`` output of a committed generation of ``<staging>/tabular/dt=<partition>`` (the
features and ``label``, as the preprocessing job staged them): the generation the model was trained
on when its version says so (tag ``generation``), else the current one; an empty or uncommitted
partition is refused. Output: a new generation of ``<staging>/predictions/dt=<partition>`` (output
``predictions``: the same rows plus ``prediction``), committed with the row count, the model, its
version, the accuracy, the partition and the input generation (:mod:`emr_ray.cluster.partitions`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from emr_ray.cluster.storage import StorageOptions

LABEL_COLUMN = "label"
PREDICTION_COLUMN = "prediction"


class Predictor(Protocol):
    """A model that maps a feature matrix to one score per class (an MLflow pyfunc model)."""

    def predict(self, x: Any) -> Any: ...


def staged_uri(staging_uri: str, partition: str) -> str:
    """The staged partition the preprocessing job committed: ``<staging>/tabular/dt=<partition>``."""
    from emr_ray.cluster import storage

    return storage.join(staging_uri, "tabular", f"dt={partition}")


def predictions_uri(staging_uri: str, partition: str) -> str:
    """Where the predictions of ``partition`` are committed: ``<staging>/predictions/dt=<partition>``."""
    from emr_ray.cluster import storage

    return storage.join(staging_uri, "predictions", f"dt={partition}")


def feature_matrix(table: pa.Table, label: str = LABEL_COLUMN) -> np.ndarray:
    """Every column but ``label``, in table order, as one float32 matrix (rows by features)."""
    import numpy as np

    features = [c for c in table.column_names if c != label]
    return np.column_stack([table[c].to_numpy() for c in features]).astype(np.float32)


def predict_classes(model: Predictor, x: np.ndarray) -> np.ndarray:
    """The class with the highest score for each row of ``x``."""
    import numpy as np

    return np.asarray(model.predict(x)).argmax(axis=1)


def predict_batch(model: Predictor, batch: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The batch scoring job's step (``RayBatchPredictOperator(predict=...)``): for a batch of rows
    (column name to numpy array), the class with the highest score. The features are
    ``config["feature_columns"]``, else every column but the label."""
    import numpy as np

    label = config.get("label_column", LABEL_COLUMN)
    features = config.get("feature_columns") or [c for c in batch if c not in (label, PREDICTION_COLUMN)]
    x = np.column_stack([np.asarray(batch[c]) for c in features]).astype(np.float32)
    return {PREDICTION_COLUMN: predict_classes(model, x)}


def score_partition(
    staging_uri: str,
    partition: str,
    model: Predictor,
    *,
    model_name: str,
    version: str | int,
    generation: str | None = None,
    options: StorageOptions | None = None,
) -> dict[str, Any]:
    """
    Score the test split of ``partition`` with ``model`` and commit the predictions partition.

    :param staging_uri: the staging root (``cos://``, ``hdfs://`` or ``file://``).
    :param partition: the partition date, ``YYYY-MM-DD`` (the model version's ``partition`` tag).
    :param model: the loaded model.
    :param model_name: the registered model's name, for the manifest.
    :param version: the model version, for the manifest (as MLflow returned it).
    :param generation: the staged generation to score (the version's ``generation`` tag); None
        means the partition's current generation.
    :param options: storage connection options (None for ``file://``).
    :returns: ``partition``, ``version``, ``rows``, ``accuracy``, ``generation`` (scored) and
        ``predictions_uri`` (the XCom).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from emr_ray.cluster import partitions, retention, storage

    source = staged_uri(staging_uri, partition)
    if generation:
        committed = partitions.pinned(source, generation, options)
    else:
        committed = partitions.require_current(source, options)
    files = partitions.dataset_files(committed, "test", options)
    fsys = storage.filesystem(source, options)
    table = pa.concat_tables([pq.read_table(path, filesystem=fsys) for path, _ in files])
    if table.num_rows == 0:
        raise storage.StorageError(
            f"The test split of {source} (generation {committed.generation}) is empty."
        )
    predicted = predict_classes(model, feature_matrix(table))
    accuracy = float((predicted == table[LABEL_COLUMN].to_numpy()).mean())

    final = predictions_uri(staging_uri, partition)
    manifest = {
        "rows": table.num_rows,
        "model": model_name,
        "version": version,
        "accuracy": accuracy,
        "partition": partition,
        "input_generation": committed.generation,
    }
    scored = table.append_column(PREDICTION_COLUMN, pa.array(predicted))
    written = partitions.write_tables(final, {"predictions": scored}, manifest, options)
    retention.tidy(final, options)
    print(
        f"Scored {table.num_rows} rows of {source} (generation {committed.generation}) with "
        f"{model_name} v{version}: accuracy {accuracy:.4f}"
    )
    return {
        "partition": partition,
        "version": version,
        "rows": table.num_rows,
        "accuracy": accuracy,
        "generation": committed.generation,
        "predictions_uri": written.output_uri("predictions"),
    }
