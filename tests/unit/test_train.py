"""The public cluster-side API for user code: checkpoints the job can read back, whatever the loop."""

from __future__ import annotations

import torch

from emr_ray.cluster import train as emr_train
from include.models.tabular import build_model


def _trained(config):
    model = build_model(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loss = model(torch.randn(8, 3)).sum()
    loss.backward()
    optimizer.step()
    return model, optimizer


def test_a_saved_state_loads_back_whole(tmp_path):
    config = {"feature_columns": ["a", "b", "c"], "hidden": 4}
    model, optimizer = _trained(config)
    emr_train.save_state(
        str(tmp_path), model=model, optimizer=optimizer, epoch=3, metrics={"epoch": 3, "test_loss": 0.5}
    )
    state = emr_train.load_state(str(tmp_path))
    assert state.epoch == 3 and state.metrics == {"epoch": 3, "test_loss": 0.5}
    assert state.optimizer[
        "state"
    ]  # Adam's moments travel with the checkpoint, so a resume continues exactly
    for key, tensor in model.state_dict().items():
        assert torch.equal(state.model[key], tensor)


def test_the_job_rebuilds_the_trained_model_from_build_model_and_the_checkpoint(tmp_path):
    config = {"feature_columns": ["a", "b", "c"], "hidden": 4}
    model, optimizer = _trained(config)
    emr_train.save_state(str(tmp_path), model=model, optimizer=optimizer, epoch=0, metrics={})
    fresh = emr_train.load_weights(build_model(config), str(tmp_path))
    x = torch.randn(5, 3)
    assert torch.equal(fresh(x), model(x))


def test_a_wrapped_model_is_saved_unwrapped(tmp_path):
    config = {"feature_columns": ["a", "b", "c"], "hidden": 4}
    model, optimizer = _trained(config)

    class Wrapper(torch.nn.Module):  # what DistributedDataParallel looks like to state_dict()
        def __init__(self, module):
            super().__init__()
            self.module = module

    emr_train.save_state(str(tmp_path), model=Wrapper(model), optimizer=None, epoch=1, metrics={})
    assert set(emr_train.load_state(str(tmp_path)).model) == set(model.state_dict())


def test_a_directory_without_metrics_reads_as_none(tmp_path):
    assert emr_train.read_metrics(str(tmp_path)) is None


def test_a_truncated_metrics_or_inputs_file_reads_as_none_and_stays_for_inspection(tmp_path, caplog):
    """Issue 31, item 7: a truncated metrics.json raised ValueError in every retry, force_recompute
    included. Now the checkpoint's weights still load; without its inputs' name it is never resumed."""
    model, optimizer = _trained({"feature_columns": ["a", "b", "c"], "hidden": 4})
    emr_train.save_state(str(tmp_path), model=model, optimizer=optimizer, epoch=2, metrics={"epoch": 2},
                         inputs="fp-1")  # fmt: skip
    for name in (emr_train.METRICS_FILE, emr_train.INPUTS_FILE):
        (tmp_path / name).write_text('{"epoch": 2, "test_lo')  # cut off mid-write
    caplog.set_level("WARNING")
    state = emr_train.load_state(str(tmp_path))
    assert (state.epoch, state.metrics, state.inputs) == (2, {}, None)
    assert "is not readable JSON" in caplog.text and (tmp_path / emr_train.METRICS_FILE).exists()


def test_a_checkpoint_carries_its_inputs_and_is_never_resumed_by_a_run_of_other_inputs(tmp_path):
    """Issue 31, item 6: whatever left a checkpoint in a run's folder (a killed job's warm call that
    wrote on after the folder was cleared), a run resumes only from weights trained on its own inputs."""
    config = {"feature_columns": ["a", "b", "c"], "hidden": 4}
    model, optimizer = _trained(config)
    emr_train.save_state(str(tmp_path), model=model, optimizer=optimizer, epoch=4, metrics={}, inputs="fp-a")
    assert emr_train.load_state(str(tmp_path)).inputs == "fp-a"

    def resumed_by(inputs, directory=tmp_path):
        context = emr_train.WarmGroupContext(0, 1, "cpu", None, str(directory), lambda m, d: None, inputs)
        with emr_train.running_in(context):
            return emr_train.latest_state()

    assert resumed_by("fp-a").epoch == 4
    assert resumed_by("fp-b") is None  # other inputs: a fresh start
    assert resumed_by(None).epoch == 4  # a job that names no inputs (written before they were named)
    (unnamed := tmp_path / "unnamed").mkdir()
    emr_train.save_state(str(unnamed), model=model, optimizer=optimizer, epoch=5, metrics={})
    assert resumed_by("fp-a", unnamed) is None  # a checkpoint that names none cannot vouch for its inputs


def test_ray_trains_loop_runs_with_the_inputs_of_its_plan(tmp_path):
    from emr_ray.cluster.jobs import shards

    seen = []
    loop = emr_train.with_inputs_of_plan(lambda config: seen.append(emr_train.get_context().inputs))
    loop({shards.PLAN_KEY: {"inputs": "fp-a"}})
    loop({})
    assert seen == ["fp-a", None] and emr_train.get_context().inputs is None
