"""Full-size Qwen2.5-VL-3B on one GPU, random weights (no download; speed does not depend on the
weights): rollout tokens/s of the HF sampler, GRPO update step time, peak GPU memory.

The architecture is Qwen2.5-VL-3B-Instruct's published config (below); the processor is the
embedded tiny one (a tokenizer's vocabulary does not change the model's cost: the embedding and
LM head keep the full 151,936 rows). Images are the sanity task's drawings at 448 px (256 image
tokens each); with random weights completions never stop early, so every row samples
``--max-new-tokens`` tokens.

    python bench/bench_vlm_gpu.py [--prompts 8] [--group-size 8] [--max-new-tokens 128] [--lora 0]
    python bench/bench_vlm_gpu.py --sampler vllm      # the colocated vLLM engine (its own environment)
    python bench/bench_vlm_gpu.py --tiny     # CPU smoke test of this script on the tiny model

With ``--sampler vllm`` the engine starts from a temporary folder of the random weights, and each
repeat's optimizer step is followed by the weight push to the engine before the next rollout (the
trainer's order): its time is ``weight_sync_s``. ``--json PATH`` writes the numbers (bench/gpu_check.sh).

Needs a CUDA device (bf16, sdpa). Not run in CI.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

QWEN2_5_VL_3B = {
    "model_type": "qwen2_5_vl", "tie_word_embeddings": True,
    "text_config": {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                    "num_attention_heads": 16, "num_key_value_heads": 2, "max_position_embeddings": 128000,
                    "rms_norm_eps": 1e-6, "vocab_size": 151936, "tie_word_embeddings": True,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]}},
    "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                      "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                      "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2},
}


def build_policy(args):
    from transformers import AutoConfig, AutoModelForImageTextToText

    from mmrl.models.tiny_vlm import build_processor, load_spec
    from mmrl.policies.lora import add_lora
    from mmrl.policies.vlm import VLMConfig, VLMPolicy

    spec = load_spec("vlm/qwen2_5_vl_tiny.json")
    cfg = VLMConfig(model_spec="vlm/qwen2_5_vl_tiny.json", max_pixels=args.image_size ** 2,
                    min_pixels=min(3136, args.image_size ** 2), max_prompt_tokens=4096,
                    attn_implementation="sdpa", lora_rank=args.lora, gradient_checkpointing=args.gradient_checkpointing,
                    sampler=args.sampler)
    processor = build_processor(spec)
    tok = processor.tokenizer
    if args.tiny:
        from mmrl.models.tiny_vlm import build_tiny_vlm

        model, processor = build_tiny_vlm("vlm/qwen2_5_vl_tiny.json", 0)
    else:
        data = {k: v for k, v in QWEN2_5_VL_3B.items() if k != "model_type"}
        ids = {k: tok.convert_tokens_to_ids(t) for k, t in (("image_token_id", "<|image_pad|>"),
                                                             ("video_token_id", "<|video_pad|>"),
                                                             ("vision_start_token_id", "<|vision_start|>"),
                                                             ("vision_end_token_id", "<|vision_end|>"))}
        data["text_config"] = {**data["text_config"], "pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id}
        config = AutoConfig.for_model("qwen2_5_vl", **data, **ids)
        config._attn_implementation = "sdpa"
        torch.manual_seed(0)
        with torch.device(args.device):
            model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    policy = VLMPolicy(model, processor, cfg)
    if args.lora:
        policy.model = add_lora(policy.model, args.lora, 2.0 * args.lora, 0.0, cfg.lora_target_modules, 0)
        policy.lora = True
    return policy.to(args.device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--micro-batch", type=int, default=16, help="rows per forward/backward in the update")
    parser.add_argument("--lora", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--sampler", choices=["hf", "vllm"], default="hf",
                        help="hf: transformers generate; vllm: the colocated vLLM engine (needs vllm and a GPU)")
    parser.add_argument("--tiny", action="store_true", help="the tiny model on CPU (a smoke test of this script)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args()
    args.device = "cpu" if args.tiny else "cuda"
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("bench_vlm_gpu.py needs a CUDA device (use --tiny for a CPU smoke test)")
    if args.sampler == "vllm" and args.device != "cuda":
        raise SystemExit("bench_vlm_gpu.py --sampler vllm needs a CUDA device")

    from mmrl.core.registry import make_task
    from mmrl.core.rollout import SamplingParams

    policy = build_policy(args)
    params = sum(p.numel() for p in policy.parameters())
    task = make_task("vlm_sanity/shape_color-v0", {"image_size": args.image_size})
    examples = task.sample_batch("train", args.prompts, np.random.default_rng(0))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-6)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    rates, steps, syncs, peaks = [], [], [], []
    for repeat in range(args.repeats + 1):  # repeat 0 warms up
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync()
        start = time.perf_counter()
        rollout = policy.rollout(examples, args.group_size, sampling, seed=repeat)
        sync()
        rollout_s = time.perf_counter() - start
        rollout_peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else 0.0
        advantages = torch.randn(rollout.num_rows, 1).expand_as(rollout.mask)
        start = time.perf_counter()
        policy.train()
        for rows in torch.arange(rollout.num_rows).split(args.micro_batch):
            part = rollout.select(rows)
            out = policy(part)
            ratio = torch.exp(out.logp.float() - part.logp.to(out.logp.device))
            mask, adv = part.mask.to(out.logp.device), advantages[rows].to(out.logp.device)
            loss = -(torch.minimum(ratio * adv, ratio.clamp(0.8, 1.28) * adv) * mask).sum() / rollout.mask.sum()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        policy.version += 1  # as the trainer does: the next rollout pushes the new weights to an engine
        sync()
        step_s = time.perf_counter() - start
        # The weight push of this repeat's rollout (0 for the HF sampler, and for repeat 0's engine start).
        weight_sync_s = float(rollout.stats.get("perf/weight_sync_s", 0.0))
        if repeat:
            rates.append(float(rollout.mask.sum()) / rollout_s)
            steps.append(step_s)
            syncs.append(weight_sync_s)
            peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else 0.0
            peaks.append((rollout_peak, peak))
            print(f"repeat {repeat}: rollout {rollout_s:.2f}s ({rates[-1]:.0f} tok/s, peak {rollout_peak:.1f} GiB, "
                  f"weight sync {weight_sync_s:.2f}s), update {step_s:.2f}s (peak {peak:.1f} GiB)")
    name = "tiny" if args.tiny else "Qwen2.5-VL-3B"
    print(f"{name} ({params / 1e9:.2f} B params, {'LoRA r=' + str(args.lora) if args.lora else 'full'}, "
          f"{args.sampler} sampler), {args.prompts}x{args.group_size} rows, {args.image_size} px, {args.max_new_tokens} "
          f"new tokens: rollout {statistics.median(rates):.0f} tok/s, update step {statistics.median(steps):.2f} s, "
          f"weight sync {statistics.median(syncs):.2f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "model": name, "params_b": params / 1e9, "sampler": args.sampler, "lora_rank": args.lora,
            "gradient_checkpointing": args.gradient_checkpointing, "rows": args.prompts * args.group_size,
            "image_size": args.image_size, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
            "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "rollout_tokens_per_s": statistics.median(rates), "update_step_s": statistics.median(steps),
            "weight_sync_s": statistics.median(syncs), "rollout_peak_gib": max(p[0] for p in peaks),
            "update_peak_gib": max(p[1] for p in peaks)}, indent=1))


if __name__ == "__main__":
    main()
