"""The VLA on the embedded tiny Qwen2.5-VL (``policy: vla_vlm``): the action-token mapping, constrained
decoding, log-probs against a plain transformers forward under the same mask, the value head, LoRA and the
adapter-disabled reference, behaviour cloning, PPO and GRPO through the trainer, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mmrl.core.config import ConfigError, load_config
from mmrl.core.registry import make_policy, make_task
from mmrl.core.rollout import Rollout, SamplingParams
from mmrl.core.trainer import train
from mmrl.core.warm_start import warm_start_key
from mmrl.policies.vla import detokenize_actions, tokenize_actions
from mmrl.policies.vla_vlm import VLAVLMPayload, action_token_ids
from mmrl.tasks.robot import Demonstration

SPEC = "vlm/qwen2_5_vl_tiny.json"
# 56 px frames are a multiple of Qwen2.5-VL's 28 px merge window: no resize anywhere, so the plain
# processor call of the parity test sees exactly the policy's pixels (4 image tokens).
SMALL = {"image_size": 56, "action_dims": 2, "max_decisions": 6, "num_envs": 4}


def vla_vlm(**args):
    backbone = {"model_spec": SPEC, "max_prompt_tokens": 256, **args.pop("backbone", {})}
    return make_policy("vla_vlm", {**SMALL, "backbone": backbone, **args})


def reach_examples(n: int, split: str = "train"):
    return make_task("robot/reach-v0", {"image_size": 56}).sample_batch(split, n, np.random.default_rng(0))


@pytest.fixture(scope="module")
def policy():
    return vla_vlm(chunk=2)


@pytest.fixture(scope="module")
def rollout(policy):
    return policy.rollout(reach_examples(2), 2, SamplingParams(temperature=1.0), seed=0)


def test_action_token_mapping_round_trip(policy):
    tokenizer = policy.backbone.processor.tokenizer
    ids = policy.action_ids.tolist()
    special = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    ordinary = [i for i in range(len(tokenizer)) if i not in special]
    assert ids == ordinary[-256:] and ids == sorted(set(ids))  # the last 256 ordinary ids, ascending
    assert not set(ids) & special and ids[-1] == len(tokenizer) - 1
    bins = torch.arange(256)
    assert torch.equal(torch.searchsorted(policy.action_ids, policy.action_ids[bins]), bins)  # bin → id → bin
    x = torch.linspace(-1, 1, 513)
    centres = detokenize_actions(tokenize_actions(x, 256), 256)
    assert (centres - x).abs().max() <= 1 / 256 + 1e-6  # action → bin → executed centre: within half a bin
    with pytest.raises(ConfigError, match="exceeds the .* ordinary tokens"):
        action_token_ids(tokenizer, len(tokenizer))


def test_sampling_emits_only_action_tokens_of_fixed_length(policy):
    hot = policy.rollout(reach_examples(2), 2, SamplingParams(temperature=5.0), seed=1)  # near-uniform
    p: VLAVLMPayload = hot.payload
    assert p.actions.shape == (*hot.mask.shape, 2 * 2)  # chunk × action_dims tokens per decision
    real = p.actions[hot.mask > 0]
    assert real.min() >= 0 and real.max() < 256 and real.unique().numel() > 64
    prompts = policy.encode(p.images[:, 0].numpy(), p.proprio[:, 0].numpy(), list(p.instructions))
    bins, _, _ = policy.decode(prompts, 5.0, torch.Generator().manual_seed(0))
    assert bins.shape == (4, 4) and bins.min() >= 0 and bins.max() < 256
    # Unconstrained, most of the next-token mass lies off the action ids: the mask is what keeps samples on them.
    with torch.no_grad():
        logits = policy.backbone.model(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                                       mm_token_type_ids=prompts.mm_token_type_ids, **prompts.vision_inputs()).logits
    on_actions = torch.softmax(logits[:, -1] / 5.0, -1)[:, policy.action_ids].sum(-1)
    assert (on_actions < 0.6).all(), on_actions
    greedy = [policy.rollout(reach_examples(2), 1, SamplingParams(temperature=0.0), seed=s) for s in (0, 9)]
    assert torch.equal(greedy[0].payload.actions, greedy[1].payload.actions)
    state = torch.random.get_rng_state()
    again = policy.rollout(reach_examples(2), 2, SamplingParams(temperature=5.0), seed=1)
    assert torch.equal(again.payload.actions, p.actions) and torch.equal(torch.random.get_rng_state(), state)


def test_logprobs_equal_a_plain_transformers_forward_under_the_same_mask(policy, rollout):
    """Decisions re-built with the processor alone, one plain forward, full-vocabulary log-softmax with every
    non-action id at −inf: the same numbers as the sampler's and the policy's re-scoring."""
    p: VLAVLMPayload = rollout.payload
    out = policy(rollout, with_entropy=True)
    assert ((out.logp - rollout.logp).abs() * rollout.mask).max() < 1e-5  # on-policy ratio 1
    processor, model = policy.backbone.processor, policy.backbone.model
    from PIL import Image

    for row, step in [(0, 0), (1, 2), (3, 1)]:
        state = " ".join(f"{x:+.2f}" for x in p.proprio[row, step].tolist())
        text = f"What action should the robot take to {p.instructions[row]}? State: {state}"
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
        prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        enc = processor(text=[prompt], images=[Image.fromarray(p.images[row, step].numpy())], return_tensors="pt")
        actions = policy.action_ids[p.actions[row, step]][None]  # [1, K] vocabulary ids
        ids = torch.cat([enc["input_ids"], actions], 1)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=enc["pixel_values"],
                           image_grid_thw=enc["image_grid_thw"],
                           mm_token_type_ids=torch.nn.functional.pad(enc["mm_token_type_ids"], (0, actions.shape[1])),
                           ).logits[0, enc["input_ids"].shape[1] - 1:-1]  # [K, V]: predictions of the action tokens
        masked = torch.full_like(logits, float("-inf"))
        masked[:, policy.action_ids] = logits[:, policy.action_ids]
        expected = torch.log_softmax(masked.float(), -1).gather(-1, actions[0, :, None]).sum()
        assert abs(float(expected) - float(rollout.logp[row, step])) < 1e-5
        assert abs(float(expected) - float(out.logp[row, step].detach())) < 1e-5


def test_value_head_reads_the_state_before_the_actions_and_trains_the_backbone(policy, rollout):
    out = policy(rollout)
    assert out.values.shape == rollout.mask.shape
    assert torch.allclose(out.values, rollout.values, atol=1e-5)
    assert ((out.values != 0) == (rollout.mask > 0)).all()
    policy.zero_grad(set_to_none=True)
    out.values.sum().backward()
    grads = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert any(n.startswith("value.") for n in grads) and any(".visual." in n for n in grads)  # shared trunk
    policy.zero_grad(set_to_none=True)
    assert make_policy("vla_vlm", {**SMALL, "value_head": False}).rollout(
        reach_examples(1), 1, SamplingParams(1.0), seed=0).values is None


def test_a_stop_gradient_critic_trains_only_its_head_and_keeps_the_warm_start(rollout):
    policy = vla_vlm(chunk=2, value_stop_gradient=True)
    out = policy(rollout)
    assert torch.allclose(out.values, vla_vlm(chunk=2)(rollout).values)  # the same critic, read the same way
    out.values.sum().backward()
    grads = {n for n, p in policy.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads and all(n.startswith("value.") for n in grads)
    out.logp.sum().backward()  # the policy loss still trains the backbone
    assert any(".visual." in n for n, p in policy.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0)
    # RL-only: the BC warm start does not read it, so both settings share one cached warm start
    recipe = "metaworld/vla_vlm_tiny_cpu"
    assert warm_start_key(load_config(recipe)) == warm_start_key(
        load_config(recipe, ["policy.args.value_stop_gradient=true"]))


def test_payload_select_and_concat(policy, rollout):
    short = policy.rollout(reach_examples(1, "test"), 1, SamplingParams(1.0), seed=3)
    both = Rollout.concat([rollout, short])
    assert both.payload.images.shape[:2] == both.mask.shape and len(both.payload.instructions) == 5
    sub = both.select(torch.tensor([4, 1]))
    assert ((policy(sub).logp - sub.logp).abs() * sub.mask).max() < 1e-5
    with pytest.raises(ValueError, match="temperatures"):
        VLAVLMPayload.concat([rollout.payload, policy.rollout(reach_examples(1), 1, SamplingParams(0.5), 0).payload])


def test_lora_reference_and_save_load_round_trip(rollout, tmp_path):
    lora = vla_vlm(chunk=2, backbone={"lora_rank": 4})
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or n.startswith("value.") for n in trainable)
    base = lora(rollout).logp.detach()
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name or name.startswith("value."):
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    trained = lora(rollout)
    assert not torch.allclose(trained.logp, base)
    with lora.adapter_disabled():
        assert torch.allclose(lora(rollout).logp, base, atol=1e-6)  # the KL reference: adapters off
    lora.save_pretrained(str(tmp_path / "lora"))
    for name in ("adapter_config.json", "value_head.safetensors", "vla_vlm.json"):
        assert (tmp_path / "lora" / name).is_file(), name
    fresh = vla_vlm(chunk=2, backbone={"lora_rank": 4})  # the same base, untrained adapters and value head
    assert not torch.allclose(fresh(rollout).values, trained.values)
    fresh.load_weights(str(tmp_path / "lora"))
    again = fresh(rollout)
    assert torch.allclose(again.logp, trained.logp, atol=1e-6) and torch.allclose(again.values, trained.values)
    with pytest.raises(FileNotFoundError, match="vla_vlm"):
        fresh.load_weights(str(tmp_path / "nothing"))


def test_behaviour_cloning_lowers_the_loss():
    task = make_task("robot/reach-v0", {"image_size": 56})
    p = vla_vlm()
    fixed = task.sample_batch("train", 2, np.random.default_rng(1))
    demos = [task.reference_output(e) for e in fixed]
    optimizer = torch.optim.AdamW(p.parameters(), lr=3e-3)
    start = p.sft_loss(fixed, demos).item()
    assert start == pytest.approx(np.log(256), abs=0.3)  # untrained: about uniform over the 256 action tokens
    for _ in range(15):
        loss = p.sft_loss(fixed, demos)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert p.sft_loss(fixed, demos).item() < start - 1.0


def test_bad_input_errors_clearly(policy):
    task = make_task("robot/reach-v0", {"image_size": 56})
    example = task.sample_batch("train", 1, np.random.default_rng(0))
    demo = task.reference_output(example[0])

    def altered(**changes) -> Demonstration:
        return Demonstration(**{**demo.__dict__, **changes})

    with pytest.raises(ValueError, match=r"demonstration 0: actions must be \[T, 2\].*action_dims"):
        policy.sft_loss(example, [altered(actions=np.zeros((len(demo.actions), 4), np.float32))])
    nan = demo.actions.copy()
    nan[3, 1] = np.nan
    with pytest.raises(ValueError, match="demonstration 0: actions hold NaN"):
        policy.sft_loss(example, [altered(actions=nan)])
    with pytest.raises(ValueError, match="image_size"):
        policy.sft_loss(example, [altered(images=demo.images[:, :32, :32])])
    frames = demo.images[:2]
    with pytest.raises(ValueError, match=r"proprio must be \[B, 4\].*proprio_dims"):
        policy.encode(frames, np.zeros((2, 3), np.float32), ["reach", "reach"])
    with pytest.raises(ValueError, match="proprio holds NaN"):
        policy.encode(frames, np.full((2, 4), np.nan, np.float32), ["reach", "reach"])
    with pytest.raises(ConfigError, match="backbone.sampler must be hf"):
        make_policy("vla_vlm", {"backbone": {"model_spec": SPEC, "sampler": "vllm"}})
    with pytest.raises(ConfigError, match="instruction_template"):
        make_policy("vla_vlm", {"instruction_template": "Do it."})


RUN = ["log.tensorboard=false", "task.args.image_size=56", "policy.args.image_size=56", "policy.args.max_decisions=5",
       "warm_start.sft_steps=2", "trainer.steps=2", "trainer.minibatches=1", "eval.num_examples=2",
       "eval.extra_splits=[]", "checkpoint.every=0", "checkpoint.best_metric=null", "policy.args.backbone.min_pixels=3136",
       "policy.args.backbone.max_pixels=3136"]


@pytest.mark.parametrize("recipe, extra", [
    ("vla_reach/vla_vlm_tiny_cpu", ["rollout.prompts_per_step=2"]),  # PPO with GAE (value loss)
    ("vla_reach/vla_vlm_grpo_tiny_cpu", ["rollout.prompts_per_step=2", "rollout.group_size=2"]),  # same-seed groups
])
def test_ppo_and_grpo_train_end_to_end(tmp_path, recipe, extra):
    cfg = load_config(recipe, [*RUN, *extra])
    train(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and "eval/success_rate" in rows[-1] and rows[1]["rollout/len_mean"] == 5
    assert all(np.isfinite(rows[k]["loss/policy"]) for k in (1, 2))
    assert ("loss/value" in rows[1]) == (cfg.algo.advantage == "gae")
    assert (tmp_path / "run" / "checkpoints").is_dir()


@pytest.mark.parametrize("recipe", ["metaworld/vla_vlm_tiny_cpu", "metaworld/vla_vlm_grpo_tiny_cpu",
                                    "metaworld/qwen2_5_vl_3b_gpu",
                                    "vla_reach/vla_vlm_tiny_cpu", "vla_reach/vla_vlm_grpo_tiny_cpu"])
def test_recipes_validate(recipe):
    cfg = load_config(recipe)
    assert cfg.policy.name == "vla_vlm" and cfg.warm_start.sft_steps > 0
    if cfg.algo.advantage == "gae":
        assert cfg.rollout.group_size == 1 and cfg.policy.args.value_head
    else:
        assert cfg.algo.advantage == "grpo" and cfg.rollout.group_size > 1


def test_mmrl_bc_saves_a_folder_that_seeds_rl(tmp_path):
    """``mmrl bc`` writes the backbone, the value head and the action mapping; ``warm_start.init_from`` starts
    RL from it with the same log-probs."""
    from mmrl.cli import main

    out = tmp_path / "bc"
    assert main(["bc", "vla_reach/vla_vlm_tiny_cpu", "--out", str(out), *RUN[:4], "warm_start.sft_steps=3",
                 *RUN[-2:]]) == 0
    assert len(json.loads((out / "sft_losses.json").read_text())) == 3
    saved = json.loads((out / "vla_vlm.json").read_text())
    assert saved["bins"] == 256 and len(saved["action_token_ids"]) == 256 and (out / "value_head.safetensors").is_file()
    cfg = load_config("vla_reach/vla_vlm_tiny_cpu", [*RUN, "warm_start.sft_steps=0", f"warm_start.init_from={out}"])
    from mmrl.core.warm_start import build_initial_policy

    started, fresh = build_initial_policy(cfg), make_policy("vla_vlm", cfg.policy.args)
    rollout = started.rollout(reach_examples(1), 1, SamplingParams(1.0), seed=0)
    assert torch.allclose(started(rollout).logp, rollout.logp, atol=1e-5)
    assert not torch.allclose(fresh(rollout).logp, rollout.logp, atol=1e-3)
