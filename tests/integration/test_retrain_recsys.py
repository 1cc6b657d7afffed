"""The recommender DAG end to end through ``airflow dags test``: a day of synthetic interactions in the
COS stand-in, Spark on Ray indexes ids, holds out each user's last item and samples negatives, Ray
Train fits the two-tower model, MLflow registers ``recsys-two-tower`` as champion. Real Airflow,
Ray, RayDP, MLflow and COS stand-in, as in ``test_retrain_digits``; the same operators, no special case.
"""

from __future__ import annotations

import pandas as pd
import pytest

from emr_ray.cluster import partitions, storage
from include.data import interactions
from tests.fixtures.pipeline import GOOD

pytestmark = pytest.mark.integration

MODEL = "recsys-two-tower"


@pytest.fixture(scope="module")
def run(workload_runs):
    return workload_runs["retrain_recsys"]


@pytest.fixture(scope="module")
def log():
    """The raw log the run read, one row per (user, item) at its first time."""
    raw = interactions.make_partition(GOOD).to_pandas()
    return raw.sort_values("ts").drop_duplicates(["user_id", "item_id"])


@pytest.fixture(scope="module")
def staged(stack, run) -> dict[str, pd.DataFrame]:
    """Every output of the generation the run committed, as DataFrames."""
    import pyarrow.parquet as pq

    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    options = stack.storage_options()
    committed = partitions.require_current(storage.join(stack.staging_uri, "recsys", f"dt={GOOD}"), options)
    fsys = storage.filesystem(committed.partition_uri, options)
    frames = {}
    for name in committed.outputs:
        files = [path for path, _ in partitions.dataset_files(committed, name, options)]
        frames[name] = pd.concat(
            [pq.read_table(f, filesystem=fsys).to_pandas() for f in files], ignore_index=True
        )
    return frames


@pytest.fixture(scope="module")
def champion(stack, run):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=stack.tracking_uri)
    version = client.get_model_version_by_alias(MODEL, "champion")
    return client, version


def test_the_dag_succeeds(run):
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]


def test_every_user_has_one_test_row_their_last_item(staged, log):
    test = staged["test"]
    assert test["user_id"].is_unique and len(test) == log["user_id"].nunique()
    last = log.groupby("user_id").tail(1).set_index("user_id")["item_id"]
    assert (test.set_index("user_id")["item_id"] == last.loc[test["user_id"]]).all()
    assert (test["label"] == 1).all()
    positives = staged["train"][staged["train"]["label"] == 1]
    held_out = set(zip(test["user_idx"], test["item_idx"], strict=True))
    assert not held_out & set(zip(positives["user_idx"], positives["item_idx"], strict=True))


def test_the_indexes_are_complete_and_ordered_by_training_popularity(staged, log):
    users, items, train = staged["users"], staged["items"], staged["train"]
    assert sorted(users["user_idx"]) == list(range(1, len(users) + 1))
    assert sorted(items["item_idx"]) == list(range(1, len(items) + 1))
    assert set(users["user_id"]) == set(log["user_id"]) and set(items["item_id"]) == set(log["item_id"])
    by_idx = items.sort_values("item_idx")
    assert by_idx["popularity"].is_monotonic_decreasing
    assert set(train["user_idx"]) <= set(users["user_idx"]) and set(train["item_idx"]) <= set(
        items["item_idx"]
    )
    positives = train[train["label"] == 1]
    assert len(positives) == len(log) - len(staged["test"])  # every other interaction trains


def test_negatives_are_never_the_users_own_items_and_about_four_per_positive(staged):
    train = staged["train"]
    positives, negatives = train[train["label"] == 1], train[train["label"] == 0]
    own = set(zip(positives["user_idx"], positives["item_idx"], strict=True))
    assert not own & set(zip(negatives["user_idx"], negatives["item_idx"], strict=True))
    assert 0.98 * 4 * len(positives) <= len(negatives) <= 4 * len(positives)
    # a positive's history never holds the positive itself
    assert not any(
        item in set(history)
        for item, history in zip(positives["item_idx"], positives["history"], strict=True)
    )


def test_the_popularity_baseline_rank_is_exact(staged):
    """The rank of the held-out item among the items the user has not touched, most popular first."""
    order = (
        staged["items"].sort_values(["popularity", "item_id"], ascending=[False, True])["item_idx"].tolist()
    )
    for row in staged["test"].itertuples():
        seen = set(row.history)
        candidates = [i for i in order if i not in seen]
        assert row.popularity_rank == candidates.index(row.item_idx) + 1
        assert row.popularity_hit_at_10 == float(row.popularity_rank <= 10)


def test_the_champion_beats_the_popularity_baseline_of_its_own_run(champion):
    client, version = champion
    metrics = client.get_run(version.run_id).data.metrics
    recall, baseline = metrics["recall_at_10"], metrics["popularity_recall_at_10"]
    assert baseline > 0.1, f"popularity recall@10 {baseline:.3f}: the baseline should be a real one"
    # a model that learned popularity and nothing personal scores about the baseline: it fails here
    assert recall >= baseline + 0.15, f"recall@10 {recall:.3f} vs popularity {baseline:.3f}"
    assert version.tags["partition"] == GOOD


def test_the_logged_model_takes_raw_ids_and_ranks_held_out_items(stack, champion, staged):
    import mlflow.pyfunc
    import pyarrow as pa
    from mlflow.artifacts import download_artifacts

    from include.models import recsys

    client, version = champion
    local = download_artifacts(
        artifact_uri=client.get_model_version_download_uri(MODEL, version.version),
        tracking_uri=stack.tracking_uri,
    )
    loaded = mlflow.pyfunc.load_model(local)
    test = staged["test"]
    scores = loaded.predict(pd.DataFrame({"user_id": ["u0001", "nobody"], "item_id": ["i0001", "i0001"]}))
    assert len(scores) == 2 and all(pd.notna(scores))  # an unknown user still gets a (popularity) score
    served = loaded.unwrap_python_model()
    top10 = served.recommend(test["user_id"].tolist(), k=10)
    hits = sum(item in top for item, top in zip(test["item_id"], top10, strict=True)) / len(test)
    logged = max(m.value for m in client.get_metric_history(version.run_id, "recall_at_10"))  # best epoch's
    assert hits == pytest.approx(logged, abs=0.01)
    # what the champion comparison computes for it, through its own index on raw ids
    assert recsys.evaluate(served, {}, pa.Table.from_pandas(test))["recall_at_10"] == pytest.approx(
        logged, abs=1e-6
    )
