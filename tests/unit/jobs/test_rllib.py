"""The RLlib job's steps that need no cluster: the spec's checks, the algorithm config, what each
iteration logs, checkpoint housekeeping, the resume rule and the policy it logs."""

from __future__ import annotations

import math

import pytest
from pyarrow import fs as pafs

from emr_ray.cluster.jobs import rllib as job
from emr_ray.cluster.jobs._runtime import JobInputError
from emr_ray.cluster.jobs.train import RunState
from emr_ray.cluster.spec import MLflowSection, RLlibJobSpec, SpecError


def spec_for(**overrides) -> RLlibJobSpec:
    fields = {
        "run_name": "r",
        "storage_path": "file:///tmp/unused-checkpoints",
        "mlflow": MLflowSection(tracking_uri="sqlite:////tmp/unused.db", experiment_name="e"),
        "config": {"lr": 0.001, "train_batch_size_per_learner": 400, "minibatch_size": 100, "num_epochs": 1},
    }
    return RLlibJobSpec(**(fields | overrides))


# -- the spec ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("algorithm", "PPOO", r"algorithm='PPOO' is not an online RLlib algorithm: use one of APPO, DQN"),
        ("algorithm", "BC", "is not an online RLlib algorithm"),
        ("env", "", "env is empty; name a Gymnasium environment id"),
        ("iterations", 0, "iterations=0: train at least 1 iteration"),
        ("num_env_runners", -1, "num_env_runners=-1: use 0"),
        ("checkpoint_every", 0, "checkpoint at least every 1 iteration"),
        ("num_to_keep", 0, "keep at least 1 checkpoint"),
        ("storage_path", "s3a://b/ckpt", "s3a"),
    ],
)
def test_a_spec_that_cannot_run_is_refused_naming_the_field_and_the_fix(field, value, message):
    with pytest.raises((SpecError, ValueError), match=message):
        spec_for(**{field: value})


def test_the_spec_survives_its_json_round_trip():
    spec = spec_for(env_config={"max_episode_steps": 200}, model_config={"fcnet_hiddens": [32]}, seed=3)
    assert RLlibJobSpec.from_dict(spec.to_dict()) == spec


def test_the_fingerprint_changes_with_what_is_trained_and_not_with_where_it_logs():
    spec = spec_for()
    assert job.fingerprint(spec) == job.fingerprint(spec_for(run_name="other", evaluation_episodes=0))
    assert job.fingerprint(spec) != job.fingerprint(spec_for(iterations=21))
    assert job.fingerprint(spec) != job.fingerprint(spec_for(config={"lr": 0.01}))
    assert job.fingerprint(spec) != job.fingerprint(spec_for(seed=1))


# -- configuration -----------------------------------------------------------------------------------
def test_an_unknown_environment_fails_as_input_naming_it_and_the_fix():
    with pytest.raises(
        JobInputError, match=r"env='CartPool-v1' is not a registered Gymnasium environment.*CartPole-v1"
    ):
        job.check_env(spec_for(env="CartPool-v1"))


def test_the_config_carries_the_spec_into_rllibs_new_api_stack():
    algo_config = job.build_config(
        spec_for(num_envs_per_env_runner=4, seed=7, model_config={"fcnet_hiddens": [16]})
    )
    assert type(algo_config).__name__ == "PPOConfig"
    assert algo_config.env == "CartPole-v1" and algo_config.enable_rl_module_and_learner
    assert (algo_config.lr, algo_config.minibatch_size, algo_config.num_epochs) == (0.001, 100, 1)
    assert algo_config.train_batch_size_per_learner == 400
    assert (algo_config.num_env_runners, algo_config.num_envs_per_env_runner, algo_config.seed) == (0, 4, 7)
    assert algo_config.model_config["fcnet_hiddens"] == [16]


def test_a_hyperparameter_the_algorithm_does_not_take_fails_as_input():
    with pytest.raises(
        JobInputError, match=r"config of PPO has a key its training\(\) does not take.*learning_rate"
    ):
        job.build_config(spec_for(config={"learning_rate": 0.1}))


# -- what an iteration logs --------------------------------------------------------------------------
RESULT = {
    "env_runners": {"episode_return_mean": 87.5, "episode_len_mean": 88.0, "num_episodes": 12, "sample": 0.9},
    "learners": {
        "__all_modules__": {"num_env_steps_trained_lifetime": 4000},
        "default_policy": {"policy_loss": -0.05, "vf_loss": 7.3, "entropy": 0.64, "weights_seq_no": 2.0},
        "opponent": {"total_loss": 0.2},
    },
    "time_this_iter_s": 1.5,
    "config": {"lr": 0.001},
}


def test_an_iteration_logs_the_episode_figures_and_the_losses_as_finite_numbers():
    metrics = job.iteration_metrics(
        RESULT | {"env_runners": RESULT["env_runners"] | {"episode_return_max": math.nan}}
    )
    assert metrics == {
        "episode_return_mean": 87.5,
        "episode_len_mean": 88.0,
        "num_episodes": 12.0,
        "time_this_iter_s": 1.5,
        "policy_loss": -0.05,
        "vf_loss": 7.3,
        "entropy": 0.64,
        "opponent.total_loss": 0.2,
    }
    assert (
        job.describe(metrics)
        == "episode_return_mean=87.5 episode_len_mean=88 entropy=0.64 time_this_iter_s=1.5"
    )


# -- checkpoints and the resume rule -----------------------------------------------------------------
def test_only_the_newest_checkpoints_are_kept(tmp_path):
    run_state = RunState(pafs.LocalFileSystem(), str(tmp_path))
    for iteration in (1, 2, 3, 10):
        (tmp_path / job.checkpoint_name(iteration)).mkdir()
    (tmp_path / "_emr_ray_state.json").write_text("{}")
    job.prune_checkpoints(run_state, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "_emr_ray_state.json",
        "checkpoint_000003",
        "checkpoint_000010",
    ]


def test_a_retry_with_the_same_spec_keeps_its_state_and_another_spec_starts_clean(tmp_path):
    spec = spec_for()
    run_state = RunState(pafs.LocalFileSystem(), str(tmp_path / "r"))
    stored = {"fingerprint": job.fingerprint(spec), "mlflow_run_id": "m1", "checkpoint": "checkpoint_000004"}
    run_state.write(stored)
    assert job.resume_state(spec, run_state, job.fingerprint(spec), force=False) == stored
    assert job.resume_state(spec, run_state, job.fingerprint(spec), force=True) == {}
    assert not (tmp_path / "r").exists()
    run_state.write(stored)
    assert job.resume_state(spec, run_state, "another", force=False) == {}


def test_the_result_names_the_last_checkpoint_and_where_training_started(tmp_path):
    spec = spec_for(storage_path=f"file://{tmp_path}", iterations=5)
    run_state = RunState(pafs.LocalFileSystem(), f"{tmp_path}/r")
    state = {
        "mlflow_run_id": "m1",
        "checkpoint": "checkpoint_000005",
        "iteration": 5,
        "metrics": {"episode_return_mean": 200.0},
    }
    result = job.result_of(spec, run_state, state, 3, 12.345, {"eval_episode_return_mean": 190.0})
    assert result.checkpoint_uri == f"file://{tmp_path}/r/checkpoint_000005"
    assert (result.start_iteration, result.iterations_completed, result.train_seconds) == (3, 5, 12.35)
    assert result.final_metrics == {"episode_return_mean": 200.0, "eval_episode_return_mean": 190.0}
    assert type(result).from_dict(result.to_dict()) == result  # the XCom reads back as the same result


# -- the policy --------------------------------------------------------------------------------------
def test_the_greedy_policy_maps_observations_to_valid_actions_and_plays_whole_episodes(tmp_path):
    """An untrained PPO module, saved and loaded as the logged model does it: a batch of
    observations in, one action each out; greedy play ends every episode."""
    import gymnasium
    import torch
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    torch.manual_seed(0)
    env = gymnasium.make("CartPole-v1")
    module = RLModuleSpec(
        module_class=DefaultPPOTorchRLModule,
        observation_space=env.observation_space,
        action_space=env.action_space,
        model_config={"fcnet_hiddens": [8]},
    ).build()
    module.save_to_path(str(tmp_path / "rl_module"))
    policy = job.GreedyPolicy()
    policy.load(str(tmp_path / "rl_module"))

    example = job.observation_example(spec_for(), rows=3)
    actions = policy.predict(None, example)
    assert example.shape == (3, 4) and actions.shape == (3,)
    assert set(actions.tolist()) <= {0, 1}
    returns = job.play(policy, spec_for(env_config={"max_episode_steps": 30}), 2)
    assert len(returns) == 2 and all(1 <= r <= 30 for r in returns)
