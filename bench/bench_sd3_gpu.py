"""One Flow-GRPO step on a random-weight Stable-Diffusion-3.5-Medium-shaped pipeline (GPU; no download).

The pipeline folder is written by diffusers' own ``StableDiffusion3Pipeline.save_pretrained`` and the step
runs through the shared trainer with the GPU recipe ``flow_grpo/sd3_5_medium_lora_gpu`` (LoRA r 32 on the
transformer's attention projections, SDE sampler, KL to the adapters-off base, bf16 autocast), reduced to
one step of 2 prompts × 4 images at 512 px and evaluation on 2 prompts with 10 ODE steps.

Full size where the step's cost is: the SD3.5-Medium transformer (24 MMDiT-X layers, 1536 wide, dual
attention in layers 0-12, RMS QK-norm; 2.5 B parameters) and the SD3 VAE (16 latent channels) at their
published shapes, and the two CLIP text encoders (L/14 and bigG/14 sizes, 77 tokens). The T5 encoder has
T5-XXL's width (4096, what the transformer attends to) but 1 of its 24 layers: prompts are encoded once per
step, which is not the step's cost, and the pipeline keeps the published layout (T5 present). Tokenizers are
a word-level one over the task's prompt words (random weights: the vocabulary does not change the cost).

    python bench/bench_sd3_gpu.py [--json PATH]
    python bench/bench_sd3_gpu.py --tiny     # CPU smoke test: toy sizes, the same recipe and code path

Reported: the step's rollout and total seconds (the trainer's ``perf/rollout_s`` / ``perf/step_s``), the
policy's parameter counts and the peak GPU memory.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

# The published Stable Diffusion 3.5 Medium transformer and VAE configurations.
SD35_MEDIUM_TRANSFORMER = {"sample_size": 128, "patch_size": 2, "in_channels": 16, "num_layers": 24,
                           "attention_head_dim": 64, "num_attention_heads": 24, "joint_attention_dim": 4096,
                           "caption_projection_dim": 1536, "pooled_projection_dim": 2048, "out_channels": 16,
                           "pos_embed_max_size": 384, "dual_attention_layers": tuple(range(13)), "qk_norm": "rms_norm"}
SD3_VAE = {"in_channels": 3, "out_channels": 3, "latent_channels": 16, "block_out_channels": (128, 256, 512, 512),
           "down_block_types": ("DownEncoderBlock2D",) * 4, "up_block_types": ("UpDecoderBlock2D",) * 4,
           "layers_per_block": 2, "norm_num_groups": 32, "sample_size": 1024, "scaling_factor": 1.5305,
           "shift_factor": 0.0609, "use_quant_conv": False, "use_post_quant_conv": False}
CLIP_L = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
          "projection_dim": 768}
CLIP_BIG_G = {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 20,
              "projection_dim": 1280}
T5_XXL_WIDTH_ONE_LAYER = {"d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_heads": 64, "num_layers": 1,
                          "feed_forward_proj": "gated-gelu"}

# Toy sizes of the same components and layout (dual attention, QK-norm), for the CPU smoke test.
TINY_TRANSFORMER = {"sample_size": 8, "patch_size": 2, "in_channels": 4, "num_layers": 1, "attention_head_dim": 8,
                    "num_attention_heads": 2, "joint_attention_dim": 32, "caption_projection_dim": 16,
                    "pooled_projection_dim": 32, "out_channels": 4, "pos_embed_max_size": 8,
                    "dual_attention_layers": (0,), "qk_norm": "rms_norm"}
TINY_VAE = {"in_channels": 3, "out_channels": 3, "latent_channels": 4, "block_out_channels": (8, 16),
            "down_block_types": ("DownEncoderBlock2D",) * 2, "up_block_types": ("UpDecoderBlock2D",) * 2,
            "norm_num_groups": 8, "sample_size": 16, "shift_factor": 0.1, "scaling_factor": 1.5}
TINY_CLIP = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
             "projection_dim": 16}
TINY_T5 = {"d_model": 32, "d_kv": 8, "d_ff": 32, "num_heads": 2, "num_layers": 1}


def build_sd3_folder(folder: Path, tiny: bool, device: str) -> Path:
    """A random-weight SD3 pipeline folder (bf16 weights), built on ``device``."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    from mmrl.models.imagegen_pretrain import word_tokenizer
    from mmrl.tasks.imagegen import prompt_vocabulary

    torch.manual_seed(0)
    tokenizer = word_tokenizer(prompt_vocabulary())
    if not tiny:
        tokenizer.model_max_length = 77  # CLIP's context, as in SD3

    def clip(sizes: dict) -> CLIPTextModelWithProjection:
        return CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=len(tokenizer), max_position_embeddings=tokenizer.model_max_length, pad_token_id=0,
            eos_token_id=1, bos_token_id=1, **sizes))

    with torch.device(device):
        transformer = SD3Transformer2DModel(**(TINY_TRANSFORMER if tiny else SD35_MEDIUM_TRANSFORMER))
        vae = AutoencoderKL(**(TINY_VAE if tiny else SD3_VAE))
        encoders = (clip(TINY_CLIP), clip(TINY_CLIP)) if tiny else (clip(CLIP_L), clip(CLIP_BIG_G))
        t5 = T5EncoderModel(T5Config(vocab_size=len(tokenizer), **(TINY_T5 if tiny else T5_XXL_WIDTH_ONE_LAYER)))
    modules = {"transformer": transformer, "vae": vae, "text_encoder": encoders[0], "text_encoder_2": encoders[1],
               "text_encoder_3": t5}
    StableDiffusion3Pipeline(**{name: module.to(torch.bfloat16) for name, module in modules.items()},
                             scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), tokenizer=tokenizer,
                             tokenizer_2=tokenizer, tokenizer_3=tokenizer).save_pretrained(folder)
    return folder


def recipe_overrides(folder: Path, tiny: bool) -> list[str]:
    """The GPU recipe (bf16 autocast, also on CPU) reduced to one short step; toy sizes for the smoke test."""
    common = [f"policy.args.pretrained={folder}", "rollout.prompts_per_step=2", "rollout.group_size=4",
              "trainer.steps=1", "trainer.micro_batch_size=1", "eval.num_examples=2", "checkpoint.every=0",
              "log.progress=false", "log.tensorboard=false"]
    if not tiny:
        return [*common, "policy.args.eval_num_steps=10"]
    return [*common, "task.args.size=16", "policy.args.max_sequence_length=8", "policy.args.lora_rank=2",
            "policy.args.num_steps=3", "policy.args.train_window=[0, 2]", "policy.args.eval_num_steps=3"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="toy sizes on CPU (a smoke test of this script)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args()
    device = "cpu" if args.tiny else "cuda"
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("bench_sd3_gpu.py needs a CUDA device (use --tiny for a CPU smoke test)")

    from mmrl.core.config import load_config
    from mmrl.core.logging import read_metrics
    from mmrl.core.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="mmrl_sd3_") as tmp:
        start = time.perf_counter()
        folder = build_sd3_folder(Path(tmp) / "sd3", args.tiny, device)
        build_s = time.perf_counter() - start
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        cfg = load_config("flow_grpo/sd3_5_medium_lora_gpu", recipe_overrides(folder, args.tiny))
        start = time.perf_counter()
        trainer = Trainer(cfg, Path(tmp) / "run")
        load_s = time.perf_counter() - start
        params = sum(p.numel() for p in trainer.policy.unet.parameters())
        trainable = sum(p.numel() for p in trainer.policy.parameters() if p.requires_grad)
        trainer.train()
        row = read_metrics(Path(tmp) / "run")[-1]
    result = {"model": "toy SD3" if args.tiny else "SD3.5-Medium shapes (1-layer T5), random weights",
              "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "transformer_params_b": params / 1e9, "trainable_params_m": trainable / 1e6,
              "image_size": cfg.task.args.size, "rows": cfg.rollout.prompts_per_step * cfg.rollout.group_size,
              "num_steps": cfg.policy.args.num_steps, "build_folder_s": build_s, "load_policy_s": load_s, "policy_dtype": str(next(trainer.policy.unet.parameters()).dtype),
              "rollout_s": row["perf/rollout_s"], "step_s": row["perf/step_s"],
              "skipped_updates": row["train/skipped_updates"], "reward_mean": row["reward/mean"],
              "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0}
    print(json.dumps(result, indent=1))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
