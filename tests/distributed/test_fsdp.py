"""FSDP2 (torch ``fully_shard``) on 2 CPU processes (gloo) through ``accelerate launch``
(configs/accelerate/fsdp_cpu_2proc.yaml, with ``ACCELERATE_USE_CPU=true``).

accelerate 1.16 alone turns this launch into DDP on CPU; ``Engine`` switches it to FSDP2 (docs/scaling.md).
Checked here: the run really is sharded (each process holds about half the parameters), its update equals
the 1-process update on the same global batch (text and tiny VLM policies; LoRA in the slow suite), its rollouts (HF ``generate``
inside ``Engine.full_parameters``) equal the 1-process ones, its sharded checkpoints resume to exactly the
uninterrupted run, and the checkpoint's ``policy/`` folder holds the whole weights of the sharded state.
About 80 s in all on 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.distributed.test_distributed import assert_same_update_metrics, free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "update_equivalence.py"
FSDP_CONFIG = ROOT / "configs" / "accelerate" / "fsdp_cpu_2proc.yaml"
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
LR = 3e-4  # trainer.lr of both tiny recipes
LORA_LR = 1e-2  # adapters move little at 3e-4 in two steps


def env_for(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(MMRL_CACHE=str(tmp_path / "cache"), ACCELERATE_USE_CPU="true", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run(cmd: list[str], env: dict[str, str], timeout: int = 240) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def launch_fsdp(layer_class: str) -> list[str]:
    return [*ACCELERATE, "--config_file", str(FSDP_CONFIG), "--fsdp_transformer_layer_cls_to_wrap", layer_class,
            "--main_process_port", str(free_port())]


@pytest.mark.parametrize("recipe, layer_class, overrides", [
    ("configs/sanity/tiny_cpu.yaml", "Qwen2DecoderLayer", ["trainer.ref_model=copy", "trainer.warmup_steps=3"]),
    # No warm start: every reward is 0, so the entropy bonus and the KL term carry the update.
    ("configs/vlm_sanity/tiny_cpu.yaml", "Qwen2_5_VLDecoderLayer", ["trainer.ref_model=copy",
                                                                    "rollout.max_new_tokens=8"]),
    # LoRA: frozen and trainable parameters sharded together; the reference is the adapters-off base.
    pytest.param("configs/sanity/tiny_cpu.yaml", "Qwen2DecoderLayer",
                 ["trainer.ref_model=adapter_disabled", "policy.args.lora_rank=4", f"trainer.lr={LORA_LR}"],
                 marks=pytest.mark.slow),
], ids=["text", "vlm", "text-lora"])
def test_fsdp_two_process_update_equals_one_process(tmp_path, recipe, layer_class, overrides):
    env = env_for(tmp_path)
    lr = LORA_LR if f"trainer.lr={LORA_LR}" in overrides else LR
    common = ["--recipe", str(ROOT / recipe), "--ppo-epochs", "2", "algo.kl_coef=0.05", "algo.entropy_coef=0.01",
              *overrides]
    run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "one"), "--result", str(tmp_path / "one.pt"),
         "--micro-batch-size", "3", *common], env)
    run([*launch_fsdp(layer_class), str(SCRIPT), "--out", str(tmp_path / "two"), "--result", str(tmp_path / "two.pt"),
         "--micro-batch-size", "5", *common], env)
    one = torch.load(tmp_path / "one.pt", weights_only=False)
    two = torch.load(tmp_path / "two.pt", weights_only=False)

    assert one["world_size"] == 1 and two["world_size"] == 2
    assert two["distributed_type"] == "DistributedType.FSDP"  # not the DDP accelerate alone would give on CPU
    assert one["local_param_fraction"] == 1.0 and 0.45 < two["local_param_fraction"] < 0.6  # rank 0's shard
    assert two["rows_per_rank"] * 2 == two["global_rows"] == one["rows_per_rank"]
    assert one["outputs"] == two["outputs"]  # generate under FSDP (whole parameters) samples what 1 process does

    assert len(one["grads"]) == len(two["grads"]) == 2
    for step, (g1, g2) in enumerate(zip(one["grads"], two["grads"])):
        assert g1.keys() == g2.keys()
        for name in g1:
            torch.testing.assert_close(g2[name], g1[name], atol=1e-7, rtol=1e-5, msg=lambda m: f"step {step} {name}: {m}")

    # As in the DDP test: Adam's first steps turn gradient rounding noise into parameter noise up to ~1e-6.
    assert one["params"].keys() == two["params"].keys()
    changed = 0.0
    for name, p1 in one["params"].items():
        torch.testing.assert_close(two["params"][name], p1, atol=0.01 * lr, rtol=1e-5, msg=lambda m: f"{name}: {m}")
        assert torch.equal(one["initial"][name], two["initial"][name])
        changed = max(changed, float((p1 - one["initial"][name]).abs().max()))
    assert changed > 0.5 * lr, f"the update barely moved the parameters ({changed})"

    assert_same_update_metrics(one["metrics"], two["metrics"])


def test_fsdp_sharded_checkpoint_resumes_exactly(tmp_path):
    """A 3-step FSDP run (checkpoints at steps 2 and 3); its copy without the step-3 checkpoint, resumed, gives
    the same step 3: the same metrics and bit-identical model / optimizer shards and policy folder."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM

    env = env_for(tmp_path)
    args = ["configs/sanity/tiny_cpu.yaml", "trainer.steps=3", "rollout.prompts_per_step=8", "rollout.group_size=4",
            "warm_start.sft_steps=5", "eval.num_examples=8", "eval.every=2", "checkpoint.every=2",
            "log.progress=false", "log.tensorboard=false", "--no-plot"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run([*launch_fsdp("Qwen2DecoderLayer"), "-m", "mmrl.cli", "train", *args, "--out", str(whole)], env)
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_3")
    (resumed / "checkpoints" / "latest").write_text("step_2")
    run([*launch_fsdp("Qwen2DecoderLayer"), "-m", "mmrl.cli", "train", *args, "--out", str(resumed), "--resume"], env)

    rows = {name: [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
            for name, folder in (("whole", whole), ("resumed", resumed))}
    assert [r["step"] for r in rows["whole"]] == [r["step"] for r in rows["resumed"]] == [0, 1, 2, 3]
    untimed = [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in (rows["whole"][3], rows["resumed"][3])]
    assert untimed[0] == untimed[1]
    assert rows["whole"][3]["rollout/len_mean"] > 0 and "eval/reward_mean" in rows["whole"][3]  # sampled under FSDP

    a, b = whole / "checkpoints" / "step_3", resumed / "checkpoints" / "step_3"
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):  # one torch.distributed.checkpoint shard per process
        assert sorted(p.name for p in (a / part).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file() and p.suffix in (".distcp", ".safetensors",
                                                                                             ".pkl", ".json"))
    files = [f for f in files if f.name != "manifest.json"]  # it lists DCP's .metadata, a pickle with its own ids
    assert len(files) >= 12
    for rel in files:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel

    # policy/ holds the whole weights of the sharded state, and loads without mmrl.
    dcp_to_torch_save(a / "pytorch_model_fsdp_0", tmp_path / "state.pt")
    sharded = torch.load(tmp_path / "state.pt", weights_only=True)["model"]
    exported = load_file(a / "policy" / "model.safetensors")
    assert exported.keys() == {k.removeprefix("model.") for k in sharded} - {"lm_head.weight"}  # tied to embeddings
    for name, tensor in exported.items():
        assert torch.equal(tensor, sharded["model." + name]), name
    model = AutoModelForCausalLM.from_pretrained(a / "policy")
    assert torch.equal(model.get_input_embeddings().weight, exported["model.embed_tokens.weight"])
