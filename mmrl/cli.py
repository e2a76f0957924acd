"""``mmrl`` command line: train, sft / bc, eval, list, plot.

    mmrl train configs/sanity/tiny_cpu.yaml trainer.lr=1e-4 --out runs/x
    mmrl sft sanity/tiny_cpu --out runs/sft warm_start.sft_steps=200
    mmrl train sanity/tiny_cpu --out runs/x --resume
    mmrl eval curvebench/easy-v0 --model runs/x --k 4
    mmrl train my_recipe.yaml --import ./my_tasks.py --out runs/mine     # a user's plugin (docs/plugins.md)
    mmrl list
    mmrl plot runs/x
    mmrl plan spatial_ssrl/qwen2_5_vl_3b_gpu --model-config assets/vlm/qwen2_5_vl_3b_config.json --gpu-gib 80
    mmrl plans-gif runs/laviplan_s0 --scenes 4
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import yaml

from mmrl.core.checkpoint import DiskFullError
from mmrl.core.config import ConfigError
from mmrl.core.contracts import DataError
from mmrl.core.guards import TrainingDiverged
from mmrl.core.interrupt import TrainingInterrupted
from mmrl.core.registry import ComponentSpec, Registry, UnknownNameError
from mmrl.core.run_folder import FolderInUseError

# Errors in what the user gave (recipe, override, folder, data files): reported in one line, exit code 2
# (by the first process only, when several were launched: they all fail the same way).
USER_ERRORS = (ConfigError, FileExistsError, FileNotFoundError, UnknownNameError, FolderInUseError, DataError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmrl", description="RL fine-tuning with verifiable rewards")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a policy from a recipe")
    add_train_arguments(train)

    for verb, text in (("sft", "supervised fine-tuning on the task's reference outputs (the warm start)"),
                       ("bc", "behaviour cloning from the task's expert demonstrations (same as sft)")):
        warm = sub.add_parser(verb, help=text + "; saves the policy to --out")
        warm.add_argument("recipe", help="recipe YAML path or name; its warm_start section sets the steps")
        warm.add_argument("overrides", nargs="*", help="dotted overrides, e.g. warm_start.sft_steps=200")
        warm.add_argument("--out", required=True, help="folder for the saved policy")
        warm.add_argument("--overwrite", action="store_true", help="replace an existing folder written by mmrl")
        add_import_argument(warm)

    init = sub.add_parser("init-model", help="build an embedded tiny model from its spec and save it (HF format)")
    init.add_argument("spec", help="tiny-model spec in assets/, e.g. vlm/qwen2_5_vl_tiny.json")
    init.add_argument("--out", required=True, help="new folder for the model and its processor")
    init.add_argument("--seed", type=int, default=0, help="seed of the initial weights (default 0)")

    export = sub.add_parser("export", help="a plain HF checkpoint from a saved policy (LoRA adapters merged)")
    export.add_argument("policy_dir", help="a saved policy folder, e.g. RUN/checkpoints/step_N/policy")
    export.add_argument("--out", required=True, help="new folder for the merged checkpoint")

    add_import_argument(sub.add_parser("list", help="registered tasks, envs, policies, algorithms and recipes; "
                                                    "where each task and policy comes from"))

    evaluate = sub.add_parser("eval", help="a task's held-out metrics for a saved model (pass@k with --k)")
    evaluate.add_argument("target", help="a task id (e.g. curvebench/easy-v0) or a recipe")
    evaluate.add_argument("overrides", nargs="*", help="dotted overrides, e.g. task.args.num_curves=3")
    evaluate.add_argument("--model", help="an HF model folder, a run folder (latest checkpoint) or an `mmrl sft` folder")
    evaluate.add_argument("--policy", default="vlm", help="policy built around --model for a task id (default vlm)")
    evaluate.add_argument("--split", default="test", help="comma-separated task splits (default test)")
    evaluate.add_argument("--num-examples", type=int, default=128, help="examples per split (default 128)")
    evaluate.add_argument("--seed", type=int, default=1234, help="seed of the examples (the trainer's eval.seed)")
    evaluate.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    evaluate.add_argument("--max-new-tokens", type=int, default=None, help="default: the config's rollout.max_new_tokens")
    evaluate.add_argument("--k", type=int, default=1, help="> 1: also pass@k' for k' = 1, 2, 4, ..., k and mean@n over "
                          "n samples (at the config's eval.pass_temperature)")
    evaluate.add_argument("--n", type=int, default=None, help="samples per example for pass@k, >= k (default k); "
                          "n > k uses the unbiased estimator 1 − C(n−c, k)/C(n, k) of Chen et al. 2021")
    evaluate.add_argument("--plot", nargs="?", const="pass_at_k.png", default=None,
                          help="write the pass@k curve as a PNG (default path pass_at_k.png)")
    evaluate.add_argument("--extrapolate-logits", type=float, default=None, metavar="ALPHA",
                          help="sample from z_base + ALPHA·(z − z_base), z the model's logits and z_base those of "
                               "--base (Linear evolution, #10: 0 base, 1 the model, > 1 extrapolates; causal_lm and vlm)")
    evaluate.add_argument("--base", help="with --extrapolate-logits: the base weights (a model, run or sft folder "
                                         "that the same policy loads), or warm_start: the --model run's cached "
                                         "warm start")
    evaluate.add_argument("--without-learner", action="store_true",
                          help="a run whose off-policy learner acts for its policy (EXPO-FT: Q-guided choice over "
                               "base samples and edits; DSRL: the latent actor choosing the flow head's noise) is "
                               "evaluated through that learner; this evaluates the saved weights alone")
    evaluate.add_argument("--json", help="also write the metrics to this JSON file")
    add_import_argument(evaluate)

    sub.add_parser("doctor", help="MuJoCo rendering diagnostics: MUJOCO_GL, working backends, frames/s")
    world_model = sub.add_parser("train-world-model", help="collect MuJoCo episodes, train an action-conditioned "
                                 "world model (VLA-RFT's simulator), measure it against the real sim")
    world_model.add_argument("recipe", help="world-model recipe, e.g. configs/world_model/reach_tiny.yaml")
    world_model.add_argument("--out", required=True, help="folder for the model, its accuracy table and videos")
    world_model.add_argument("--overwrite", action="store_true", help="replace an existing world-model folder")

    plot = sub.add_parser("plot", help="write OUT/curves.png from OUT/metrics.jsonl")
    plot.add_argument("run", help="a run folder (the --out of mmrl train)")
    gif = sub.add_parser("plans-gif", help="write OUT/plans.gif of a driving planner run: held-out scenes played "
                                           "along the warm start's and the trained policy's greedy plans")
    gif.add_argument("run", help="a run folder of a driving/laviplan-* task (the --out of mmrl train)")
    gif.add_argument("--scenes", type=int, default=4, help="held-out scenes in the GIF (default 4)")
    gif.add_argument("--split", help="task split to draw them from (default: the run's eval.split)")

    add_pretrain_arguments(sub.add_parser(
        "pretrain-imagegen", help="train a tiny text-to-image diffusion / flow model; saves a diffusers pipeline"))
    add_sample_arguments(sub.add_parser(
        "sample", help="PNG grid from a diffusion run or pipeline; --rlg-weight w for RL guidance"))

    sweep = sub.add_parser("sweep", help="train algorithm variants side by side over seeds; table + plot in --out")
    sweep.add_argument("recipe", help="base recipe YAML path or name, or a sweep file (configs/sweeps/*.yaml)")
    sweep.add_argument("overrides", nargs="*", help="algo=<arm>,<arm> seeds=0,1,2 and dotted overrides for every run")
    sweep.add_argument("--out", required=True, help="sweep folder (runs/, sweep.md, sweep.json, sweep.png)")
    sweep.add_argument("--pass-k", type=int, default=8, help="k of the held-out pass@k (0: off; default 8)")
    add_import_argument(sweep)

    plan = sub.add_parser("plan", help="GPU memory per process of a recipe (weights, gradients, optimizer, "
                                       "activations, KV cache) from its model's config, without weights")
    plan.add_argument("recipe", help="recipe YAML path or name")
    plan.add_argument("overrides", nargs="*", help="dotted overrides, e.g. policy.args.lora_rank=64")
    plan.add_argument("--accelerate-config", help="accelerate config YAML (configs/accelerate/*.yaml): processes, "
                                                  "mixed precision, DDP / FSDP / DeepSpeed sharding (default: one process)")
    plan.add_argument("--num-processes", type=int, help="override the accelerate config's num_processes")
    plan.add_argument("--gpu-gib", type=float, default=80.0, help="GPU memory to fit in, GiB (default 80)")
    plan.add_argument("--model-config", help="a transformers config.json to plan instead of the recipe's model "
                                             "(a real-size model without its weights, e.g. "
                                             "assets/vlm/qwen2_5_vl_3b_config.json)")
    plan.add_argument("--prompt-tokens", type=int, help="prompt tokens per row (default: measured from the task's "
                                                        "prompts, or policy.args.max_prompt_tokens without a processor)")
    plan.add_argument("--image-patches", type=int, help="vision-encoder patches per row (default: from the task's images)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_import_argument(plan)

    extrapolate = sub.add_parser("extrapolate", help="predict a later checkpoint of a run from earlier ones "
                                                     "(RELEX rank-1, or every weight on its own line)")
    extrapolate.add_argument("run", help="a run folder whose checkpoints were kept (checkpoint.keep_last=0)")
    extrapolate.add_argument("--observe", required=True, help="comma-separated checkpoint steps to fit on, e.g. 10,20,30")
    extrapolate.add_argument("--target", type=int, required=True, help="step to predict")
    extrapolate.add_argument("--out", required=True, help="folder for the predicted policy and extrapolation.json")
    extrapolate.add_argument("--overwrite", action="store_true", help="replace an existing --out written by mmrl")
    extrapolate.add_argument("--method", default="rank1", choices=["rank1", "linear"],
                             help="rank1: RELEX (default); linear: each weight's least-squares line (Linear evolution)")
    return parser


def add_import_argument(parser: argparse.ArgumentParser) -> None:
    """``--import MODULE_OR_FILE`` (repeatable): a user's plugin, imported before the recipe is read."""
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE",
                        help="import a module (my_package.tasks) or a .py file that registers tasks, policies or "
                             "verifiers, before the recipe is read; repeatable (docs/plugins.md)")


def add_pretrain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="pretraining config JSON: assets/imagegen/ddim_tiny.json, flow_tiny.json "
                                       "or var_tiny.json (next-scale VAR)")
    parser.add_argument("--out", required=True, help="folder for the diffusers pipeline")
    parser.add_argument("--steps", type=int, help="override the config's train.steps")
    parser.add_argument("--overwrite", action="store_true", help="replace a folder written by pretrain-imagegen")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_sample_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a diffusion run folder (mmrl train --out) or a diffusers pipeline folder")
    parser.add_argument("--base", help="base pipeline folder for RLG (default for a run: its starting point)")
    parser.add_argument("--rlg-weight", type=float, default=1.0,
                        help="RLG weight w: 0 base, 1 the RL model, (0,1) interpolates, > 1 extrapolates")
    parser.add_argument("--rlg-weights", help="comma-separated weights: print reward and distance to the base per w")
    parser.add_argument("--prompts", nargs="*", help="prompts (default: the run's task prompts of --split)")
    parser.add_argument("--split", default="test", help="task split whose prompts are drawn (run folders)")
    parser.add_argument("--num-prompts", type=int, default=64, help="prompts drawn from the split for --rlg-weights")
    parser.add_argument("--per-prompt", type=int, default=4, help="samples per prompt in the grid")
    parser.add_argument("--steps", type=int, help="denoising steps (default: the policy's eval_num_steps)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial noise")
    parser.add_argument("--out", default="samples.png", help="PNG grid to write")


def add_train_arguments(parser: argparse.ArgumentParser, default_recipe: str | None = None) -> None:
    """``mmrl train`` takes the recipe as its first argument; a domain script has a default recipe
    and takes ``--recipe`` instead, so that its positional arguments are all overrides."""
    if default_recipe is None:
        parser.add_argument("recipe", help="recipe YAML path or name (see `mmrl list`)")
    else:
        parser.add_argument("--recipe", default=default_recipe, help=f"recipe (default {default_recipe})")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-5 algo.kl_coef=0")
    parser.add_argument("--out", required=True, help="run folder (config, metrics, checkpoints)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")
    parser.add_argument("--no-plot", action="store_true", help="do not write OUT/curves.png at the end")
    add_import_argument(parser)


def run_train(args: argparse.Namespace) -> Path:
    """Shared by ``mmrl train`` and the per-domain scripts in ``scripts/``."""
    import transformers

    from mmrl.core.checkpoint import disk_full_error
    from mmrl.core.config import load_config
    from mmrl.core.interrupt import stop_at_step_boundary
    from mmrl.core.program import Program
    from mmrl.core.registry import import_plugins
    from mmrl.core.run_folder import remove_if_unused
    from mmrl.core.trainer import Trainer

    transformers.utils.logging.disable_progress_bar()  # one progress bar: the trainer's
    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite exclude each other")
    import_plugins(args.imports, "--import")
    cfg = load_config(args.recipe, args.overrides, args.imports)  # the run's config.yaml lists them
    out = Path(args.out)
    new_folder = not out.exists()
    with stop_at_step_boundary():
        try:  # a multi-stage recipe runs as a program of stages (mmrl.core.program)
            runner = (Program if cfg.stages else Trainer)(cfg, out, resume=args.resume, overwrite=args.overwrite)
        except USER_ERRORS:
            if new_folder:  # e.g. the task's data is unreadable: leave no empty run folder behind
                remove_if_unused(out)
            raise
        try:
            runner.train()
        except (OSError, RuntimeError) as err:
            full = disk_full_error(err, out)
            if full is None:
                raise
            raise full from None
    return finish_run(out, args) if runner.engine.is_main else out


def finish_run(out: Path, args: argparse.Namespace) -> Path:
    """The main process's summary and curves of a finished run."""
    from mmrl.experiments.plotting import plot_run

    print(summarize(out))
    if not args.no_plot:
        print(f"curves: {plot_run(out)}")
    return out


def run_warm_start(args: argparse.Namespace) -> Path:
    """``mmrl sft`` and ``mmrl bc``: the recipe's supervised warm start, saved to ``--out``."""
    import transformers

    from mmrl.core.config import load_config
    from mmrl.core.registry import import_plugins
    from mmrl.core.warm_start import export_warm_start

    transformers.utils.logging.disable_progress_bar()
    import_plugins(args.imports, "--import")
    cfg = load_config(args.recipe, args.overrides, args.imports)
    out = export_warm_start(cfg, args.out, overwrite=args.overwrite)
    print(f"warm start ({cfg.warm_start.sft_steps} steps) saved to {out}")
    return out


def summarize(out: Path) -> str:
    """First and last held-out evaluation of a run, metric by metric."""
    from mmrl.core.logging import read_metrics

    evals = [r for r in read_metrics(out) if "eval/reward_mean" in r]
    if not evals:
        return f"{out}: no evaluation logged"
    first, last = evals[0], evals[-1]
    lines = [f"held-out evaluation, step {first['step']} -> step {last['step']}:"]
    show = lambda v: "null" if v is None else f"{v:.3f}"  # noqa: E731
    for key in (k for k in last if k.startswith("eval/")):
        before, after = first.get(key), last[key]
        lines.append(f"  {key:<24} {show(before)} -> {show(after)}")
    expected = (yaml.safe_load((out / "config.yaml").read_text()) or {}).get("log", {}).get("expected", {})
    for key, (low, high) in expected.items():
        value = last.get(key)
        verdict = "no value" if value is None else "inside" if low <= value <= high else "OUTSIDE"
        lines.append(f"  {key} {show(value)}: {verdict} the documented range {low:g}-{high:g} "
                     f"(seeds and thread counts, docs/results.md)")
    best = out / "checkpoints" / "best" / "best.json"
    if best.is_file():
        record = json.loads(best.read_text())
        lines.append(f"best {record['metric']} {show(record['value'])} at step {record['step']}: {best.parent}")
    return "\n".join(lines)


def list_components() -> str:
    import gymnasium

    from mmrl.algos import (ADVANTAGE_ESTIMATORS, AGGREGATIONS, GAUSSIAN_KL_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES,
                            SHAPING_HOOKS)
    from mmrl.algos.hooks import LOSS_HOOKS, ROLLOUT_HOOKS
    from mmrl.algos.offpolicy import OFFPOLICY_LEARNERS
    from mmrl.algos.variants import LOSS_TERMS, PROMPT_SELECTORS, REHEARSAL_DIVERGENCES, ROLLOUT_STRATEGIES
    from mmrl.core.config import list_recipes
    from mmrl.core.paths import recipes_dir
    from mmrl.experiments.extrapolate import METHODS as EXTRAPOLATION_METHODS
    from mmrl.core.registry import POLICIES, TASKS, load_plugins
    from mmrl.experiments.sweep import SWEEP_ARMS

    load_plugins()
    envs = sorted(k for k in gymnasium.registry if k.startswith("mmrl/"))
    sections = [("tasks", with_origins(TASKS)), ("envs", envs), ("policies", with_origins(POLICIES)),
                ("advantage estimators", ADVANTAGE_ESTIMATORS.names()), ("policy losses", POLICY_LOSSES.names()),
                ("loss aggregations", AGGREGATIONS.names()),
                ("KL estimators", KL_ESTIMATORS.names() + GAUSSIAN_KL_ESTIMATORS.names()),
                ("shaping hooks", SHAPING_HOOKS.names()), ("rollout strategies", ROLLOUT_STRATEGIES.names()),
                ("rehearsal divergences", REHEARSAL_DIVERGENCES.names()), ("loss terms", LOSS_TERMS.names()),
                ("rollout hooks", ROLLOUT_HOOKS.names()), ("loss hooks", LOSS_HOOKS.names()),
                ("off-policy learners  (algo.offpolicy)", OFFPOLICY_LEARNERS.names()),
                ("prompt selections", ["uniform", *PROMPT_SELECTORS.names()]),
                ("extrapolation", [f"{m}  (mmrl extrapolate --method {m})" for m in EXTRAPOLATION_METHODS]
                 + ["logits  (mmrl eval --extrapolate-logits ALPHA --base BASE)"]),
                ("sweep arms", SWEEP_ARMS.names()),
                ("sweep files  (mmrl sweep NAME --out DIR)",
                 sorted(f"sweeps/{p.stem}" for p in (recipes_dir() / "sweeps").glob("*.yaml"))),
                ("recipes", list_recipes())]
    return "\n".join(f"{title}:\n" + ("\n".join(f"  {n}" for n in names) or "  (none yet)")
                     for title, names in sections)


def with_origins(registry: Registry[ComponentSpec]) -> list[str]:
    """``name  origin`` lines of a task or policy registry (built-in, plugin entry point, --import, imports:)."""
    width = max((len(name) for name in registry.names()), default=0)
    return [f"{name:<{width}}  {registry.get(name).origin}" for name in registry.names()]


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse, letting ``key=value`` overrides stand anywhere (also after ``--out DIR``)."""
    args, extra = parser.parse_known_args(argv)
    stray = [item for item in extra if "=" not in item or item.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def report(line: str) -> None:
    """An error line on stderr, from the first process only (``RANK`` is set by multi-process launchers)."""
    if os.environ.get("RANK", "0") == "0":
        print(line, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_with_overrides(build_parser(), argv)
    return reported(lambda: dispatch(args), f"mmrl {args.command}")


def dispatch(args: argparse.Namespace) -> None:
    if args.command == "train":
        run_train(args)
    elif args.command in ("sft", "bc"):
        run_warm_start(args)
    elif args.command == "init-model":
        from mmrl.models.tiny_vlm import init_model

        print(f"model saved to {init_model(args.spec, args.out, args.seed)}")
    elif args.command == "export":
        from mmrl.policies.lora import merge_and_export

        print(f"plain Hugging Face checkpoint saved to {merge_and_export(args.policy_dir, args.out)}")
    elif args.command == "eval":
        from mmrl.core.evaluate import run_eval
        from mmrl.core.registry import import_plugins

        import_plugins(args.imports, "--import")
        print(run_eval(args))
    elif args.command == "list":
        from mmrl.core.registry import import_plugins

        import_plugins(args.imports, "--import")
        print(list_components())
    elif args.command == "train-world-model":
        from mmrl.envs.world_model.training import run_train_world_model

        print(run_train_world_model(args))
    elif args.command == "doctor":
        from mmrl.envs.robot.doctor import diagnose

        print(diagnose())
    elif args.command == "plot":
        from mmrl.experiments.plotting import plot_run

        print(plot_run(args.run))
    elif args.command == "plans-gif":
        from mmrl.tasks.driving.laviplan_gif import write_run_plans_gif

        path = write_run_plans_gif(args.run, args.scenes, args.split)
        if path is None:
            raise ConfigError(f"{args.run}: plans-gif needs a run of a driving/laviplan-* task")
        print(f"plans: {path}")
    elif args.command == "pretrain-imagegen":
        from mmrl.models.imagegen_pretrain import run_pretrain

        print(run_pretrain(args))
    elif args.command == "sample":
        from mmrl.experiments.imagegen_sample import run_sample

        print(run_sample(args))
    elif args.command == "sweep":
        from mmrl.core.registry import import_plugins
        from mmrl.experiments.sweep import resolve_sweep, run_sweep

        import_plugins(args.imports, "--import")
        recipe, spec = resolve_sweep(args.recipe, args.overrides)
        table = run_sweep(recipe, spec, args.out, args.pass_k, args.imports)
        print(table.read_text())
    elif args.command == "plan":
        from mmrl.core.registry import import_plugins
        from mmrl.experiments.memory_plan import run_plan

        import_plugins(args.imports, "--import")
        print(run_plan(args.recipe, args.overrides, args.accelerate_config, args.num_processes, args.gpu_gib,
                       args.model_config, args.prompt_tokens, args.image_patches, args.json, args.imports))
    elif args.command == "extrapolate":
        from mmrl.experiments.extrapolate import run_extrapolate

        print(run_extrapolate(args.run, args.observe, args.target, args.out, args.overwrite, args.method))


def reported(run: Callable[[], object], prog: str) -> int:
    """Run a command; what went wrong that is not a bug is one line on stderr and an exit code: 2 for the
    user's input, 1 for a full disk or a run that stopped learning, 130 / 143 for SIGINT / SIGTERM."""
    try:
        run()
    except USER_ERRORS as err:
        report(f"{prog}: error: {err}")
        return 2
    except DiskFullError as err:
        report(f"{prog}: error: {err.strerror}")
        return 1
    except TrainingDiverged as err:
        report(f"{prog}: error: {err}")
        return 1
    except TrainingInterrupted as stopped:
        report(str(stopped))
        return stopped.exit_code
    except KeyboardInterrupt:
        report(f"{prog}: interrupted")
        return 130
    return 0


def script_main(default_recipe: str, description: str, argv: list[str] | None = None) -> int:
    """Entry point of a per-domain training script (``scripts/train_<domain>.py``)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_arguments(parser, default_recipe=default_recipe)
    args = parse_with_overrides(parser, argv)
    return reported(lambda: run_train(args), parser.prog)


def exit_process(code: int) -> NoReturn:
    """End a command-line process with exit status ``code`` (``mmrl``, the scripts in ``scripts/``).

    One of several processes started by ``accelerate launch`` / ``torchrun`` (``WORLD_SIZE`` > 1) ends with
    ``os._exit`` once its output is flushed, without the interpreter's teardown. The reason (torch 2.14, gloo;
    seen in CI and reproduced in about one launch in six on two loaded CPU cores): gloo's worker threads
    outlive ``destroy_process_group`` while the model still references the group, and a worker that frees its
    last finished collective (whose tensors have Python objects) while the interpreter is finalising must take
    the GIL, which at that point ends the thread: the process aborts with "terminate called without an active
    exception" (SIGABRT) after a run that had finished and saved everything. Every file a run writes is closed
    before this (the logger, checkpoints); one-process runs exit normally.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def entry() -> NoReturn:
    """The ``mmrl`` command (and ``python -m mmrl.cli``): ``main`` and its exit status."""
    exit_process(main())


if __name__ == "__main__":
    entry()
