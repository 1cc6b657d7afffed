"""The digits DAG end to end through ``airflow dags test``: Spark on Ray augments scikit-learn's
bundled 8x8 digits, Ray Train fits the CNN, MLflow registers ``digits-cnn`` as champion.
Real Airflow, Ray, RayDP, MLflow and COS stand-in, as in ``test_retrain_tabular``.
"""

from __future__ import annotations

import pytest

from emr_ray.cluster import partitions, storage
from tests.fixtures.pipeline import GOOD

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def run(workload_runs):
    return workload_runs["retrain_digits"]


def test_digits_dag_succeeds(run):
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]


def test_training_split_is_augmented_five_times(stack, run):
    manifest = partitions.require_current(storage.join(stack.staging_uri, "digits", f"dt={GOOD}")).manifest
    rows = {name: out["rows"] for name, out in manifest["outputs"].items()}
    assert manifest["rows_in"] == 1797
    assert rows["train"] == 5 * (1797 - rows["test"])


def test_cnn_is_well_above_chance_and_champion(stack, run):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=stack.tracking_uri)
    champion = client.get_model_version_by_alias("digits-cnn", "champion")
    accuracy = client.get_run(champion.run_id).data.metrics["test_accuracy"]
    assert accuracy >= 0.9, f"test accuracy {accuracy:.3f} (chance is 0.1)"
    assert champion.tags["partition"] == GOOD
