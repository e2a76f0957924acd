"""Train a vision-language policy (SFT warm start → GRPO) on a VQA task with verifiable rewards.

    python scripts/train_vlm.py --out runs/vlm_sanity                       # tiny Qwen2.5-VL, CPU, minutes
    python scripts/train_vlm.py --out runs/vlm_3b --recipe configs/vlm_sanity/qwen2_5_vl_3b_gpu.yaml
    python scripts/train_vlm.py --out runs/vlm_7b --recipe configs/vlm_sanity/qwen2_5_vl_7b_gpu.yaml  # LoRA + vLLM
    python scripts/train_vlm.py --out runs/x policy.args.max_pixels=50176 trainer.lr=3e-4
    accelerate launch --config_file configs/accelerate/multi_gpu_ddp.yaml scripts/train_vlm.py \\
        --recipe configs/vlm_sanity/qwen3_vl_4b_gpu.yaml --out runs/q3_4b

Related: `mmrl init-model vlm/qwen2_5_vl_tiny.json --out models/tiny_vlm` (the embedded model as a
plain HF folder), `mmrl sft <recipe> --out DIR` (the warm start alone), `mmrl export
RUN/checkpoints/step_N/policy --out DIR` (LoRA merged into a plain HF checkpoint).
The same implementation as ``mmrl train``: a recipe, dotted overrides, one trainer loop.
"""

from mmrl.cli import exit_process, script_main

if __name__ == "__main__":
    exit_process(script_main("configs/vlm_sanity/tiny_cpu.yaml", __doc__))
