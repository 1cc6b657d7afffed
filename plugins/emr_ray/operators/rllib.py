"""RLlibTrainOperator: reinforcement learning with an RLlib algorithm on a Gymnasium environment, as a Ray job."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from emr_ray.cluster.results import RLlibResult
from emr_ray.cluster.spec import RLlibJobSpec
from emr_ray.identity import TaskIdentity
from emr_ray.operators.mlflow_job import MLflowJobOperator


class RLlibTrainOperator(MLflowJobOperator):
    """Train an RLlib algorithm (new API stack) on a Gymnasium environment in a Ray job; log it to MLflow.

    The job (:mod:`emr_ray.cluster.jobs.rllib`) trains ``iterations`` iterations and saves the whole
    algorithm every ``checkpoint_every`` iterations under
    ``<storage_path>/checkpoints/<dag_id>/<run_id>/<task_id>/<run name>``: an Airflow retry resumes
    from the latest checkpoint into the same MLflow run (``start_iteration`` > 0), and a rerun of a
    finished training with the same settings returns its stored result. Each iteration's metrics
    (``episode_return_mean``, ``episode_len_mean``, the learner's losses, ...) go to MLflow once, with
    the iteration as step, and one line per iteration to the task log. The policy is logged as the
    run's ``model`` (MLflow pyfunc: a batch of observations in, greedy actions out) and plays
    ``evaluation_episodes`` greedy episodes (``eval_episode_return_mean``).

    The learner runs in the job's driver, which reserves ``entrypoint_num_cpus`` (default 1); with
    ``num_env_runners`` > 0, each EnvRunner actor takes 1 more CPU of the cluster. The XCom:
    ``mlflow_run_id``, ``checkpoint_uri``, ``final_metrics``, ``iterations_completed``,
    ``start_iteration``, ``train_seconds``.

    :param env: Gymnasium environment id, e.g. ``CartPole-v1`` (templated).
    :param algorithm: RLlib algorithm: PPO, APPO, IMPALA, DQN or SAC (templated).
    :param env_config: keyword arguments of ``gymnasium.make`` (templated).
    :param config: ``AlgorithmConfig.training()`` keywords, e.g. ``lr``, ``train_batch_size_per_learner``,
        ``minibatch_size``, ``num_epochs`` (templated).
    :param model_config: the RLModule's model config, e.g. ``{"fcnet_hiddens": [64, 64]}`` (templated).
    :param iterations: training iterations (templated).
    :param storage_path: root for checkpoints (``file://``, ``cos://``, ``hdfs://``; templated).
    :param num_env_runners: EnvRunner actors that sample; 0 samples in the job's driver (templated).
    :param num_envs_per_env_runner: vectorised environments per sampler (templated).
    :param checkpoint_every: iterations between checkpoints (the last one is always checkpointed).
    :param num_to_keep: checkpoints kept.
    :param seed: RLlib's seed, for repeatable runs (templated).
    :param evaluation_episodes: greedy episodes the final policy plays; 0 plays none.

    MLflow (``mlflow_conn_id``, ``experiment_name``, ``run_tags``; the login only as secret variables, checked
    before submitting): :class:`~emr_ray.operators.mlflow_job.MLflowJobOperator`.
    """

    template_fields: Sequence[str] = (
        *MLflowJobOperator.template_fields,
        "algorithm",
        "env",
        "env_config",
        "config",
        "model_config",
        "iterations",
        "storage_path",
        "num_env_runners",
        "num_envs_per_env_runner",
        "seed",
    )
    template_fields_renderers = {
        **MLflowJobOperator.template_fields_renderers,
        "config": "json",
        "env_config": "json",
        "model_config": "json",
    }
    job_module = "emr_ray.cluster.jobs.rllib"
    result_type = RLlibResult
    ui_color = "#e3f0e8"

    def __init__(
        self,
        *,
        env: str,
        storage_path: str,
        algorithm: str = "PPO",
        env_config: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        model_config: dict[str, Any] | None = None,
        iterations: int | str = 20,
        num_env_runners: int | str = 0,
        num_envs_per_env_runner: int | str = 1,
        checkpoint_every: int = 1,
        num_to_keep: int = 2,
        seed: int | str | None = None,
        evaluation_episodes: int = 10,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("entrypoint_num_cpus", 1)  # the learner works in the driver
        super().__init__(**kwargs)
        self.env = env
        self.storage_path = storage_path
        self.algorithm = algorithm
        self.env_config = env_config or {}
        self.config = config or {}
        self.model_config = model_config or {}
        self.iterations = iterations
        self.num_env_runners = num_env_runners
        self.num_envs_per_env_runner = num_envs_per_env_runner
        self.checkpoint_every = checkpoint_every
        self.num_to_keep = num_to_keep
        self.seed = seed
        self.evaluation_episodes = evaluation_episodes

    def build_spec(self, context: Any, identity: TaskIdentity) -> RLlibJobSpec:
        self.check_mlflow_access()
        seed = None if str(self.seed).strip() in ("", "None") else _integer("seed", self.seed)
        return RLlibJobSpec(
            run_name=identity.run_name,
            storage_path=identity.checkpoint_path(self.storage_path),
            mlflow=self.mlflow_section(context, identity),
            algorithm=str(self.algorithm),
            env=str(self.env),
            env_config=_natives(self.env_config),
            config=_natives(self.config),
            model_config=_natives(self.model_config),
            iterations=_integer("iterations", self.iterations),
            num_env_runners=_integer("num_env_runners", self.num_env_runners),
            num_envs_per_env_runner=_integer("num_envs_per_env_runner", self.num_envs_per_env_runner),
            checkpoint_every=int(self.checkpoint_every),
            num_to_keep=int(self.num_to_keep),
            seed=seed,
            evaluation_episodes=int(self.evaluation_episodes),
        )

    def log_outcome(self, result: RLlibResult) -> None:
        final = result.final_metrics
        for metric in ("episode_return_mean", "eval_episode_return_mean"):
            if metric in final:
                self.log.info("Final %s: %.2f", metric, final[metric])
        self.log.info(
            "Trained iterations %d to %d; MLflow run %s, checkpoint %s",
            result.start_iteration + 1,
            result.iterations_completed,
            result.mlflow_run_id,
            result.checkpoint_uri,
        )


def _natives(values: Mapping[str, Any]) -> dict[str, Any]:
    """Rendered templates as the values they stand for: ``"0.001"`` is 0.001, ``"True"`` is True,
    ``"[64, 64]"`` a list; other strings stay strings (RLlib takes numbers, not their text)."""
    return {key: _native(value) for key, value in dict(values).items()}


def _native(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[text]
    try:
        parsed = json.loads(text)
    except ValueError:
        return value
    return parsed if isinstance(parsed, (int, float, list, dict)) else value


def _integer(name: str, value: Any) -> int:
    """A rendered integer argument; anything else fails naming the argument."""
    try:
        return int(value)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"{name}={value!r} is not an integer; pass a number or a template that renders one."
        ) from e
