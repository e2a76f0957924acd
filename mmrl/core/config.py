"""Typed configuration: dataclasses, YAML recipes and dotted command-line overrides.

A recipe is a YAML file whose keys mirror :class:`TrainConfig`. Validation happens once, before
any work: an unknown key or a value of the wrong type raises :class:`ConfigError` naming the
valid keys or the expected type. ``task.args`` and ``policy.args`` are validated against the
config dataclass that the named task / policy registered.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import importlib.util
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from mmrl.algos import (ADVANTAGE_ESTIMATORS, AGGREGATIONS, GAUSSIAN_KL_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES,
                        SHAPING_HOOKS)
from mmrl.algos.config import AlgoConfig
from mmrl.algos.offpolicy import LEARNERS_WITHOUT_LOGPROB, OFFPOLICY_LEARNERS
from mmrl.algos.variants import (LOSS_TERMS, PROMPT_SELECTORS, REHEARSAL_DIVERGENCES, ROLLOUT_STRATEGIES,
                                 TEMPERATURE_SCHEDULES, algo_needs, validate_extra)
from mmrl.core.contracts import DiscreteDecisionConfig, LogprobFreeConfig
from mmrl.core.paths import recipes_dir
from mmrl.core.typed import ConfigError, build, to_dict


@dataclass(frozen=True)
class ComponentConfig:
    name: str
    """Registered id (tasks: "family/name-vK"; policies: a policy name)."""
    args: Any = field(default_factory=dict)
    """Arguments of the component, validated against its registered config dataclass."""


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 16
    """Examples (prompts / initial states) per training step, across all processes."""
    group_size: int = 8
    """Samples per example (GRPO's G)."""
    temperature: float = 1.0
    """Sampling temperature; log-probs are those of the tempered distribution."""
    top_p: float = 1.0
    """Nucleus sampling; log-probs stay those of the tempered (untruncated) distribution."""
    max_new_tokens: int = 32
    """Cap on decisions per sample (tokens for text policies)."""
    reference_rows: int = 0
    """> 0: this many rows of each group are the task's reference output (``task.reference_output``),
    scored by the policy (``rollout_from_outputs``), and ``group_size − reference_rows`` are sampled
    (ViSurf, arXiv 2510.10606: supervision injected as a group member). 0: off."""
    param_noise_std: float = 0.0
    """σ > 0: sample training rollouts from the policy with N(0, σ²) noise added to its trainable
    parameters (PSN-RLVR, arXiv 2602.02555); needs ``trainer.recompute_logp_old`` and ``algo.tis_cap``
    (truncated IS back to the unperturbed policy). 0: off."""

    seed_per_example: bool = False
    """Sample each example's group with a seed of its own, derived from the run seed, the step, the round
    and the example's position in the global batch: any number of processes then draws the same rollouts,
    and a 2-process run equals the 1-process run up to float reduction order. Off (default): one seed per
    process and round, sampling all of a process's examples in one batch (faster)."""

    keep_successes: float | None = None
    """Keep every training row whose verifiable score is at least this (pickled per step under the run's
    ``kept/``): the data of a later ``rft`` stage (RLoop's expert set of successful trajectories). None: off."""

    split: str = "train"
    """Task split the training rollouts draw their examples from. Warm starts, offline demonstrations and the
    hooks' own draws (demonstrations, probes) stay on ``train``; a held-out split here trains in a shifted
    domain (PRFT's target domain, e.g. ``ood_color`` of ``robot/reach-v0``), checked against the task before
    training starts."""

    log_episodes: bool = False
    """Write every step's rollouts as episode files (``<run>/episodes/step_<n>.rank<r>.npz``, the format of
    mmrl/algos/offpolicy/episodes.py): offline data for a later off-policy run (``algo.extra.wsrl.offline_files``).
    Continuous-action embodied policies only."""

    @property
    def samples_per_group(self) -> int:
        """Rows sampled per example: ``group_size`` less the injected ``reference_rows``."""
        return self.group_size - self.reference_rows


@dataclass(frozen=True)
class TrainerConfig:
    seed: int = 0
    """Seeds data order, sampling and initialisation; the same seed gives the same run on CPU."""
    steps: int = 100
    """Training steps (each: one rollout batch, then ``ppo_epochs`` passes over it)."""
    lr: float = 3e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay (DAPO uses 0.1)."""
    warmup_steps: int = 0
    """Linear warm-up, in optimizer steps."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Decay after warm-up, over all optimizer steps of the run."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    minibatches: int = 1
    """Optimizer steps per pass (the batch is split into this many minibatches of whole groups)."""
    micro_batch_size: int = 64
    """Rows per forward/backward (gradient accumulation); the update does not depend on it."""
    grad_clip: float = 1.0
    """Max global gradient norm; steps with a non-finite norm are skipped and logged."""
    mixed_precision: Literal["no", "bf16", "fp16"] | None = None
    """accelerate mixed precision for the re-scoring forward; null leaves it to the
    ``accelerate launch`` config (``no`` when run without one)."""
    ref_model: Literal["copy", "adapter_disabled", "none"] = "copy"
    """Reference policy for the KL term and ``policy/kl_ref``: a frozen copy of the initial
    policy; the policy itself with its LoRA adapters disabled (no second copy in memory); or
    none (then ``algo.kl_coef`` must be 0 and ``policy/kl_ref`` is null)."""
    recompute_logp_old: bool = False
    """Re-compute π_old with the trainer's forward before the update (needed for truncated IS
    when a rollout engine such as vLLM samples); logs ``rollout/logp_diff``."""
    max_skipped_frac: float = 0.5
    """Stop with an error when more than this share of the optimizer updates so far were skipped
    (a non-finite gradient: diverged log-probs, a NaN loss), checked from step 4 on; 1 never stops."""
    threads: int | None = 1
    """torch CPU math threads for the run (printed at the start). 1 suits tiny models on a shared
    machine (torch's default, one per core, spins against other processes); null keeps torch's
    default (or ``OMP_NUM_THREADS``)."""


@dataclass(frozen=True)
class EvalConfig:
    every: int = 0
    """Evaluate every this many steps (0: only before training and at the end)."""
    num_examples: int = 128
    """Held-out examples, drawn once with ``seed``."""
    split: str = "test"
    """Task split to evaluate on."""
    temperature: float = 0.0
    """0 evaluates greedily."""
    seed: int = 1234
    """Seed of the held-out set (independent of the training seed)."""
    pass_k: int = 0
    """> 0: also draw this many samples per held-out example at ``pass_temperature`` and log
    ``eval/pass@k`` (share of examples with at least one sample scoring ≥ ``pass_threshold``)
    and ``eval/mean@k`` (mean score of the samples). 0: off (Chen et al. 2021, pass@k with n = k)."""
    pass_temperature: float = 1.0
    """Sampling temperature of the pass@k samples (1.0: the policy's own distribution)."""
    pass_threshold: float = 1.0
    """A sample passes when its verifiable score is at least this (1.0: a fully correct output)."""
    extra_splits: tuple[str, ...] = ()
    """More task splits (e.g. out-of-distribution ones) evaluated at the same times with the same
    settings, ``num_examples`` each, logged as ``eval/<split>/<metric>`` (e.g.
    ``eval/ood_color/success_rate``); ``split`` stays ``eval/<metric>``."""


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 0
    """Save every this many steps (0: only at the end)."""
    keep_last: int = 2
    """Older checkpoints are deleted once a newer one is written (0 keeps all)."""
    best_metric: str | None = None
    """Keep the best policy by this evaluation metric, e.g. ``eval/val/success_rate`` (a validation split in
    ``eval.extra_splits``, so the split results are reported on never picks the checkpoint): every evaluation
    that beats all earlier ones (the warm start's, at step 0, included; a tie keeps the earlier) writes the
    policy to ``OUT/checkpoints/best/``, a folder ``--model`` / ``--after`` / ``warm_start.init_from`` load
    (``best.json``: its step and value). None: off."""
    best_mode: Literal["max", "min"] = "max"
    """Whether a larger (``max``) or a smaller (``min``) ``best_metric`` is better."""


@dataclass(frozen=True)
class WarmStartConfig:
    sft_steps: int = 0
    """Supervised steps on the task's reference outputs before RL (0: none)."""
    lr: float = 3e-3
    batch_size: int = 64
    seed: int = 0
    cache: bool = True
    """Reuse a warm start built before with the same task, policy and warm-start config."""
    vision_steps: int = 0
    """> 0: before SFT, pretrain the policy's vision encoder this many AdamW steps on the task's
    image (or video) labels (a linear head on pooled vision features), the CPU analogue of a VLM's pretrained
    ViT. The task must define ``vision_classes`` and ``vision_label`` (mmrl.core.warm_start.VisionLabels)."""
    vision_lr: float = 3e-3
    """Learning rate of that vision pretraining (used only when ``vision_steps > 0``)."""
    init_from: str | None = None
    """A saved policy folder (a run's ``checkpoints/step_N/policy``, an ``mmrl sft`` output) whose weights the
    policy starts from, instead of a warm start (``sft_steps`` must be 0). Multi-stage recipes set it to
    hand one stage's policy to the next. None: the policy's own initialisation."""
    hint_fraction: float = 0.0
    """Share of each SFT batch's rows whose prompt carries the task's hint (``task.hinted(example)``, e.g.
    ``data/rows-v0``'s ``task.args.hint_template``), with the same target: the warm start then learns to use hints,
    as a hint-following SFT model would, so Guide's hinted redraws (``algo.guide``) can succeed where plain ones
    fail. ``round(hint_fraction · rows)`` rows per batch, chosen by a generator of their own so that the rows
    drawn do not change. 0: no hints (the warm start as before). Needs a task with hints."""


@dataclass(frozen=True)
class WandbConfig:
    """Weights & Biases settings (``log.wandb``); ``pip install wandb`` (or ``mmrl[track]``)."""

    project: str = "mmrl"
    """W&B project."""
    entity: str | None = None
    """W&B team or user; null: the logged-in account's default."""
    name: str | None = None
    """Run name; null: the run folder's name."""
    mode: Literal["offline", "online"] = "offline"
    """offline: no network, the run is written under ``OUT/wandb/`` (upload it later with
    ``wandb sync OUT/wandb/offline-run-*``); online: streamed to the W&B server (needs ``wandb login``)."""


@dataclass(frozen=True)
class TrackioConfig:
    """Trackio settings (``log.trackio``); ``pip install trackio`` (or ``mmrl[track]``)."""

    project: str = "mmrl"
    """Trackio project: one local SQLite database, shared by its runs (``trackio show --project NAME``)."""
    name: str | None = None
    """Run name; null: the run folder's name."""
    space_id: str | None = None
    """null: log only to trackio's local store, no network (``$TRACKIO_DIR``, default
    ``~/.cache/huggingface/trackio``); ``user/space``: also to that Hugging Face Space (needs ``hf auth login``)."""


@dataclass(frozen=True)
class LogConfig:
    tensorboard: bool = True
    """Write TensorBoard events to ``OUT/tb`` when tensorboard is installed."""
    progress: bool = True
    """Progress bar with the live reward on the console."""
    num_samples: int = 8
    """Held-out outputs per evaluated split written to ``OUT/samples.jsonl`` at each evaluation (prompt,
    completion, reward, components), and sent as a table to the trackers that are on; 0: none."""
    wandb: bool | WandbConfig = False
    """Also log metrics and sample tables to Weights & Biases: false, true (the defaults of
    :class:`WandbConfig`: offline) or a mapping of its fields. Only the main process logs."""
    trackio: bool | TrackioConfig = False
    """Also log metrics and sample tables to Trackio: false, true (the defaults of :class:`TrackioConfig`:
    the local store) or a mapping of its fields. Only the main process logs."""
    expected: dict = field(default_factory=dict)
    """Documented result ranges, ``{metric: [low, high]}`` (e.g. ``eval/accuracy: [0.78, 0.86]``, the
    range over seeds and thread counts in docs/results.md): at the end, ``mmrl train`` prints the last
    evaluation of each against its range."""

    @property
    def wandb_settings(self) -> WandbConfig | None:
        """``log.wandb`` as settings (``true``: the defaults), or None when off."""
        if self.wandb is True:
            return WandbConfig()
        return self.wandb if isinstance(self.wandb, WandbConfig) else None

    @property
    def trackio_settings(self) -> TrackioConfig | None:
        """``log.trackio`` as settings (``true``: the defaults), or None when off."""
        if self.trackio is True:
            return TrackioConfig()
        return self.trackio if isinstance(self.trackio, TrackioConfig) else None


@dataclass(frozen=True)
class StageConfig:
    """One stage of a multi-stage recipe (``stages:``; docs/programs.md)."""

    name: str
    """Unique in the recipe: letters, digits, ``_`` and ``-``; the stage's folder is ``stages/<NN>_<name>``."""
    kind: Literal["train", "sft", "rft", "eval"] = "train"
    """``train``: the RL loop; ``sft``: supervised steps on the task's reference outputs; ``rft``:
    rejection-sampling fine-tuning on rows kept by earlier train stages (``rollout.keep_successes``);
    ``eval``: held-out evaluation only. sft / rft take their steps, lr, batch size and seed from
    ``warm_start``."""
    init: str = "previous"
    """The policy the stage starts from: ``previous`` (the last stage's result; the recipe's warm start for
    the first stage), ``<stage>`` (that stage's result) or ``<stage>@start`` (the policy that stage started
    from, e.g. RLoop's RFT refines the RL stage's initial policy)."""
    data: tuple[str, ...] = ()
    """rft only: the train stages whose kept rows form the fine-tuning set."""
    overrides: dict = field(default_factory=dict)
    """Dotted keys (``trainer.steps: 30``) applied to the recipe for this stage."""


@dataclass(frozen=True)
class TrainConfig:
    task: ComponentConfig
    policy: ComponentConfig
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    log: LogConfig = field(default_factory=LogConfig)
    stages: tuple[StageConfig, ...] = ()
    """A training program: stages run in order in one run folder (:mod:`mmrl.core.program`), each this
    config with the stage's overrides. Empty: one training run."""
    imports: tuple[str, ...] = ()
    """Modules (``my_package.tasks``) or ``.py`` files (relative to the recipe) imported before the recipe's
    names are looked up, so that they can register tasks, policies, verifiers (docs/plugins.md); the
    resolved config lists files by absolute path, and ``--import`` adds to the list."""


# ------------------------------------------------------------------------------------------------
# Ranges of the numeric fields


@dataclass(frozen=True)
class Range:
    """An interval of allowed values; ``None`` ends are unbounded. Every value must also be finite."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    """The low end itself is excluded (``> low``)."""
    high_open: bool = False

    def contains(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        low = None if self.low is None else f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is None:
            return low or "finite"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return (f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}")


AT_LEAST_0, AT_LEAST_1, POSITIVE, UNIT = Range(0), Range(1), Range(0, low_open=True), Range(0, 1)

# Every numeric field of the configs below and of AlgoConfig, by dotted path (a None value of an
# optional field is always allowed: it switches the feature off). tests/test_config.py checks that
# none is missing.
FIELD_RANGES: dict[str, Range] = {
    "rollout.prompts_per_step": AT_LEAST_1, "rollout.group_size": AT_LEAST_1,
    "rollout.temperature": POSITIVE,  # the tempered distribution (and its log-probs) needs T > 0
    "rollout.top_p": Range(0, 1, low_open=True), "rollout.max_new_tokens": AT_LEAST_1,
    "rollout.reference_rows": AT_LEAST_0, "rollout.param_noise_std": AT_LEAST_0,
    "trainer.seed": AT_LEAST_0, "trainer.steps": AT_LEAST_1, "trainer.lr": POSITIVE,
    "trainer.weight_decay": AT_LEAST_0, "trainer.warmup_steps": AT_LEAST_0, "trainer.ppo_epochs": AT_LEAST_1,
    "trainer.minibatches": AT_LEAST_1, "trainer.micro_batch_size": AT_LEAST_1, "trainer.grad_clip": POSITIVE,
    "trainer.max_skipped_frac": UNIT, "trainer.threads": AT_LEAST_1,
    "log.num_samples": AT_LEAST_0,
    "eval.every": AT_LEAST_0, "eval.num_examples": AT_LEAST_1, "eval.temperature": AT_LEAST_0,
    "eval.seed": AT_LEAST_0, "eval.pass_k": AT_LEAST_0, "eval.pass_temperature": POSITIVE,
    "eval.pass_threshold": Range(),
    "checkpoint.every": AT_LEAST_0, "checkpoint.keep_last": AT_LEAST_0,
    "warm_start.sft_steps": AT_LEAST_0, "warm_start.lr": POSITIVE, "warm_start.batch_size": AT_LEAST_1,
    "warm_start.seed": AT_LEAST_0, "rollout.keep_successes": Range(), "warm_start.vision_steps": AT_LEAST_0, "warm_start.vision_lr": POSITIVE,
    "warm_start.hint_fraction": UNIT,
    "algo.adv_eps": POSITIVE,  # 0 divides by a zero group std
    "algo.gamma": UNIT, "algo.lam": UNIT, "algo.kl_in_reward_coef": AT_LEAST_0,
    "algo.clip_low": AT_LEAST_0, "algo.clip_high": AT_LEAST_0,
    "algo.dual_clip_c": Range(1, low_open=True),  # Ye et al. 2020: c > 1
    "algo.tis_cap": POSITIVE, "algo.loss_agg_norm_len": AT_LEAST_1,
    "algo.kl_coef": AT_LEAST_0, "algo.entropy_coef": AT_LEAST_0, "algo.bc_coef": AT_LEAST_0,
    "algo.bc_kl_threshold": POSITIVE, "algo.bc_batch_size": AT_LEAST_1, "algo.value_coef": AT_LEAST_0,
    "algo.value_clip": POSITIVE, "algo.value_huber_delta": POSITIVE, "algo.adv_clip": POSITIVE,
    "algo.max_gen_rounds": AT_LEAST_1, "algo.feedback_turns": AT_LEAST_0, "algo.tool_turns": AT_LEAST_0, "algo.overlong_max_len": AT_LEAST_1, "algo.overlong_buffer": AT_LEAST_0,
    "algo.overlong_factor": AT_LEAST_0,
}


def range_problems(cfg: TrainConfig) -> list[str]:
    """``<field> must be <range>, got <value>`` for every numeric field outside its :data:`FIELD_RANGES`."""
    problems = []
    for key, allowed in FIELD_RANGES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value is not None and not allowed.contains(value):
            problems.append(f"{key} must be {allowed}, got {value}")
    return problems


# Recipes and overrides

def list_recipes() -> list[str]:
    root = recipes_dir()
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.glob("*/*.yaml")
                  if p.parent.name not in ("accelerate", "sweeps"))


def resolve_recipe(recipe: str) -> Path:
    """A recipe path, or a name like ``sanity/tiny_cpu`` looked up in the recipes folder."""
    path = Path(recipe)
    if path.is_file():
        return path
    name = recipe.removesuffix(".yaml").removeprefix("configs/")
    named = recipes_dir() / f"{name}.yaml"
    if named.is_file():
        return named
    names = list_recipes()
    close = difflib.get_close_matches(name, names, n=3)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise ConfigError(f"no recipe {recipe!r}: not a file, and not a recipe name.{hint} "
                      f"Recipes: {', '.join(names)}")


def load_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config sections, got {type(data).__name__}")
    return data


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML: 1e-5, true, [a, b], null)."""
    data = to_dict(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: value is not valid YAML: {err}") from None
        set_dotted(data, key, value, f"override {item!r}")
    return data


def set_dotted(data: dict, key: str, value: Any, what: str) -> None:
    """``data[a][b][c] = value`` for ``key`` ``a.b.c``, creating sections as needed (in place)."""
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{what}: {part!r} is not a section")
    node[parts[-1]] = value


def read_recipe(path: Path) -> dict:
    """A recipe (or a run's ``config.yaml``) as a mapping, with the ``.py`` files of its ``imports`` made
    absolute: they are relative to the YAML file that names them."""
    from mmrl.core.registry import absolute_plugin

    data = load_yaml(path)
    if isinstance(data.get("imports"), list):  # any other type fails in build() with a typed error
        data["imports"] = [absolute_plugin(item, path.parent) if isinstance(item, str) else item
                           for item in data["imports"]]
    return data


def load_config(recipe: str, overrides: list[str] = (), imports: list[str] = ()) -> TrainConfig:
    """Recipe + overrides → a validated :class:`TrainConfig` (task/policy args typed too). ``imports``
    (``--import``: module names, ``.py`` files relative to the working directory) join the recipe's."""
    from mmrl.core.registry import absolute_plugin

    data = apply_overrides(read_recipe(resolve_recipe(recipe)), list(overrides))
    named = data.setdefault("imports", [])
    if isinstance(named, list):  # any other type fails in build() with a typed error
        named += [item for item in (absolute_plugin(spec, Path.cwd()) for spec in imports) if item not in named]
    return validate(build(TrainConfig, data))


def validate(cfg: TrainConfig) -> TrainConfig:
    """Import the recipe's plugins; resolve registered names and component args; check cross-field constraints."""
    from mmrl.core.registry import POLICIES, TASKS, import_plugins

    import_plugins(cfg.imports, "imports:")
    task_spec, policy_spec = _lookup(TASKS, cfg.task.name), _lookup(POLICIES, cfg.policy.name)
    task_args = _component_args(task_spec.config, cfg.task.args, "task.args")
    policy_args = _component_args(policy_spec.config, cfg.policy.args, "policy.args")
    a = cfg.algo
    for registry, name in ((ADVANTAGE_ESTIMATORS, a.advantage), (POLICY_LOSSES, a.policy_loss),
                           (AGGREGATIONS, a.loss_agg)):
        _lookup(registry, name)
    if a.kl_estimator not in GAUSSIAN_KL_ESTIMATORS:  # closed-form KLs of Gaussian decisions (Flow-GRPO)
        _lookup(KL_ESTIMATORS, a.kl_estimator)
    for hook in a.shaping:
        _lookup(SHAPING_HOOKS, hook)
    _lookup(ROLLOUT_STRATEGIES, a.rollout_strategy)
    for term in a.loss_terms:
        _lookup(LOSS_TERMS, term)
    _lookup(TEMPERATURE_SCHEDULES, a.temperature_schedule)
    if a.prompt_selection != "uniform":
        _lookup(PROMPT_SELECTORS, a.prompt_selection)
    if a.rehearsal_divergence is not None:
        _lookup(REHEARSAL_DIVERGENCES, a.rehearsal_divergence)
    validate_extra(a)  # algo.extra.<variant> sections: typed, unknown keys rejected
    problems = range_problems(cfg)
    for key, bounds in cfg.log.expected.items():
        if not (isinstance(bounds, (list, tuple)) and len(bounds) == 2
                and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds) and bounds[0] <= bounds[1]):
            problems.append(f"log.expected.{key} must be [low, high] with low <= high, got {bounds!r}")
    if a.rollout_strategy != "plain" and a.dynamic_sampling:
        problems.append(f"algo.rollout_strategy: {a.rollout_strategy} and algo.dynamic_sampling both choose the "
                        f"rows of a step: use one of them")
    if "ref_logp" in algo_needs(a) and cfg.trainer.ref_model == "none":
        problems.append(f"the selected variants {sorted(n for n in (a.advantage, *a.shaping))} need reference "
                        f"log-probs: trainer.ref_model: copy (or adapter_disabled)")
    if "whole_groups" in algo_needs(a) and (cfg.trainer.micro_batch_size % cfg.rollout.group_size
                                            or cfg.rollout.reference_rows or a.rollout_strategy != "plain"):
        problems.append(f"algo.loss_terms {list(a.loss_terms)} compare each row with its whole group: "
                        f"trainer.micro_batch_size ({cfg.trainer.micro_batch_size}) must be a multiple of "
                        f"rollout.group_size ({cfg.rollout.group_size}), without rollout.reference_rows or a "
                        f"rollout strategy (they change group sizes)")
    if a.policy_loss == "none" and not a.loss_terms and a.offpolicy is None:
        problems.append("algo.policy_loss: none leaves no objective: name the objective in algo.loss_terms "
                        "(e.g. [pacs] or [frpo]) or an off-policy learner in algo.offpolicy (e.g. wsrl)")
    if a.offpolicy is not None:
        _lookup(OFFPOLICY_LEARNERS, a.offpolicy)
        if a.policy_loss != "none":
            problems.append(f"algo.offpolicy: {a.offpolicy} trains the policy with its own actor loss: set "
                            f"algo.policy_loss: none (got {a.policy_loss})")
        discrete = policy_args.discrete_decisions() if isinstance(policy_args, DiscreteDecisionConfig) else None
        if discrete is not None:
            problems.append(f"{discrete}: algo.offpolicy: {a.offpolicy} needs continuous actions (a Q over them, a "
                            f"reparameterised actor or an action edit); set policy.args.action_head: gaussian (or "
                            f"consistency or flow)")
    if isinstance(policy_args, LogprobFreeConfig):
        problems += logprob_free_problems(cfg, policy_args.decisions_without_logprob())
    if not 0 <= cfg.rollout.reference_rows < cfg.rollout.group_size:
        problems.append(f"rollout.reference_rows must be in 0..group_size − 1 ({cfg.rollout.group_size - 1}), "
                        f"got {cfg.rollout.reference_rows}: at least one row per group is sampled")
    if cfg.rollout.param_noise_std > 0 and (a.tis_cap is None or not cfg.trainer.recompute_logp_old):
        problems.append("rollout.param_noise_std > 0 (PSN) trains on rollouts of perturbed weights: set "
                        "trainer.recompute_logp_old: true and algo.tis_cap (e.g. 2.0) for truncated IS")
    for key, settings in (("wandb", cfg.log.wandb_settings), ("trackio", cfg.log.trackio_settings)):
        if settings is not None and importlib.util.find_spec(key) is None:
            problems.append(f"log.{key} needs `pip install {key}` (or `pip install 'mmrl[track]'`)")
    if a.bc_coef > 0 and cfg.trainer.ref_model == "none":
        problems.append("algo.bc_coef > 0 gates the BC regulariser by the KL to a reference: set "
                        "trainer.ref_model: copy (or adapter_disabled); algo.kl_coef may stay 0")
    if a.bc_coef > 0 and cfg.warm_start.sft_steps <= 0:
        problems.append("algo.bc_coef > 0 regularises toward the warm start's own examples (VLA-RFT reuses the "
                        "SFT data): it needs warm_start.sft_steps > 0")
    best = cfg.checkpoint.best_metric
    if best is not None and not best.startswith("eval/"):
        problems.append(f"checkpoint.best_metric must be an evaluation metric (eval/...), got {best!r}")
    if a.kl_coef > 0 and cfg.trainer.ref_model == "none":
        problems.append("algo.kl_coef > 0 needs a reference: trainer.ref_model: copy (or adapter_disabled)")
    if a.kl_in_reward_coef > 0 and cfg.trainer.ref_model == "none":
        problems.append("algo.kl_in_reward_coef > 0 needs a reference: trainer.ref_model: copy (or adapter_disabled)")
    if cfg.trainer.ref_model == "adapter_disabled" and cfg.warm_start.sft_steps > 0:
        problems.append("trainer.ref_model: adapter_disabled would make the pre-warm-start base the reference; "
                        "use trainer.ref_model: copy with a warm start")
    if a.tool_turns and a.feedback_turns:
        problems.append("algo.tool_turns and algo.feedback_turns both add later turns to an episode: use one of them")
    if a.guide and cfg.trainer.recompute_logp_old:
        problems.append("algo.guide trains hinted rows with π_old(y | x, hint) as π_old: trainer.recompute_logp_old "
                        "would replace it with π_old(y | x) and undo the correction")
    for flag, what in (("ampo", "teacher rows with π_old = 1"), ("eapo", "replayed rows with their stored π_old"),
                       ("rorecomp", "compensation rows with their stored π_old"),
                       ("rollout_bandit", "reused historical rows with their stored π_old"),
                       ("npo", "guide checkpoint rows with π_old = π_guide")):
        if getattr(a, flag) and cfg.trainer.recompute_logp_old:
            problems.append(f"algo.{flag} trains {what}: trainer.recompute_logp_old would replace it with the "
                            f"current policy's and undo the correction")
    row_inputs = algo_needs(a) & {"prompt_history", "output_classes", "teacher_shift"}
    for flag in ("rorecomp", "rollout_bandit"):
        if getattr(a, flag) and row_inputs:
            problems.append(f"algo.{flag} chooses and adds a step's rows after the per-row inputs "
                            f"{sorted(row_inputs)} of the selected estimator were attached: use one of them")
        if getattr(a, flag) and a.temperature_schedule != "fixed":
            problems.append(f"algo.{flag} stores rows with their log-probs at rollout.temperature: a per-prompt "
                            f"temperature schedule ({a.temperature_schedule}) would give them the wrong π_old")
    if a.rorecomp and a.rollout_bandit:
        problems.append("algo.rorecomp and algo.rollout_bandit both choose the rows a step trains: use one of them")
    if a.tis_cap is not None and not cfg.trainer.recompute_logp_old:
        problems.append("algo.tis_cap needs trainer.recompute_logp_old: true (else π_old is the behaviour policy)")
    if a.dynamic_sampling and cfg.rollout.group_size < 2:
        problems.append("algo.dynamic_sampling needs rollout.group_size >= 2")
    if a.overlong_max_len is not None and not 0 < a.overlong_buffer <= a.overlong_max_len:
        problems.append("algo.overlong_buffer must be in 1..algo.overlong_max_len")
    if cfg.trainer.minibatches >= 1 and cfg.rollout.prompts_per_step % cfg.trainer.minibatches:
        problems.append(f"rollout.prompts_per_step ({cfg.rollout.prompts_per_step}) must be divisible by "
                        f"trainer.minibatches ({cfg.trainer.minibatches}): minibatches hold whole groups")
    if cfg.warm_start.init_from is not None and cfg.warm_start.sft_steps > 0:
        problems.append("warm_start.init_from starts from saved weights: set warm_start.sft_steps: 0 (for SFT on "
                        "top of them, use a multi-stage recipe's sft stage)")
    if cfg.warm_start.hint_fraction > 0 and cfg.warm_start.sft_steps == 0:
        problems.append("warm_start.hint_fraction hints rows of the SFT warm start: it needs warm_start.sft_steps > 0 "
                        "(or set hint_fraction: 0)")
    problems += stage_problems(cfg.stages)
    if problems:
        raise ConfigError("invalid config: " + "; ".join(problems))
    return dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, args=task_args),
                               policy=dataclasses.replace(cfg.policy, args=policy_args))


def logprob_free_problems(cfg: TrainConfig, reason: str | None) -> list[str]:
    """What a recipe asks of a policy without log-probabilities (``reason`` names why; None: it has them)
    that cannot be computed: anything but an off-policy learner that needs no density."""
    if reason is None:
        return []
    a, problems = cfg.algo, []
    if a.offpolicy not in LEARNERS_WITHOUT_LOGPROB:
        problems.append(f"{reason}: policy-gradient objectives and SAC-style actors need log π; train it with an "
                        f"off-policy learner without one (algo.offpolicy: one of {sorted(LEARNERS_WITHOUT_LOGPROB)}, "
                        f"algo.policy_loss: none), got algo.offpolicy: {a.offpolicy}")
    if a.loss_terms:
        problems.append(f"{reason}: algo.loss_terms {list(a.loss_terms)} read log π; remove them")
    for key in ("kl_coef", "kl_in_reward_coef", "entropy_coef", "bc_coef"):
        if getattr(a, key) > 0:
            problems.append(f"{reason}: algo.{key} > 0 needs log π or an entropy; set it to 0")
    if cfg.trainer.ref_model != "none":
        problems.append(f"{reason}: a reference policy's log-probs cannot be scored; set trainer.ref_model: none")
    return problems


def stage_problems(stages: tuple[StageConfig, ...]) -> list[str]:
    """What is wrong with a recipe's ``stages:`` as a program: names, kinds and the stages they refer to
    (each stage's overrides are checked when :func:`mmrl.core.program.plan` builds its config)."""
    problems, seen, kinds = [], [], {}
    for i, stage in enumerate(stages):
        where = f"stages[{i}] ({stage.name!r})"
        if not stage.name or not all(c.isalnum() or c in "_-" for c in stage.name):
            problems.append(f"{where}: a name is letters, digits, '_' and '-'")
        if stage.name in seen:
            problems.append(f"{where}: the name is used twice")
        base, _, at = stage.init.partition("@")
        if stage.init != "previous" and (base not in seen or at not in ("", "start")):
            problems.append(f"{where}: init must be 'previous', an earlier stage or '<earlier stage>@start', "
                            f"got {stage.init!r} (earlier: {seen})")
        if stage.kind == "rft" and not stage.data:
            problems.append(f"{where}: an rft stage needs data: [<earlier train stages>]")
        if stage.kind != "rft" and stage.data:
            problems.append(f"{where}: data is for rft stages")
        for name in stage.data:
            if kinds.get(name) != "train":
                problems.append(f"{where}: data names {name!r}, which is not an earlier train stage")
        if any(key.split(".")[0] == "stages" for key in stage.overrides):
            problems.append(f"{where}: a stage cannot declare stages")
        seen.append(stage.name)
        kinds[stage.name] = stage.kind
    return problems


def _component_args(config_cls: type, args: Any, path: str) -> Any:
    if is_dataclass(args):
        if not isinstance(args, config_cls):
            raise ConfigError(f"{path} must be a {config_cls.__name__}, got {type(args).__name__}")
        return args
    return build(config_cls, args or {}, path)


def _lookup(registry: Any, name: str) -> Any:
    from mmrl.core.registry import UnknownNameError

    try:
        return registry.get(name)
    except UnknownNameError as err:
        raise ConfigError(str(err)) from None


def dump_config(cfg: TrainConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
