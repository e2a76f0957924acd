"""Video input of the VLM policy on the embedded tiny Qwen2.5-VL: on-policy re-scoring of video rows equals
the sampler's log-probs and a plain ``model(**processor(...))`` forward; Qwen2.5-VL's temporal positions
(``second_per_grid_ts``) matter; videos of different frame counts and sizes, mixed image + video prompts,
video files, payload select/concat; bad input gives one clear error naming the example."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.core.contracts import VideoPrompt
from mmrl.core.registry import make_policy
from mmrl.core.rollout import Rollout, SamplingParams

SPEC = "vlm/qwen2_5_vl_tiny.json"


@dataclass(frozen=True)
class Example:
    prompt: str
    images: tuple
    videos: tuple = ()
    system: str | None = None


def moving_square(frames: int, width: int, height: int, color: tuple[int, int, int]) -> list[Image.Image]:
    """A square sliding right by 4 px per frame."""
    out = []
    for t in range(frames):
        frame = Image.new("RGB", (width, height), (240, 240, 240))
        frame.paste(color, (4 * t, height // 4, 4 * t + 14, height // 4 + 14))
        out.append(frame)
    return out


def still(width: int, height: int, color: tuple[int, int, int]) -> Image.Image:
    return Image.new("RGB", (width, height), color)


def video_examples() -> list[Example]:
    """4 frames of 56² (2 temporal patches), 5 frames of 84×56 as an array (padded to 6: 3 patches), an image
    and a video in one prompt, an image only, text only."""
    array = np.stack([np.asarray(f) for f in moving_square(5, 84, 56, (30, 60, 220))])
    return [Example("<video>Which colour moves?", (), (moving_square(4, 56, 56, (220, 30, 30)),)),
            Example("Watch <video> and say where it goes.", (), (array,)),
            Example("<image> is the first frame of <video>. Same colour?", (still(56, 56, (30, 170, 40)),),
                    (moving_square(4, 56, 56, (30, 170, 40)),), "Answer briefly."),
            Example("<image>Colour?", (still(56, 56, (1, 2, 3)),)),
            Example("Text only.", ())]


def tiny_policy(**args):
    # video.fps 1: 2 s per temporal patch, so Qwen2.5-VL's temporal positions differ from the default of 1.
    return make_policy("vlm", {"model_spec": SPEC, "max_prompt_tokens": 256, "video": {"fps": 1.0}, **args})


@pytest.fixture(scope="module")
def policy():
    return tiny_policy()


@pytest.fixture(scope="module")
def rollout(policy):
    return policy.rollout(video_examples(), 2, SamplingParams(temperature=1.0, max_new_tokens=10), seed=3)


def plain_logprobs(policy, example: Example, completion: torch.Tensor) -> torch.Tensor:
    """log π(completion | prompt) from the processor and the model alone: the chat messages written out,
    qwen-vl-utils' ``process_vision_info``, ``processor(...)`` and one forward, the suppressed ids removed
    from the distribution as the policy's rules do. [T]"""
    from qwen_vl_utils import process_vision_info

    content, images, videos = [], iter(example.images), iter(example.videos)
    for piece in example.prompt.replace("<image>", "\0<image>\0").replace("<video>", "\0<video>\0").split("\0"):
        if piece == "<image>":
            content.append({"type": "image", "image": next(images), "min_pixels": 3136, "max_pixels": 12544})
        elif piece == "<video>":
            video = next(videos)
            frames = [Image.fromarray(f) for f in video] if isinstance(video, np.ndarray) else video
            content.append({"type": "video", "video": frames, "sample_fps": 1.0, "min_pixels": 3136,
                            "max_pixels": 12544})
        elif piece:
            content.append({"type": "text", "text": piece})
    messages = ([{"role": "system", "content": example.system}] if example.system else []) + \
        [{"role": "user", "content": content}]
    text = policy.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    image_inputs, video_inputs, kwargs = process_vision_info(messages, return_video_kwargs=True,
                                                             return_video_metadata=True)
    frames, metadata = zip(*video_inputs)
    enc = policy.processor(text=[text], images=image_inputs, videos=list(frames), video_metadata=list(metadata),
                           return_tensors="pt", **kwargs)
    t = completion.shape[0]
    enc["input_ids"] = torch.cat([enc["input_ids"], completion[None]], 1)
    enc["attention_mask"] = torch.ones_like(enc["input_ids"])
    enc["mm_token_type_ids"] = torch.nn.functional.pad(enc["mm_token_type_ids"], (0, t))
    with torch.no_grad():
        logits = policy.model(**enc).logits[0, -t - 1:-1]
    logits[:, policy.suppressed] = -torch.inf
    return torch.log_softmax(logits, -1).gather(1, completion[:, None])[:, 0]


def test_examples_with_videos_are_video_prompts():
    examples = video_examples()
    assert all(isinstance(e, VideoPrompt) for e in examples)


def test_video_rows_on_policy_logprobs_equal_the_samplers_and_a_plain_forward(policy, rollout):
    prompts = rollout.payload.row_prompts()
    assert prompts.videos_per_row.tolist() == [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    assert prompts.images_per_row.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 0, 0]
    # 4 frames → 2 temporal patches; 5 frames of 84×56 → 6 frames, resized by qwen-vl-utils to 112×56.
    assert prompts.video_grid_thw.tolist() == [[2, 4, 4]] * 2 + [[3, 4, 8]] * 2 + [[2, 4, 4]] * 2
    assert prompts.second_per_grid_ts.tolist() == [2.0] * 6  # temporal patch (2 frames) / 1 fps
    assert int((prompts.mm_token_type_ids == 2).sum()) == 2 * (8 + 24 + 8)  # merged 2×2: 8, 24 and 8 video tokens
    out = policy(rollout)
    assert ((out.logp - rollout.logp) * rollout.mask).abs().max() < 1e-5
    examples = video_examples()
    for row in (0, 2, 4):  # one row of each video example
        t = int(rollout.mask[row].sum())
        completion = rollout.payload.completion_ids[row, :t]
        plain = plain_logprobs(policy, examples[int(rollout.example_index[row])], completion)
        assert torch.allclose(plain, rollout.logp[row, :t], atol=1e-4), row
    # Without second_per_grid_ts, Qwen2.5-VL spaces temporal patches 1 s apart: video rows change, others not
    # (the plain forward, which places positions itself from what it is given).
    untimed = replace(rollout.payload, prompts=replace(rollout.payload.prompts, second_per_grid_ts=None))
    diff = ((policy.score(untimed, shared_prefix=False).logp - rollout.logp) * rollout.mask).abs().amax(1)
    assert diff[:6].min() > 1e-4 and diff[6:].max() < 1e-5


def test_video_logprobs_have_gradients_through_the_vision_tower(policy, rollout):
    policy.zero_grad(set_to_none=True)
    policy(rollout.select(torch.tensor([0, 2]))).logp.sum().backward()
    vision = [p.grad for n, p in policy.named_parameters() if ".visual." in n]
    assert any(g is not None and g.abs().sum() > 0 for g in vision)
    policy.zero_grad(set_to_none=True)


def test_payload_select_and_concat_round_trip_with_videos(policy, rollout):
    order = torch.tensor([7, 2, 9, 0, 5, 3, 8, 1, 6, 4])
    joined = Rollout.concat([rollout.select(order[:4]), rollout.select(order[4:])])
    direct = rollout.select(order)
    pj, pd = joined.payload.row_prompts(), direct.payload.row_prompts()
    for name in ("input_ids", "mm_token_type_ids", "pixel_values", "image_grid_thw", "images_per_row",
                 "pixel_values_videos", "video_grid_thw", "second_per_grid_ts", "videos_per_row"):
        assert torch.equal(getattr(pj, name), getattr(pd, name)), name
    assert torch.allclose(policy(joined).logp, policy(rollout).logp[order], atol=1e-5)
    no_video = rollout.select(torch.tensor([6, 9]))
    assert no_video.payload.row_prompts().pixel_values_videos is None and no_video.payload.row_prompts().video_grid_thw is None
    assert ((policy(no_video).logp - no_video.logp).abs() * no_video.mask).max() < 1e-5
    # Rows of a rollout that never saw a video concatenate with video rows.
    images_only = policy.rollout(video_examples()[3:], 1, SamplingParams(max_new_tokens=6), seed=1)
    both = Rollout.concat([images_only, rollout.select(torch.tensor([0, 4]))])
    assert both.payload.row_prompts().videos_per_row.tolist() == [0, 0, 1, 1]
    assert ((policy(both).logp - both.logp).abs() * both.mask).max() < 1e-5


def test_examples_without_videos_encode_as_before(policy):
    """A VideoPrompt with no video and a plain VisualPrompt give the same tensors and no video fields."""

    @dataclass(frozen=True)
    class ImageOnly:
        prompt: str
        images: tuple
        system: str | None = None

    a = policy.encode([ImageOnly("<image>Colour?", (still(56, 56, (1, 2, 3)),)), ImageOnly("Text.", ())])
    b = policy.encode([Example("<image>Colour?", (still(56, 56, (1, 2, 3)),)), Example("Text.", ())])
    for name in ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.videos_per_row is None and a.pixel_values_videos is None and a.second_per_grid_ts is None


def write_mp4(path, frames: list[Image.Image], fps: int) -> None:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames[0].width, frames[0].height, "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_image(frame)))
        container.mux(stream.encode())


def test_a_video_file_is_decoded_and_sampled_at_the_video_fps(policy, tmp_path):
    path = tmp_path / "clip.mp4"
    write_mp4(path, moving_square(8, 56, 56, (220, 30, 30)), fps=4)  # 2 s at 4 fps
    examples = [Example("<video>What moves?", (), (path,)), Example("<video>And here?", (), (str(path),))]
    rollout = policy.rollout(examples, 2, SamplingParams(temperature=1.0, max_new_tokens=8), seed=0)
    prompts = rollout.payload.row_prompts()
    # 2 s at video.fps 1 is 2 frames, raised to qwen-vl-utils' minimum of 4 (smart_nframes): 4 of the 8
    # frames, an effective 2 fps → 2 temporal patches 1 s apart.
    assert prompts.video_grid_thw.tolist() == [[2, 4, 4]] * 4 and prompts.second_per_grid_ts.tolist() == [1.0] * 4
    assert ((policy(rollout).logp - rollout.logp) * rollout.mask).abs().max() < 1e-5
    faster = tiny_policy(video={"fps": 4.0})  # every frame: 4 temporal patches of 0.5 s
    prompts = faster.encode(examples[:1])
    assert prompts.video_grid_thw.tolist() == [[4, 4, 4]] and prompts.second_per_grid_ts.tolist() == [0.5]


def test_bad_video_input_gives_one_clear_error_naming_the_example(policy, tmp_path):
    good = video_examples()[0]

    def fails(example: Example, error: type, pattern: str) -> None:
        with pytest.raises(error, match=pattern):
            policy.encode([good, example])

    frames = moving_square(4, 56, 56, (1, 2, 3))
    fails(Example("no placeholder", (), (frames,)), ValueError,
          r"example 1: the prompt has 0 <video> placeholder\(s\) but 1 video\(s\)")
    fails(Example("<video><video>", (), (frames,)), ValueError, r"example 1: the prompt has 2 <video> placeholder")
    fails(Example("<video>", (), ([],)), ValueError, "example 1: video 0 has no frames")
    fails(Example("<video>", (), (frames[:2] + [still(84, 56, (0, 0, 0))],)), ValueError,
          "example 1: video 0: frame 2 is 84x56 but frame 0 is 56x56")
    fails(Example("<video>", (), (np.zeros((4, 56, 56, 3), np.float32),)), ValueError,
          r"example 1: video 0: an array video must be uint8 \[T, H, W, 3\]")
    fails(Example("<video>", (), (frames[:1] + ["frame.png"],)), TypeError, "example 1: video 0: frame 1 must be a PIL")
    fails(Example("<video>", (), (42,)), TypeError, "example 1: video 0 must be a list of PIL frames")
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 4)
    fails(Example("<video>", (), (corrupt,)), ValueError, r"example 1: video 0 \(.*corrupt.mp4\) could not be decoded")
    fails(Example("<video>", (), (tmp_path / "missing.mp4",)), FileNotFoundError, "example 1: video 0 .* is not a file")
    with pytest.raises(ValueError, match=r"text tokens \+ 0 image tokens \+ 8 video tokens = \d+ > "
                                         r"policy.args.max_prompt_tokens = 30"):
        tiny_policy(max_prompt_tokens=30).encode([good])


def test_pooled_features_of_video_rows_reach_the_vision_tower(policy):
    """Vision pretraining (``warm_start.vision_steps``) pools a video's merged tokens as it pools an image's:
    mean and max of the vectors the LM reads, with gradients into the vision tower; a row that shows
    both, neither, or several is refused."""
    red, blue = moving_square(4, 56, 56, (220, 30, 30)), moving_square(4, 56, 56, (30, 60, 220))
    examples = [Example("<video>?", (), (red,)), Example("<video>?", (), (blue,)), Example("<video>?", (), (red[::-1],))]
    policy.zero_grad(set_to_none=True)
    features = policy.pooled_image_features(examples)
    assert features.shape == (3, 2 * 128)  # out_hidden_size 128 of the tiny spec, mean ⊕ max
    assert (features[0] - features[1]).abs().max() > 1e-3 and (features[0] - features[2]).abs().max() > 1e-3
    features.sum().backward()
    assert all(p.grad is not None for p in policy.vision_encoder.parameters() if p.requires_grad)
    policy.zero_grad(set_to_none=True)
    images = policy.pooled_image_features([Example("<image>?", (still(56, 56, (1, 2, 3)),))])
    assert images.shape == (1, 2 * 128)
    for bad in ([examples[0], Example("<image>?", (still(56, 56, (1, 2, 3)),))],
                [Example("<image><video>?", (still(56, 56, (1, 2, 3)),), (red,))],
                [Example("<video><video>?", (), (red, blue))], [Example("text", ())]):
        with pytest.raises(ValueError, match="exactly one image per example, or exactly one video"):
            policy.pooled_image_features(bad)
