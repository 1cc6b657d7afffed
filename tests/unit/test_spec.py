"""The typed job spec: validated where it is built, the same after a JSON round trip, markers read back."""

from __future__ import annotations

import json

import pytest

from emr_ray.cluster import spec
from emr_ray.cluster.spec import (
    CheckpointSpec,
    CompareSection,
    MLflowSection,
    ScalingSpec,
    SparkJobSpec,
    SparkSettings,
    SpecError,
    StorageSection,
    TrainJobSpec,
)


def train_spec(**overrides) -> TrainJobSpec:
    fields = {
        "train_loop": "include.models.tabular:train_loop",
        "datasets": {"train": "file:///d/dt=2026-11-02/train", "test": "file:///d/dt=2026-11-02/test"},
        "run_name": "retrain-train-abc",
        "storage_path": "file:///ck/checkpoints/retrain/run/train",
        "mlflow": MLflowSection(tracking_uri="sqlite:////m/mlflow.db", experiment_name="retrain"),
        "config": {"epochs": 3, "feature_columns": ["a", "b"]},
    }
    return TrainJobSpec(**(fields | overrides))


def test_a_training_spec_survives_json_and_back_unchanged():
    built = train_spec(
        scaling=ScalingSpec(num_workers=4, use_gpu=True, resources_per_worker={"CPU": 2, "GPU": 1}),
        checkpoint=CheckpointSpec(num_to_keep=None, score_attribute="test_accuracy", score_order="max"),
        storage=StorageSection(cos={"region": "ap-guangzhou", "scheme": "https"}),
        identity={"airflow.dag_id": "retrain"},
    )
    again = TrainJobSpec.from_dict(json.loads(built.to_json()))
    assert again == built
    assert isinstance(again.scaling, ScalingSpec) and again.scaling.num_workers == 4
    assert again.epochs == 3 and again.model_module == "include.models.tabular"


def test_the_optional_compare_part_survives_json_and_back_and_defaults_to_none():
    built = train_spec(compare=CompareSection(model_name="tabular-mlp"))
    again = TrainJobSpec.from_dict(json.loads(built.to_json()))
    assert again == built and isinstance(again.compare, CompareSection) and again.compare.alias == "champion"
    assert TrainJobSpec.from_dict(json.loads(train_spec().to_json())).compare is None
    with pytest.raises(SpecError, match="compare.model_name is empty; name the registered model"):
        CompareSection(model_name="")


def test_a_spark_spec_survives_json_and_back_unchanged():
    built = SparkJobSpec(
        partition="2026-11-02",
        preprocess="include.preprocessing.tabular:standardize",
        input_uri="cos://bucket-125/raw/dt=2026-11-02",
        output_uri="cos://bucket-125/staging/dt=2026-11-02",
        spark=SparkSettings(app_name="retrain-preprocess", num_executors=2, configs={"k": "v"}),
    )
    assert SparkJobSpec.from_dict(json.loads(built.to_json())) == built


def test_the_defaults_live_in_one_place():
    defaults = train_spec()
    assert (defaults.scaling.num_workers, defaults.scaling.placement_strategy) == (2, "PACK")
    assert (defaults.checkpoint.score_attribute, defaults.checkpoint.score_order) == ("test_loss", "min")
    assert defaults.failure.max_failures == 1


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ScalingSpec(num_workers=0), "at least 1 worker"),
        (lambda: ScalingSpec(placement_strategy="CLUSTER"), "use one of PACK, SPREAD"),
        (lambda: ScalingSpec(use_gpu=True, resources_per_worker={"GPU": 0}), "drop GPU"),
        (lambda: ScalingSpec(resources_per_worker={"GPU": 1}), "set use_gpu=True"),
        (lambda: CheckpointSpec(score_order="up"), "use 'min' .* or 'max'"),
        (lambda: CheckpointSpec(num_to_keep=0), "keep at least 1 checkpoint"),
        (lambda: train_spec(datasets={"test": "file:///t"}), "must name a 'train' URI"),
        (lambda: train_spec(train_loop="include.models.tabular"), "not an import path"),
        (lambda: train_spec(storage_path="s3://bucket/ck"), "use one of file://, cos://, hdfs://"),
        (lambda: SparkSettings(app_name="a", num_executors=0), "at least 1"),
    ],
)
def test_bad_combinations_fail_on_construction_with_the_fix(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_a_partition_that_is_not_a_date_is_refused_in_the_spark_spec():
    with pytest.raises(ValueError, match="not a date like"):
        SparkJobSpec(
            partition="2026-11-02\n",
            preprocess="m:f",
            input_uri="file:///raw",
            output_uri="file:///out",
            spark=SparkSettings(app_name="a"),
        )


def test_a_field_one_side_does_not_know_is_refused_with_a_version_hint():
    data = train_spec().to_dict() | {"model_factory": "include.models.tabular:build_model"}
    with pytest.raises(SpecError, match=r"no field\(s\) \['model_factory'\].*align them"):
        TrainJobSpec.from_dict(data)


def test_storage_secrets_come_from_the_environment_never_from_the_spec(monkeypatch):
    monkeypatch.setenv(spec.COS_SECRET_ENV["secret_key"], "sk-from-env")
    section = StorageSection(cos={"region": "ap-guangzhou", "endpoint_override": "127.0.0.1:9000"})
    options = section.options()
    assert options.secret_key == "sk-from-env" and options.region == "ap-guangzhou"
    assert "sk-from-env" not in section.to_json()


def test_spec_round_trips_through_the_entrypoint():
    payload = {"partition": "2026-11-02", "config": {"lr": 0.001, "columns": ["a", "b"]}}
    command = spec.entrypoint("emr_ray.cluster.jobs.train", payload)
    assert command.startswith("python -m emr_ray.cluster.jobs.train --spec-b64 ")
    assert spec.decode_spec(command.rsplit(" ", 1)[1]) == payload


def test_a_marker_after_a_progress_bar_on_the_same_line_is_found():
    logs = '[Stage 5:>      (0 + 1) / 1]\r          \rEMR_RAY_RESULT {"rows": 3}\n'
    assert spec.parse_marked(logs, spec.RESULT_MARKER) == {"rows": 3}


def test_the_last_marked_line_is_the_result():
    logs = 'noise\nEMR_RAY_RESULT {"a": 1}\nmore\nEMR_RAY_RESULT {"a": 2}\n'
    assert spec.parse_marked(logs, spec.RESULT_MARKER) == {"a": 2}
    assert spec.parse_marked("nothing", spec.ERROR_MARKER) is None


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("include.models.tabular", "not an import path"),
        ("no_such_module_x:f", "Cannot import"),
        ("include.models.tabular:nope", "has no 'nope'"),
    ],  # fmt: skip
)
def test_import_by_path_errors_name_the_path(path, message):
    with pytest.raises(ValueError, match=message):
        spec.import_by_path(path)


@pytest.mark.parametrize(
    ("resources", "use_gpu"),
    [
        (None, False),
        (None, True),
        ({"CPU": 4, "memory": 1e9}, True),
        ({"CPU": 1, "GPU": 2}, True),
        ({"CPU": 2, "GPU": 0}, False),
    ],
)
def test_the_trainer_the_warm_group_and_the_cluster_check_reserve_the_same_per_worker(resources, use_gpu):
    """One resource rule, Ray Train's own: with ``use_gpu`` and nothing else asked a worker holds a GPU
    and no CPU, in the job's trainer, in the warm group's placement bundle and in the cluster check."""
    import ray.train

    from emr_ray.run_request import RunRequest

    scaling = ScalingSpec(num_workers=3, use_gpu=use_gpu, resources_per_worker=resources)
    trainer = ray.train.ScalingConfig(num_workers=3, use_gpu=use_gpu, resources_per_worker=resources)
    per_worker = {k: float(v) for k, v in trainer._resources_per_worker_not_none.items()}
    check = RunRequest(workers=3, resources_per_worker=resources, use_gpu=use_gpu)
    assert scaling.per_worker() == per_worker == check.per_worker  # the warm group reads per_worker()
    assert scaling.cpus == 3 * per_worker.get("CPU", 0.0) == check.training().get("CPU", 0.0)


def test_a_scoring_names_a_version_number_never_an_alias():
    """The batch scoring spec takes the version the operator resolved once: an alias in its place
    would let a promotion mid-run mix two models in one predictions generation."""
    from emr_ray.cluster.spec import MLflowSection, PredictJobSpec

    fields = dict(
        partition="2026-11-05", input_uri="file:///s/tabular/dt=2026-11-05/_generations/g/test",
        output_uri="file:///s/predictions/dt=2026-11-05", model_name="tabular-mlp",
        mlflow=MLflowSection(tracking_uri="http://127.0.0.1:1", experiment_name="e"),
    )  # fmt: skip
    assert PredictJobSpec(**fields, model_version="3").model_version == "3"
    with pytest.raises(
        ValueError, match="model_version='champion' is not a version number; resolve the alias"
    ):
        PredictJobSpec(**fields, model_version="champion")
    with pytest.raises(ValueError, match="num_workers=0: use at least 1"):
        PredictJobSpec(**fields, model_version="3", num_workers=0)
