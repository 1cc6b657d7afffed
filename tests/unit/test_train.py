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
