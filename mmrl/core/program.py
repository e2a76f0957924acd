"""Multi-stage recipes: the ``stages:`` of a recipe, run in order in one run folder.

A stage is the recipe with the stage's overrides (:class:`mmrl.core.config.StageConfig`), of one kind:

- ``train`` — the RL loop (:class:`mmrl.core.trainer.Trainer`), in a run folder of its own;
- ``sft``   — ``warm_start.sft_steps`` supervised steps on the task's reference outputs;
- ``rft``   — rejection-sampling fine-tuning: the same supervised steps on the rows that earlier train
  stages kept (``rollout.keep_successes``: their successful samples);
- ``eval``  — the held-out evaluation of the policy it starts from.

Each stage starts from a policy named by ``init``: the previous stage's result (the recipe's warm start
for the first stage), a given stage's result, or ``<stage>@start``, the policy a stage started from.
RLoop is then four lines of YAML (``configs/rloop/tiny_cpu.yaml``): RL that keeps its successes, RFT of
the RL stage's *start* on them, and the next RL from the RFT policy.

The run folder ``OUT``::

    config.yaml       the recipe as run, stages included
    program.json      progress: the stages completed, each one's start and result policy and RL steps
    stages/NN_name/   each stage's folder (a train stage's is an ordinary run folder)
    stages/NN_name.start/  the policy a stage started from, when a later stage names it (``<stage>@start``)
    metrics.jsonl     every completed stage's rows in order, with ``stage``; ``step`` counts RL steps
                      over the whole program, ``stage_step`` within the stage

``--resume`` skips the completed stages and resumes a train stage from its latest checkpoint; an sft /
rft / eval stage in progress is run again from its start (it is seeded, so it gives the same result).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mmrl.core import checkpoint as ckpt
from mmrl.core.checkpoint import PROGRAM_FILE
from mmrl.core.config import ConfigError, StageConfig, TrainConfig, dump_config, set_dotted, validate
from mmrl.core.engine import Engine, set_threads
from mmrl.core.logging import read_metrics
from mmrl.core.run_folder import prepare_out_dir, release_lock
from mmrl.core.typed import build, to_dict

STAGES_DIR = "stages"


@dataclass(frozen=True)
class Stage:
    """A stage of the program, with its place and its config (before the start policy is known)."""

    index: int
    spec: StageConfig
    cfg: TrainConfig

    @property
    def folder_name(self) -> str:
        return f"{self.index + 1:02d}_{self.spec.name}"


def stage_config(cfg: TrainConfig, stage: StageConfig, init: Path | None = None) -> TrainConfig:
    """The recipe with ``stage``'s overrides; a train or eval stage given ``init`` starts from those weights."""
    data = to_dict(cfg)
    data["stages"] = []
    for key, value in stage.overrides.items():
        set_dotted(data, key, value, f"stage {stage.name!r}: override {key!r}")
    if init is not None and stage.kind in ("train", "eval"):
        data["warm_start"] |= {"init_from": str(init), "sft_steps": 0}
    try:
        return validate(build(TrainConfig, data))
    except ConfigError as err:
        raise ConfigError(f"stage {stage.name!r}: {err}") from None


def plan(cfg: TrainConfig) -> list[Stage]:
    """Every stage's config, built and validated before any work (an override typo fails at once)."""
    stages = [Stage(i, spec, stage_config(cfg, spec)) for i, spec in enumerate(cfg.stages)]
    for stage in stages:
        if stage.spec.kind in ("sft", "rft") and stage.cfg.warm_start.sft_steps < 1:
            raise ConfigError(f"stage {stage.spec.name!r} ({stage.spec.kind}) takes warm_start.sft_steps supervised "
                              f"steps: set it >= 1 in its overrides")
        for name in stage.spec.data:
            source = next(s for s in stages if s.spec.name == name)
            if source.cfg.rollout.keep_successes is None:
                raise ConfigError(f"stage {stage.spec.name!r} fine-tunes on the rows {name!r} keeps: set "
                                  f"rollout.keep_successes in {name!r}'s overrides")
    return stages


class Program:
    """Runs (or resumes) a multi-stage recipe in ``out``."""

    def __init__(self, cfg: TrainConfig, out: str | Path, resume: bool = False, overwrite: bool = False):
        self.cfg, self.out = cfg, Path(out)
        self.stages = plan(cfg)
        set_threads(cfg.trainer.threads)
        self.engine = Engine(cfg.trainer.mixed_precision)
        if self.engine.is_main:
            prepare_out_dir(self.out, resume, overwrite)
        self.engine.wait()
        fingerprint = ckpt.config_fingerprint(cfg)
        state_path = self.out / PROGRAM_FILE
        if resume and state_path.is_file():
            self.state = json.loads(state_path.read_text())
            if self.state["fingerprint"] != fingerprint:
                raise ConfigError(f"--resume {self.out}: the recipe differs from the one this program ran "
                                  f"(compare with {self.out / 'config.yaml'})")
        else:
            self.state = {"fingerprint": fingerprint, "done": []}
        if self.engine.is_main:
            dump_config(cfg, self.out / "config.yaml")
        self.resume = resume
        # stages whose start a later stage names (``<stage>@start``): their start policy is saved
        self.starts_needed = {s.spec.init.partition("@")[0] for s in self.stages if s.spec.init.endswith("@start")}

    # -- the stages ------------------------------------------------------------------------------------
    def train(self) -> Path:
        """Run the stages not completed yet, in order."""
        done = {d["name"] for d in self.state["done"]}
        for stage in self.stages:
            if stage.spec.name in done:
                continue
            folder = self.out / STAGES_DIR / stage.folder_name
            start = self.start_of(stage)
            if self.engine.is_main:
                print(f"stage {stage.index + 1}/{len(self.stages)}: {stage.spec.name} ({stage.spec.kind}), "
                      f"from {start or 'the recipe’s warm start'}", flush=True)
            if start is None and stage.spec.name in self.starts_needed:
                start = self.save_start(stage, folder)
            record = {"name": stage.spec.name, "kind": stage.spec.kind, "folder": folder.name,
                      "start": None if start is None else str(start.relative_to(self.out))}
            if stage.spec.kind == "train":
                record |= self.train_stage(stage, folder, start)
            else:
                record |= self.supervised_or_eval_stage(stage, folder, start)
            self.state["done"].append(record)
            if self.engine.is_main:
                write_atomic(self.out / PROGRAM_FILE, json.dumps(self.state, indent=1))
                write_atomic(self.out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in self.merged_rows()))
            self.engine.wait()
        self.state["final_policy"] = self.state["done"][-1]["result"]
        if self.engine.is_main:
            write_atomic(self.out / PROGRAM_FILE, json.dumps(self.state, indent=1))
        self.engine.end()
        release_lock(self.out)
        return self.out

    def start_of(self, stage: Stage) -> Path | None:
        """The policy folder ``stage`` starts from; None for the recipe's own warm start."""
        done = {d["name"]: d for d in self.state["done"]}
        init = stage.spec.init
        if init == "previous":
            if stage.index == 0:
                return None
            name, which = self.stages[stage.index - 1].spec.name, "result"
        else:
            name, _, at = init.partition("@")
            which = "start" if at else "result"
        path = done[name][which]  # None: that stage's start (or an eval stage's result) was the warm start
        return None if path is None else self.out / path

    def save_start(self, stage: Stage, folder: Path) -> Path:
        """The recipe's warm-started policy, saved as ``stage``'s start (a later stage names it)."""
        from mmrl.core.warm_start import build_initial_policy

        path = folder.with_name(f"{folder.name}.start")  # beside the stage's folder, which the stage prepares
        policy = build_initial_policy(stage.cfg, self.engine.device, self.engine.is_main, self.engine.wait)
        if self.engine.is_main:
            save_policy(policy, path)
        self.engine.wait()
        return path

    def train_stage(self, stage: Stage, folder: Path, start: Path | None) -> dict[str, Any]:
        from mmrl.core.trainer import Trainer

        cfg = stage_config(self.cfg, stage.spec, start)
        resume = self.resume and ckpt.latest_checkpoint(folder) is not None
        trainer = Trainer(cfg, folder, resume=resume, overwrite=not resume)
        trainer.train(end=False)
        latest = ckpt.latest_checkpoint(folder)
        return {"result": str((latest / "policy").relative_to(self.out)), "rl_steps": cfg.trainer.steps}

    def supervised_or_eval_stage(self, stage: Stage, folder: Path, start: Path | None) -> dict[str, Any]:
        """An sft / rft stage (supervised steps from ``start``, saved as ``policy/``) or an eval stage;
        either way the held-out evaluation of the stage's result, as the stage's metrics row."""
        from mmrl.core.evaluate import evaluate_sets, held_out_sets
        from mmrl.core.registry import make_policy, make_task
        from mmrl.core.warm_start import build_initial_policy, fit, sft

        cfg, kind, eng = stage.cfg, stage.spec.kind, self.engine
        if eng.is_main:
            shutil.rmtree(folder, ignore_errors=True)  # a stage in progress is run again from its start
            folder.mkdir(parents=True)
        eng.wait()
        if start is None:
            policy = (build_initial_policy(cfg, eng.device, eng.is_main, eng.wait) if kind == "eval"
                      else make_policy(cfg.policy.name, cfg.policy.args).to(eng.device))
        else:
            policy = make_policy(cfg.policy.name, cfg.policy.args).to(eng.device)
            policy.load_weights(str(start))
        row: dict[str, Any] = {}
        result = start
        if kind in ("sft", "rft"):
            result = folder / "policy"
            if eng.is_main:
                if kind == "sft":
                    losses = sft(policy, cfg)
                else:
                    pairs = self.kept_pairs(stage.spec.data)
                    row["rft/rows"] = len(pairs)
                    losses = fit(policy, pairs_sampler(pairs, cfg.warm_start.batch_size),
                                 np.random.default_rng(cfg.warm_start.seed), cfg.warm_start.sft_steps,
                                 cfg.warm_start.lr, "rejection-sampling FT", cfg.log.progress) if pairs else []
                    if not pairs:
                        print(f"mmrl: warning: stage {stage.spec.name!r}: the stages {list(stage.spec.data)} kept no "
                              f"rows (score >= rollout.keep_successes); its policy is its start", flush=True)
                if losses:
                    row |= {"sft/loss_first": losses[0], "sft/loss_last": losses[-1]}
                save_policy(policy, result)
            eng.wait()
            if not eng.is_main:
                policy.load_weights(str(result))
        task = make_task(cfg.task.name, cfg.task.args)
        metrics, _ = evaluate_sets(policy, task, cfg, eng, held_out_sets(task, cfg), 0)
        row = {"step": 0, **row, **metrics}
        if eng.is_main:
            write_atomic(folder / "metrics.jsonl", json.dumps(row) + "\n")
        eng.wait()
        return {"result": None if result is None else str(result.relative_to(self.out)), "rl_steps": 0}

    def kept_pairs(self, names: Sequence[str]) -> list[tuple[Any, Any]]:
        from mmrl.algos.variants.hooks import read_kept

        done = {d["name"]: d for d in self.state["done"]}
        pairs = []
        for name in names:
            pairs += read_kept(self.out / STAGES_DIR / done[name]["folder"], done[name]["rl_steps"])
        return pairs

    # -- metrics ---------------------------------------------------------------------------------------
    def merged_rows(self) -> list[dict[str, Any]]:
        """Every completed stage's metrics rows, with ``stage`` and the program-wide ``step``."""
        rows, offset = [], 0
        for record in self.state["done"]:
            for row in read_metrics(self.out / STAGES_DIR / record["folder"]):
                rows.append({**row, "step": offset + row["step"], "stage_step": row["step"], "stage": record["name"]})
            offset += record["rl_steps"]
        return rows


def pairs_sampler(pairs: list[tuple[Any, Any]], batch_size: int):
    """``draw(rng)``: ``batch_size`` kept (example, output) pairs drawn uniformly (with replacement when fewer)."""
    def draw(rng: np.random.Generator) -> tuple[list[Any], list[Any]]:
        index = rng.choice(len(pairs), size=batch_size, replace=len(pairs) < batch_size)
        return [pairs[i][0] for i in index], [pairs[i][1] for i in index]
    return draw


def save_policy(policy: Any, path: Path) -> None:
    """``policy.save_pretrained`` into ``path``, atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(str(tmp))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def run_program(cfg: TrainConfig, out: str | Path, resume: bool = False, overwrite: bool = False) -> Path:
    """Run (or resume) the multi-stage recipe ``cfg`` in ``out``; returns the run folder."""
    return Program(cfg, out, resume=resume, overwrite=overwrite).train()
