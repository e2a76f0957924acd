"""``mmrl sweep``: run algorithm variants side by side over seeds and tabulate held-out results.

    mmrl sweep sanity/tiny_cpu algo=grpo,f_grpo,w_reinforce seeds=0,1,2 --out runs/sweep trainer.steps=60
    mmrl sweep sweeps/seed_methods_vqa --out runs/vqa            # a sweep file (configs/sweeps/)

Each *arm* is a named list of recipe overrides (:data:`SWEEP_ARMS`, e.g. ``f_grpo`` adds the
``f_grpo`` shaping hook); every (arm, seed) pair is one ordinary training run in
``OUT/runs/<arm>/seed_<s>`` (trainer.seed = s; the supervised warm start, seeded by
``warm_start.seed``, is shared by all runs, so seeds vary the RL phase only). Extra ``a.b=c``
overrides apply to every run. A *sweep file* (``configs/sweeps/*.yaml``: one ``sweep:`` mapping of ``recipe``,
``arms``, ``seeds``, ``overrides`` and per-arm ``arm_overrides``) keeps a table's whole command; ``algo=`` /
``seeds=`` on the command line replace the file's, other overrides follow its own. A run whose folder already holds a finished run is reused, so an
interrupted sweep continues where it stopped.

Outputs: ``OUT/sweep.md`` (table: mean ± sample std over seeds of the final held-out reward, exact
match when the task reports it, pass@k and mean@k at temperature ``eval.pass_temperature``, and
rollouts generated), ``OUT/sweep.json`` (every number), ``OUT/sweep.png`` (held-out reward curves,
mean ± std band over seeds, and final pass@k bars).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmrl.core.config import ConfigError, load_config
from mmrl.core.logging import read_metrics
from mmrl.core.registry import Registry, UnknownNameError


@dataclass(frozen=True)
class SweepArm:
    overrides: tuple[str, ...]
    """Recipe overrides that turn the base recipe into this variant."""
    paper: str
    """Where the variant comes from (shown in the table)."""


SWEEP_ARMS: Registry[SweepArm] = Registry("sweep arm")
SWEEP_ARMS.register("grpo", SweepArm((), "the recipe as written (GRPO, DeepSeekMath)"))
SWEEP_ARMS.register("dr_grpo", SweepArm(("algo.norm_adv_by_std=false", "algo.loss_agg=seq-mean-token-sum-norm"),
                                        "Dr. GRPO, arXiv 2503.20783"))
SWEEP_ARMS.register("f_grpo", SweepArm(("algo.shaping=[f_grpo]",), "F-GRPO, arXiv 2602.06717 (γ = 1)"))
SWEEP_ARMS.register("w_reinforce", SweepArm(("algo.advantage=w_reinforce",),
                                            "W-REINFORCE, arXiv 2506.01347 (λ = 0.1)"))
SWEEP_ARMS.register("nsr", SweepArm(("algo.advantage=nsr",), "NSR, arXiv 2506.01347"))
SWEEP_ARMS.register("psr", SweepArm(("algo.advantage=psr",), "PSR, arXiv 2506.01347"))
SWEEP_ARMS.register("ace", SweepArm(("algo.shaping=[ace]",), "ACE, arXiv 2602.21420 (α = 1)"))
SWEEP_ARMS.register("rl_zvp", SweepArm(("algo.shaping=[rl_zvp]",), "RL-ZVP, arXiv 2509.21880 (α = 0.1)"))
SWEEP_ARMS.register("divergence_weighted", SweepArm(("algo.shaping=[divergence_weighted]",),
                                                    "divergence-weighted advantages (token-level shift study)"))
SWEEP_ARMS.register("aero_beta", SweepArm(("algo.advantage=beta_posterior",),
                                          "AERO's Beta-posterior baseline, arXiv 2602.14338 (INFERRED form)"))
# MSSR: one rollout per prompt; as many prompts as the base recipe's rollouts (16 × 8) so each step
# generates the same number of samples; per-prompt Beta baseline + bounded entropy shaping.
SWEEP_ARMS.register("mssr", SweepArm(("rollout.group_size=1", "rollout.prompts_per_step=128",
                                      "algo.advantage=beta_posterior",
                                      "algo.extra.beta_posterior={count_group: false, count_history: true, "
                                      "normalize_std: false}",
                                      "algo.shaping=[entropy_bonus]"),
                                     "MSSR, arXiv 2512.18215 (INFERRED forms; 128 prompts × 1 rollout)"))
# AERO: 4 exploration samples per prompt, rescue of unsolved prompts (+2 per round, ≤ 8 in all),
# selective rejection, Beta-posterior baseline; compare rollouts generated with grpo's 8 per prompt.
SWEEP_ARMS.register("aero", SweepArm(("algo.rollout_strategy=aero", "rollout.group_size=4",
                                      "algo.extra.aero={max_rollouts_per_prompt: 8}", "algo.advantage=beta_posterior"),
                                     "AERO, arXiv 2602.14338 (4 explore + rescue to ≤ 8, rejection k = 1, "
                                     "Beta baseline)"))
SWEEP_ARMS.register("psn", SweepArm(("rollout.param_noise_std=0.005", "trainer.recompute_logp_old=true",
                                     "algo.tis_cap=2.0"),
                                    "PSN-RLVR, arXiv 2602.02555 (fixed σ = 0.005, TIS cap 2; σ and C INFERRED)"))
SWEEP_ARMS.register("dph_rl", SweepArm(("algo.rehearsal_divergence=js",
                                        "algo.extra.dph_rl={coef: 0.1, rehearsal_prompts: 512}"),
                                       "DPH-RL, arXiv 2509.07430 (JS to π_0 on its always-solved samples, coef 0.1)"))
SWEEP_ARMS.register("hard_focus", SweepArm(("algo.prompt_selection=hard_focus",),
                                           "hard-focus curriculum (seed #45): prompts with the highest failure rate"))
SWEEP_ARMS.register("pos_neg_pairing", SweepArm(("algo.prompt_selection=pos_neg_pairing", "algo.advantage=weighted_grpo"),
                                                "positive-negative pairing + Weighted GRPO (seed #65)"))
SWEEP_ARMS.register("low_likelihood", SweepArm(("algo.prompt_selection=low_likelihood",),
                                               "SELF (seed #102): prompts whose reference is least likely"))
SWEEP_ARMS.register("dyme", SweepArm(("algo.dyme=true",), "DyME (seed #33): SFT on the reference for all-failed groups"))
SWEEP_ARMS.register("visurf", SweepArm(("rollout.reference_rows=1",),
                                       "ViSurf, arXiv 2510.10606 (1 reference answer + 7 samples per group)"))
# Guidance when every sample of a prompt fails (issue 24). On the sanity task's soft reward a group rarely
# scores 0 everywhere, so the arms treat a group without an exact answer as failed (fail_threshold 0.99).
SWEEP_ARMS.register("guide", SweepArm(("algo.guide=true",),
                                      "Guide (seed #63): all-failed groups redrawn with the task's hint, trained on the "
                                      "hint-free prompt with π_old(y | x, hint); needs task.args.hint_template"))
SWEEP_ARMS.register("seele", SweepArm(("algo.seele=true",),
                                      "SEELE (seed #99): reference prefix as hint, length per prompt from an IRT fit "
                                      "aimed at 50% success, 2 rounds (fit form INFERRED)"))
SWEEP_ARMS.register("ampo", SweepArm(("algo.ampo=true", "algo.extra.ampo={fail_threshold: 0.99}"),
                                     "AMPO (seed #108): the reference answer as teacher for groups without an exact "
                                     "answer, π_old = 1 (no p/(p+γ) reshaping)"))
SWEEP_ARMS.register("eapo", SweepArm(("algo.eapo=true", "algo.extra.eapo={fail_threshold: 0.99}"),
                                     "EAPO (seed #93, as issue 24 describes it): a prompt's earlier exact answers "
                                     "replayed into its failed groups, IS-corrected by stored π_old"))
SWEEP_ARMS.register("fest", SweepArm(("algo.fest=true",),
                                     "FEST (seed #46): SFT on 128 fixed demonstrations, weight 0.95^(step−1) "
                                     "(decay INFERRED)"))
# Issue 25's per-step programs (NPO needs a guide run, so it is a program recipe, not an arm).
SWEEP_ARMS.register("recap", SweepArm(("algo.recap=true",),
                                      "RECAP (seed #49): replay of the warm start's data, its weight set each step "
                                      "from both objectives' convergence and instability (signals' form INFERRED)"))
SWEEP_ARMS.register("scope_rl", SweepArm(("algo.scope_rl=true",),
                                         "SCOPE-RL (seed #70): prefix credit of the reference's sub-answers before a "
                                         "prompt's first success, correctness-gated process shape after (INFERRED "
                                         "chain: the reference's lines or characters)"))
SWEEP_ARMS.register("erpo", SweepArm(("algo.temperature_schedule=erpo",),
                                     "ERPO, arXiv 2511.04800 (all-correct prompts re-sampled +0.1 hotter, ≤ 1.5, "
                                     "reset once mixed; schedule INFERRED)"))
SWEEP_ARMS.register("erpo_reactivate", SweepArm(("algo.prompt_selection=erpo_reactivate",),
                                                "ERPO's reactivation alone (seed #113): all-correct prompts tracked "
                                                "and drawn again, ≤ 25% of a round (form INFERRED)"))
SWEEP_ARMS.register("erpo_full", SweepArm(("algo.temperature_schedule=erpo", "algo.prompt_selection=erpo_reactivate"),
                                          "ERPO, arXiv 2511.04800: residual prompts drawn again, each at its raised "
                                          "temperature (schedule and reactivation INFERRED)"))
SWEEP_ARMS.register("rorecomp", SweepArm(("algo.rorecomp=true",),
                                         "RoRecomp (seed #71): priority batch of the shortest correct / longest "
                                         "incorrect half of each group, compensation batch of the rest every 2 steps "
                                         "(shares and schedule INFERRED)"))
SWEEP_ARMS.register("rollout_bandit", SweepArm(("algo.rollout_bandit=true",),
                                               "contextual-bandit rollout scheduler (seed #111): LinUCB keeps 6 of 8 "
                                               "rows per group and reuses 2 earlier groups, rewarded by the step-to-step "
                                               "reward gain (linear model INFERRED)"))
SWEEP_ARMS.register("calibrl", SweepArm(("algo.loss_terms=[calibrl]", "algo.norm_adv_by_std=false",
                                         "algo.dual_clip_c=3.0"),
                                        "CalibRL, arXiv 2602.20197 (Dr.GRPO, dual clip 3, + 0.1 × LeakyReLU "
                                        "calibration to the reference answer)"))

# Objectives of issue 24: PACS and FRPO replace the surrogate (policy_loss none, the objective as a loss term).
SWEEP_ARMS.register("pacs", SweepArm(("algo.policy_loss=none", "algo.loss_terms=[pacs]"),
                                     "PACS, arXiv 2509.02522 (β = 1, RLOO-centred score, class-balanced BCE)"))
SWEEP_ARMS.register("frpo", SweepArm(("algo.policy_loss=none", "algo.loss_terms=[frpo]"),
                                     "FRPO, arXiv 2602.08813 (λ = 1, jackknife, offset; GRPO advantages)"))
SWEEP_ARMS.register("polychromic", SweepArm(("algo.advantage=polychromic",),
                                            "Polychromic PPO, arXiv 2509.25424 (set advantage, n = 4; no vine "
                                            "sampling; diversity = distinct outputs, INFERRED)"))
SWEEP_ARMS.register("polychromic_vine", SweepArm(("algo.advantage=polychromic",
                                                  "algo.extra.polychromic={vine_states: 4}"),
                                                 "Polychromic PPO, arXiv 2509.25424, with vine sampling: 4 groups "
                                                 "per step re-rolled from a state inside one of their answers, a "
                                                 "group of continuations each (states INFERRED)"))
SWEEP_ARMS.register("rw_sft", SweepArm(("algo.policy_loss=rw_sft", "algo.advantage=w_reinforce",
                                        "algo.extra.w_reinforce={positive_weight: 1.0}"),
                                       "RIFT reward-weighted SFT, arXiv 2601.09253 (weight 2r − 1; bounded "
                                       "negative branch INFERRED)"))
SWEEP_ARMS.register("weighted_grpo", SweepArm(("algo.advantage=weighted_grpo",),
                                              "Weighted GRPO, arXiv 2602.03452 (rare events × 2; form INFERRED; "
                                              "no prompt pairing)"))

# Distillation and self-supervision variants of issue 24. direct_opd needs the post-RL teacher as an extra override
# (algo.extra.direct_opd={teacher: RUN/checkpoints/step_N/policy}); on a task whose vocabulary lacks the default texts (the
# sanity task's digits), give ssb / cipo texts it can encode (docs/algorithms.md).
SWEEP_ARMS.register("direct_opd", SweepArm(("algo.advantage=direct_opd",),
                                          "Direct-OPD (seed #116): β·log(π_T/π_T0) per token − KL to the reference "
                                          "(β = λ = 1; teacher in algo.extra.direct_opd.teacher; no verifier)"))
SWEEP_ARMS.register("ssb", SweepArm(("algo.ssb=true",),
                                   "SSB (seed #73, arXiv 2512.05105): hinted answers distilled into the bare prompt "
                                   "(KL at T = 2, coef 1), beside GRPO"))
SWEEP_ARMS.register("cipo", SweepArm(("algo.cipo=true",),
                                    "CIPO (seed #95): 4 failed samples per step become correction prompts, each a "
                                    "group of its own, beside GRPO"))
SWEEP_ARMS.register("ebft", SweepArm(("algo.ebft=true",),
                                    "EBFT (seed #9): feature-matching reward vs the reference (frozen initial "
                                    "hidden states, γ = 1), no verifier"))


@dataclass(frozen=True)
class SweepSpec:
    arms: tuple[str, ...]
    seeds: tuple[int, ...]
    overrides: tuple[str, ...]
    arm_overrides: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Extra overrides of single arms (after the common ones), e.g. the teacher folder ``direct_opd`` needs."""

    def overrides_of(self, arm: str) -> tuple[str, ...]:
        return dict(self.arm_overrides).get(arm, ())


SWEEP_FILE_KEYS = ("recipe", "arms", "seeds", "overrides", "arm_overrides")


def sweep_file(target: str) -> Path | None:
    """The sweep file ``target`` names (a path, or a name under the recipes folder such as
    ``sweeps/seed_methods_vqa``), or None when it is not one (a recipe)."""
    from mmrl.core.config import load_yaml
    from mmrl.core.paths import recipes_dir

    name = target.removesuffix(".yaml").removeprefix("configs/")
    for path in (Path(target), recipes_dir() / f"{name}.yaml"):
        if path.is_file():
            return path if "sweep" in load_yaml(path) else None
    return None


def resolve_sweep(target: str, items: list[str]) -> tuple[str, SweepSpec]:
    """``mmrl sweep``'s arguments → (base recipe, spec): ``target`` is a recipe (``items`` give ``algo=``,
    ``seeds=`` and overrides) or a sweep file (``items`` replace its arms / seeds and add overrides)."""
    from mmrl.core.config import load_yaml

    path = sweep_file(target)
    if path is None:
        return target, parse_sweep_arguments(items)
    data = load_yaml(path)["sweep"]
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: 'sweep' must be a mapping of {', '.join(SWEEP_FILE_KEYS)}")
    unknown = sorted(set(data) - set(SWEEP_FILE_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown sweep key(s) {', '.join(unknown)}; keys: {', '.join(SWEEP_FILE_KEYS)}")

    def strings(key: str, value: object) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, (str, int)) and not isinstance(v, bool)
                                                  for v in value):
            raise ConfigError(f"{path}: sweep.{key} must be a list of strings, got {value!r}")
        return [str(v) for v in value]

    if not isinstance(data.get("recipe"), str):
        raise ConfigError(f"{path}: sweep.recipe must name the base recipe (a path or a name like data/tiny_cpu)")
    head = [f"algo={','.join(strings('arms', data.get('arms', [])))}",
            f"seeds={','.join(strings('seeds', data.get('seeds', [])))}"]
    spec = parse_sweep_arguments([*head, *strings("overrides", data.get("overrides", [])), *items])
    per_arm = data.get("arm_overrides", {})
    if not isinstance(per_arm, dict):
        raise ConfigError(f"{path}: sweep.arm_overrides must map arm names to lists of overrides")
    arm_overrides = tuple((str(arm), tuple(strings(f"arm_overrides.{arm}", extra))) for arm, extra in per_arm.items())
    return data["recipe"], dataclasses.replace(spec, arm_overrides=arm_overrides)


def parse_sweep_arguments(items: list[str]) -> SweepSpec:
    """Split ``algo=a,b seeds=0,1`` from the ordinary dotted overrides."""
    arms, seeds, rest = None, None, []
    for item in items:
        key, _, value = item.partition("=")
        if key == "algo":
            arms = tuple(v.strip() for v in value.split(",") if v.strip())
        elif key == "seeds":
            try:
                seeds = tuple(int(v) for v in value.split(",") if v.strip())
            except ValueError:
                raise ConfigError(f"seeds={value!r}: give integers, e.g. seeds=0,1,2") from None
        else:
            rest.append(item)
    if not arms:
        raise ConfigError(f"mmrl sweep needs algo=<arm>,<arm>,...; arms: {', '.join(SWEEP_ARMS.names())}")
    if not seeds:
        raise ConfigError("mmrl sweep needs seeds=<int>,<int>,... (e.g. seeds=0,1,2)")
    if len(set(arms)) != len(arms) or len(set(seeds)) != len(seeds):
        raise ConfigError("mmrl sweep: arms and seeds must not repeat")
    for arm in arms:
        if arm not in SWEEP_ARMS:
            try:
                SWEEP_ARMS.get(arm)
            except UnknownNameError as err:  # "did you mean" + the registered arms
                raise ConfigError(str(err)) from None
    return SweepSpec(arms, seeds, tuple(rest))


def run_is_complete(out: Path, steps: int) -> bool:
    try:
        rows = read_metrics(out)
    except FileNotFoundError:
        return False
    return any(r["step"] == steps and "eval/reward_mean" in r for r in rows)


def run_sweep(recipe: str, spec: SweepSpec, out: str | Path, pass_k: int, imports: list[str] = ()) -> Path:
    """Train every (arm, seed) and write the table, JSON and plot; returns ``OUT/sweep.md``. ``imports``
    (``--import``) are recorded in every run's config."""
    import transformers

    from mmrl.core.trainer import Trainer

    transformers.utils.logging.disable_progress_bar()
    out = Path(out)
    common = [*spec.overrides, f"eval.pass_k={pass_k}", "log.progress=false"]
    configs = {(arm, seed): load_config(recipe, [*common, *SWEEP_ARMS.get(arm).overrides, *spec.overrides_of(arm),
                                                 f"trainer.seed={seed}"], imports)
               for arm in spec.arms for seed in spec.seeds}  # every config is validated before any training
    seconds: dict[tuple[str, int], float] = {}
    for (arm, seed), cfg in configs.items():
        run_dir = out / "runs" / arm / f"seed_{seed}"
        if run_is_complete(run_dir, cfg.trainer.steps):
            print(f"sweep: {arm} seed {seed}: reusing {run_dir}")
            continue
        start = time.perf_counter()
        Trainer(cfg, run_dir, overwrite=True).train()
        seconds[(arm, seed)] = time.perf_counter() - start
        print(f"sweep: {arm} seed {seed}: {seconds[(arm, seed)]:.0f} s")
    results = collect_results(out, spec, pass_k, {a: configs[(a, spec.seeds[0])].trainer.steps for a in spec.arms})
    for (arm, seed), s in seconds.items():
        results["runs"][arm][str(seed)]["train_seconds"] = s
    (out / "sweep.json").write_text(json.dumps(results, indent=1))
    table = out / "sweep.md"
    table.write_text(format_table(results, recipe, spec))
    plot_sweep(results, out / "sweep.png")
    return table


def collect_results(out: Path, spec: SweepSpec, pass_k: int, steps: dict[str, int]) -> dict:
    """Per arm and seed: the final and initial held-out metrics, the eval curve, rollouts generated."""
    runs: dict[str, dict[str, dict]] = {}
    for arm in spec.arms:
        runs[arm] = {}
        for seed in spec.seeds:
            rows = read_metrics(out / "runs" / arm / f"seed_{seed}")
            evals = [r for r in rows if "eval/reward_mean" in r]
            final = next(r for r in evals if r["step"] == steps[arm])
            runs[arm][str(seed)] = {
                "initial": {k: v for k, v in evals[0].items() if k.startswith("eval/")},
                "final": {k: v for k, v in final.items() if k.startswith("eval/")},
                "curve": [[r["step"], r["eval/reward_mean"]] for r in evals],
                "rollouts_generated": sum(r["rollout/generated"] for r in rows if r["step"] > 0),
                "rows_trained": sum(r["rollout/trained_rows"] for r in rows if r["step"] > 0),
                "step_seconds": float(np.mean([r["perf/step_s"] for r in rows if r["step"] > 0])),
            }
    return {"arms": list(spec.arms), "seeds": list(spec.seeds), "pass_k": pass_k, "runs": runs}


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1; 0 for a single value)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


def _metric_columns(results: dict) -> list[str]:
    k = results["pass_k"]
    first = next(iter(next(iter(results["runs"].values())).values()))["final"]
    columns = ["eval/reward_mean"] + [c for c in ("eval/exact_match",) if c in first]
    return columns + ([f"eval/pass@{k}", f"eval/mean@{k}"] if k else [])


def format_table(results: dict, recipe: str, spec: SweepSpec) -> str:
    columns = _metric_columns(results)
    header = ["arm", *(c.removeprefix("eval/") for c in columns), "rollouts generated", "rows trained", "s / step"]
    lines = [f"Sweep of `{recipe}` ({' '.join(spec.overrides) or 'no overrides'}); "
             f"final held-out metrics, mean ± std over seeds {', '.join(map(str, spec.seeds))}; rollouts "
             f"generated and rows trained summed over the run, seconds per step averaged (wall clock, shared CPU).",
             "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    first_arm = results["runs"][results["arms"][0]]
    start = [mean_std([first_arm[s]["initial"][c] for s in first_arm]) for c in columns]
    lines.append("| (before RL) | " + " | ".join(f"{m:.3f}" for m, _ in start) + " | 0 | 0 | |")
    for arm in results["arms"]:
        runs = results["runs"][arm].values()
        cells = [mean_std([r["final"][c] for r in runs]) for c in columns]
        generated = mean_std([r["rollouts_generated"] for r in runs])[0]
        trained = mean_std([r["rows_trained"] for r in runs])[0]
        seconds = mean_std([r["step_seconds"] for r in runs])[0]
        lines.append(f"| {arm} | " + " | ".join(f"{m:.3f} ± {s:.3f}" for m, s in cells)
                     + f" | {generated:.0f} | {trained:.0f} | {seconds:.2f} |")
    lines += ["", "Arms: " + "; ".join(describe_arm(a) for a in results["arms"])]
    lines += [f"Only `{arm}`: `{' '.join(extra)}`" for arm, extra in spec.arm_overrides if arm in results["arms"]]
    lines.append("")
    return "\n".join(lines)


def describe_arm(name: str) -> str:
    arm = SWEEP_ARMS.get(name)
    return f"`{name}` = {arm.paper}" + (f" (`{' '.join(arm.overrides)}`)" if arm.overrides else "")


def plot_sweep(results: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = results["pass_k"]
    fig, axes = plt.subplots(1, 2 if k else 1, figsize=(11 if k else 6, 3.8), squeeze=False)
    ax = axes[0][0]
    colours = plt.cm.tab20(np.linspace(0, 1, 20))
    for i, arm in enumerate(results["arms"]):
        curves = [r["curve"] for r in results["runs"][arm].values()]
        steps = [p[0] for p in curves[0]]
        values = np.array([[p[1] for p in c] for c in curves if len(c) == len(steps)])
        mean, std = values.mean(0), values.std(0, ddof=1) if len(values) > 1 else np.zeros(len(steps))
        colour = colours[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20]
        ax.plot(steps, mean, "o-", markersize=3, label=arm, color=colour)
        ax.fill_between(steps, mean - std, mean + std, alpha=0.12, color=colour)
    ax.set_xlabel("step")
    ax.set_ylabel("eval/reward_mean")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2, loc="upper left")
    if k:
        ax = axes[0][1]
        arms = results["arms"]
        stats = [mean_std([r["final"][f"eval/pass@{k}"] for r in results["runs"][a].values()]) for a in arms]
        ax.bar(range(len(arms)), [m for m, _ in stats], yerr=[s for _, s in stats], capsize=3)
        ax.set_xticks(range(len(arms)), arms, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(f"final eval/pass@{k}")
        low = min(m - s for m, s in stats)
        ax.set_ylim(max(0.0, math.floor(low * 20) / 20 - 0.05), None)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
