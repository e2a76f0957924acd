"""The VLM policy on the embedded tiny Qwen2.5-VL: on-policy re-scoring equals the sampler (and the
mm_token_type_ids fix is what makes it so), payload select/concat, image-token accounting, bad
input, save / load / LoRA / export, and offline reload of ``mmrl init-model`` folders."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmrl.cli import main
from mmrl.core.registry import make_policy
from mmrl.core.rollout import Rollout, SamplingParams
from mmrl.samplers.tokens import Completions

SPEC = "vlm/qwen2_5_vl_tiny.json"
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Example:
    prompt: str
    images: tuple
    system: str | None = None


def square(width: int, height: int, color: tuple[int, int, int]) -> Image.Image:
    image = Image.new("RGB", (width, height), (240, 240, 240))
    image.paste(color, (width // 4, height // 4, width // 2, height // 2))
    return image


def mixed_examples() -> list[Example]:
    """Image sizes 56², 84×56, 112² (4, 6, 16 image tokens), two images in one prompt, none in another."""
    return [Example("<image>What colour is the shape?", (square(56, 56, (220, 30, 30)),)),
            Example("Look: <image> then <image>. Are they the same colour? Answer yes or no.",
                    (square(84, 56, (30, 60, 220)), square(112, 112, (30, 60, 220)))),
            Example("How many shapes? Answer with a digit only.", ()),
            Example("<image>Colour?", (square(112, 112, (30, 170, 40)),), "Answer briefly.")]


def tiny_policy(**args):
    return make_policy("vlm", {"model_spec": SPEC, "max_prompt_tokens": 256, **args})


@pytest.fixture(scope="module")
def policy():
    return tiny_policy()


@pytest.fixture(scope="module")
def rollout(policy):
    return policy.rollout(mixed_examples(), 3, SamplingParams(temperature=1.0, max_new_tokens=10), seed=5)


def test_on_policy_logprobs_equal_the_samplers_and_need_token_types(policy, rollout):
    prompts = rollout.payload.row_prompts()
    assert prompts.images_per_row.tolist() == [1] * 3 + [2] * 3 + [0] * 3 + [1] * 3
    assert sorted(set(prompts.image_grid_thw.prod(-1).tolist())) == [16, 24, 64]  # patches: 4, 6, 16 tokens
    assert len(set(prompts.attention_mask.sum(1).tolist())) == 4  # four prompt lengths: left padding varies
    out = policy(rollout, with_entropy=True)
    diff = ((out.logp - rollout.logp) * rollout.mask).abs()
    assert diff.max() < 1e-5
    ratio = torch.exp(out.logp - rollout.logp)[rollout.mask > 0]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5)
    # Without mm_token_type_ids Qwen2.5-VL silently uses 1-D positions: the ratio is no longer 1.
    wrong = policy.score(rollout.payload, with_token_types=False)
    image_rows = prompts.images_per_row > 0
    assert ((wrong.logp - rollout.logp) * rollout.mask)[image_rows].abs().max() > 1e-4
    text_rows = ~image_rows  # text-only rows are unaffected
    assert ((wrong.logp - rollout.logp) * rollout.mask)[text_rows].abs().max() < 1e-5


def test_logprobs_have_gradients_through_the_vision_tower(policy, rollout):
    policy.zero_grad(set_to_none=True)
    policy(rollout).logp.sum().backward()
    vision = [p.grad for n, p in policy.named_parameters() if ".visual." in n]
    assert vision and any(g is not None and g.abs().sum() > 0 for g in vision)
    policy.zero_grad(set_to_none=True)


def test_payload_select_and_concat_round_trip(policy, rollout):
    order = torch.tensor([7, 0, 4, 11, 8, 2, 5, 1, 3, 9, 6, 10])
    parts = [rollout.select(order[:5]), rollout.select(order[5:])]
    joined = Rollout.concat(parts)
    direct = rollout.select(order)
    pj, pd = joined.payload.row_prompts(), direct.payload.row_prompts()
    for name in ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw", "images_per_row"):
        assert torch.equal(getattr(pj, name), getattr(pd, name)), name
    assert torch.equal(joined.payload.completion_ids, direct.payload.completion_ids)
    assert pj.texts == pd.texts
    # Sampler measurements (perf/weight_sync_s) travel with rows and add up over concatenated rollouts.
    timed = [p.replace(stats={"perf/weight_sync_s": 0.25}) for p in parts]
    assert Rollout.concat(timed).stats == {"perf/weight_sync_s": 0.5}
    assert timed[0].select(torch.tensor([0])).stats == {"perf/weight_sync_s": 0.25}
    # Each selected row carries its own images: re-scoring the permuted rows equals permuting the scores.
    full = policy(rollout).logp
    assert torch.allclose(policy(joined).logp, full[order], atol=1e-5)
    text_only = rollout.select(torch.tensor([6, 8]))
    assert text_only.payload.row_prompts().pixel_values is None and text_only.payload.row_prompts().image_grid_thw is None
    assert ((policy(text_only).logp - text_only.logp).abs() * text_only.mask).max() < 1e-5
    text_rollout = policy.rollout(mixed_examples()[2:3], 3, SamplingParams(max_new_tokens=8), seed=4)  # no image at all
    assert ((policy(text_rollout).logp - text_rollout.logp).abs() * text_rollout.mask).max() < 1e-5


def test_rollouts_are_seeded_and_greedy_chunked_generation_matches(policy):
    examples = mixed_examples()
    params = SamplingParams(max_new_tokens=8)
    a, b = (policy.rollout(examples, 2, params, seed=1) for _ in range(2))
    assert a.outputs == b.outputs and torch.equal(a.logp, b.logp)
    assert a.outputs != policy.rollout(examples, 2, params, seed=2).outputs
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    chunked = tiny_policy(generation_batch_rows=3)
    assert policy.rollout(examples, 2, greedy, seed=0).outputs == chunked.rollout(examples, 2, greedy, seed=0).outputs


def test_vision_and_special_tokens_are_never_sampled_and_are_cut(policy):
    rollout = policy.rollout(mixed_examples(), 8, SamplingParams(temperature=3.0, max_new_tokens=12), seed=0)
    sampled = rollout.payload.completion_ids[rollout.payload.completion_mask > 0]
    assert not torch.isin(sampled, policy.suppressed).any()
    image_pad = policy.processor.image_token_id
    assert image_pad in policy.suppressed.tolist()
    eos, pad = policy.eos_ids[0], policy.rules.pad_id
    ids = torch.tensor([[100, 101, image_pad, 102, eos], [image_pad, 103, eos, pad, pad]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    cut = policy.end_at_disallowed(Completions(ids, mask, -torch.ones(2, 5), 0))
    assert cut.mask.tolist() == [[1, 1, 0, 0, 0], [0, 0, 0, 0, 0]]
    assert (cut.logp[cut.mask == 0] == 0).all() and (cut.ids[cut.mask == 0] == pad).all()


def test_prompt_length_is_checked_up_front_naming_both_numbers():
    small = tiny_policy(max_prompt_tokens=30)
    with pytest.raises(ValueError, match=r"text tokens \+ 16 image tokens = \d+ > policy.args.max_prompt_tokens = 30"):
        small.encode([Example("<image>Colour?", (square(112, 112, (1, 2, 3)),))])
    budget = tiny_policy(max_pixels=56 * 56)  # a lower budget shrinks the image to 4 tokens
    prompts = budget.encode([Example("<image>Colour?", (square(112, 112, (1, 2, 3)),))])
    assert int((prompts.input_ids == budget.processor.image_token_id).sum()) == 4


def test_bad_input_gives_clear_errors(policy, tmp_path):
    with pytest.raises(ValueError, match=r"1 <image> placeholder\(s\) but 2 image\(s\)"):
        policy.encode([Example("<image>x", (square(56, 56, (0, 0, 0)), square(56, 56, (0, 0, 0))))])
    with pytest.raises(ValueError, match=r"0 <image> placeholder\(s\) but 1 image"):
        policy.encode([Example("no placeholder", (square(56, 56, (0, 0, 0)),))])
    with pytest.raises(TypeError, match="must be a PIL.Image"):
        policy.encode([Example("<image>x", ("picture.png",))])
    buffer = io.BytesIO()
    square(56, 56, (9, 9, 9)).save(buffer, format="PNG")
    corrupt = Image.open(io.BytesIO(buffer.getvalue()[:60]))  # header only: fails when decoded
    with pytest.raises(ValueError, match="example 0: image 0 is corrupt or truncated"):
        policy.encode([Example("<image>x", (corrupt,))])
    folder = tmp_path / "no_processor"
    policy.model.save_pretrained(folder)
    with pytest.raises(FileNotFoundError, match="has no processor"):
        make_policy("vlm", {"pretrained": str(folder)})
    with pytest.raises(ValueError, match="exactly one of pretrained"):
        make_policy("vlm", {})


def file_hash(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_init_model_is_deterministic_and_reloads_offline(tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        assert main(["init-model", SPEC, "--out", str(tmp_path / name), "--seed", str(seed)]) == 0
    assert file_hash(tmp_path / "a") == file_hash(tmp_path / "b") != file_hash(tmp_path / "c")
    assert main(["init-model", SPEC, "--out", str(tmp_path / "a")]) == 2  # refuses a non-empty folder
    code = ("import sys; from transformers import AutoProcessor, AutoModelForImageTextToText as M;"
            "p = AutoProcessor.from_pretrained(sys.argv[1]); m = M.from_pretrained(sys.argv[1]);"
            "print(type(p).__name__, type(m).__name__, sum(x.numel() for x in m.parameters()))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    kind, model_kind, params = out.stdout.split()
    assert (kind, model_kind) == ("Qwen2_5_VLProcessor", "Qwen2_5_VLForConditionalGeneration")
    assert 5e5 < int(params) < 2e7
    reloaded = make_policy("vlm", {"pretrained": str(tmp_path / "a")})  # the policy loads the folder too
    built = tiny_policy()
    example = mixed_examples()[:1]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    assert reloaded.rollout(example, 1, greedy, 0).outputs == built.rollout(example, 1, greedy, 0).outputs


def test_full_save_load_round_trip(policy, rollout, tmp_path):
    other = tiny_policy(init_seed=3)
    assert not torch.allclose(other(rollout).logp, policy(rollout).logp)
    policy.save_pretrained(str(tmp_path / "p"))
    other.load_weights(str(tmp_path / "p"))
    assert torch.allclose(other(rollout).logp, policy(rollout).logp, atol=1e-6)


def test_lora_reference_save_load_and_merged_export(rollout, tmp_path):
    lora = tiny_policy(lora_rank=4)
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    base = lora(rollout).logp.detach()
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    trained = lora(rollout).logp.detach()
    assert not torch.allclose(trained, base)
    with lora.adapter_disabled():
        assert torch.allclose(lora(rollout).logp, base, atol=1e-6)  # the reference: adapters off
    merged_names = set(lora.hf_state_dict())  # what a vLLM engine receives
    assert merged_names == set(tiny_policy().model.state_dict())
    folder = tmp_path / "lora"
    lora.save_pretrained(str(folder))
    assert (folder / "adapter_config.json").is_file() and (folder / "base" / "config.json").is_file()
    fresh = tiny_policy(lora_rank=4)
    fresh.load_weights(str(folder))
    assert torch.allclose(fresh(rollout).logp, trained, atol=1e-6)
    with pytest.raises(FileNotFoundError, match="holds a LoRA adapter, not a full model: merge it first"):
        make_policy("vlm", {"pretrained": str(folder)})
    assert main(["export", str(folder), "--out", str(tmp_path / "merged")]) == 0
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    plain = make_policy("vlm", {"pretrained": str(tmp_path / "merged")})
    assert torch.allclose(plain(rollout).logp, trained, atol=1e-5)
    assert main(["export", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2


def test_sft_loss_falls_on_a_fixed_batch():
    policy = tiny_policy()
    examples = mixed_examples()
    targets = ["<think>I see one red square.</think><answer>red</answer>", "<think>same</think><answer>yes</answer>",
               "<answer>0</answer>", "<answer>green</answer>"]
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        loss = policy.sft_loss(examples, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    with pytest.raises(ValueError, match="SFT target 1 must be a non-empty string"):
        policy.sft_loss(examples[:2], ["ok", ""])


def test_qwen3_vl_spec_matches_on_policy_and_refuses_missing_token_types():
    """The same policy code over a tiny Qwen3-VL (16 px patches, deepstack, interleaved mRoPE)."""
    policy = make_policy("vlm", {"model_spec": "vlm/qwen3_vl_tiny.json", "max_prompt_tokens": 256})
    examples = [Example("<image>Colour?", (square(64, 64, (220, 30, 30)),)),
                Example("<image> or <image>?", (square(128, 128, (1, 2, 3)), square(96, 64, (4, 5, 6)))),
                Example("Text only.", ())]
    rollout = policy.rollout(examples, 2, SamplingParams(temperature=1.0, max_new_tokens=8), seed=0)
    assert sorted(set(rollout.payload.row_prompts().image_grid_thw.prod(-1).tolist())) == [16, 24, 64]
    assert ((policy(rollout).logp - rollout.logp).abs() * rollout.mask).max() < 1e-5
    with pytest.raises(ValueError, match="mm_token_type_ids"):
        policy.score(rollout.payload, with_token_types=False)


def test_given_outputs_are_scored_like_sft_targets_at_the_sampling_temperature(policy):
    """``rollout_from_outputs`` (ViSurf's reference rows, CalibRL's expert, Guide's re-scoring) on the VLM:
    one row per output, its log-probs those the SFT loss trains (at T = 1), tempered at another T."""
    examples = mixed_examples()
    outputs = ["red", "yes", "3", "green"]
    given = policy.rollout_from_outputs(examples, outputs, SamplingParams(temperature=1.0))
    assert given.group_id.tolist() == [0, 1, 2, 3] and given.outputs == outputs
    nll = -(given.logp.sum() / given.mask.sum())
    assert torch.allclose(nll, policy.sft_loss(examples, outputs).detach(), atol=1e-5)
    hot = policy.rollout_from_outputs(examples, outputs, SamplingParams(temperature=2.0))
    assert torch.equal(hot.mask, given.mask) and not torch.allclose(hot.logp, given.logp)
    empty = policy.rollout_from_outputs(examples[:1], [""], SamplingParams(temperature=1.0))
    assert empty.mask.sum() == 1  # an empty answer is its EOS alone


def test_a_follow_up_turn_is_a_chat_turn_after_the_answer(policy):
    from mmrl.core.contracts import FollowUp

    first = mixed_examples()[0]
    follow = FollowUp(first, (("assistant", "blue"), ("user", "No. Look again.")))
    roles = [m["role"] for m in policy.messages(follow, 0)]
    assert roles == ["user", "assistant", "user"]
    text = policy.encode([follow]).texts[0]
    assert text.index("blue") < text.index("No. Look again.") < text.rindex("assistant")
    rollout = policy.rollout([follow], 2, SamplingParams(temperature=1.0, max_new_tokens=4), seed=0)
    assert torch.allclose(policy(rollout).logp, rollout.logp, atol=1e-5)  # the earlier turns are context only


def test_an_answer_prefix_follows_the_generation_prompt(policy):
    from mmrl.core.contracts import Prefixed

    first = mixed_examples()[0]
    text = policy.encode([Prefixed(first, "<think></think>")]).texts[0]
    assert text == policy.encode([first]).texts[0] + "<think></think>"
