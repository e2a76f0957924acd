"""The small typed contracts that tasks and policies meet through.

Tasks and policies never import each other: a task produces examples and scores outputs; a policy
turns examples into a :class:`~mmrl.core.rollout.Rollout` and re-scores it. The trainer joins them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
from torch import Tensor, nn

from mmrl.core.rollout import Rollout, SamplingParams


class DataError(ValueError):
    """A task's local data (the files a user points it at) cannot be used; the message names the file
    and what is wrong with it. The command line reports it in one line."""


@dataclass(frozen=True)
class RewardResult:
    """A verifier's verdict on one output.

    ``score`` is in the task's documented range; ``components`` are logged as ``reward/<name>``;
    ``info`` says why a score is zero (malformed output, wrong answer, ...). Reward functions
    never raise on model output: bad output is a zero with a reason.
    """

    score: float
    components: dict[str, float] = field(default_factory=dict)
    info: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.score, (int, float)):
            raise TypeError(f"RewardResult.score must be a float, got {type(self.score).__name__}")


IMAGE_PLACEHOLDER = "<image>"
"""Where an image of a :class:`VisualPrompt` goes in its prompt text: one per image, in order."""


@runtime_checkable
class VisualPrompt(Protocol):
    """What a vision-language task's example exposes to a VLM policy (``policy: vlm``).

    - ``prompt``: the user text, with one :data:`IMAGE_PLACEHOLDER` per image where it is shown;
    - ``images``: PIL images (possibly none), in placeholder order;
    - ``system``: a system message, or None for the model's chat-template default.

    The policy builds the chat messages, applies its pixel budget and tokenises; a placeholder
    count that differs from ``len(images)``, or an unreadable image, is a clear error.
    """

    prompt: str
    images: tuple[Any, ...]  # PIL.Image.Image
    system: str | None


VIDEO_PLACEHOLDER = "<video>"
"""Where a video of a :class:`VideoPrompt` goes in its prompt text: one per video, in order."""


@runtime_checkable
class VideoPrompt(VisualPrompt, Protocol):
    """A :class:`VisualPrompt` that also shows videos (``policy: vlm``): ``videos`` holds, in
    :data:`VIDEO_PLACEHOLDER` order, each video as a list of PIL frames, a uint8 array
    ``[T, H, W, 3]``, or a video file path. Examples without the attribute show no video."""

    videos: tuple[Any, ...]


@runtime_checkable
class Task(Protocol):
    """A source of examples with a verifiable reward.

    - ``sample_batch(split, n, rng)`` draws ``n`` examples of ``split`` ("train" / "test" / task
      specific OOD splits) using only ``rng``; the same rng state gives the same examples.
    - ``reward(example, output)`` is total: any output gives a :class:`RewardResult`.
    - ``metrics(examples, outputs, results)`` aggregates task metrics for evaluation
      (accuracy, exact match, F1, ...), logged as ``eval/<name>``.
    - ``reference_output(example)`` is a correct output, used for SFT warm starts.

    A task may also define ``reward_batch(examples, outputs) -> list[RewardResult]`` (``examples[i]``
    is the example ``outputs[i]`` answers) when its verifier is cheaper batched (model-based
    rewards, batched user functions); the trainer then calls it instead of ``reward`` per row.
    """

    id: str
    reward_range: tuple[float, float]

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[Any]: ...

    def reward(self, example: Any, output: Any) -> RewardResult: ...

    def metrics(self, examples: Sequence[Any], outputs: Sequence[Any],
                results: Sequence[RewardResult]) -> dict[str, float]: ...

    def reference_output(self, example: Any) -> Any: ...


class ShowsBase:
    """For an example built on another (``self.base``): the images, system text and videos it shows are the
    base example's (none where the base has none)."""

    base: Any

    @property
    def images(self) -> tuple[Any, ...]:
        return tuple(getattr(self.base, "images", ()))

    @property
    def system(self) -> str | None:
        return getattr(self.base, "system", None)

    @property
    def videos(self) -> tuple[Any, ...]:
        return tuple(getattr(self.base, "videos", ()))


@dataclass(frozen=True)
class FollowUp(ShowsBase):
    """A later turn of an episode: ``base``'s prompt, then ``history``, the (role, text) turns since, ending
    with a user turn (the verifier's feedback); the policy answers next. The reward stays ``base``'s.

    Policies render ``history`` after the prompt: chat models as assistant / user messages, plain causal LMs
    as the texts appended in order (the task's feedback text carries whatever re-prompt its format needs).
    Only the new answer's tokens are decisions: the earlier turns are context."""

    base: Any
    history: tuple[tuple[str, str], ...]

    @property
    def prompt(self) -> str:
        return self.base.prompt


@dataclass(frozen=True)
class Prefixed:
    """``base`` answered with ``prefix`` already written: the policy continues after it, the prefix is context
    (not decisions), and the answer a task scores is ``prefix`` + the continuation (TFPI's ThinkFree input,
    ``algo.answer_prefix``)."""

    base: Any
    prefix: str

    def __getattr__(self, name: str) -> Any:  # prompt, images, system, videos, history: the base example's
        if name in ("base", "prefix") or name.startswith("__"):  # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.base, name)


def answer_prefix_of(example: Any) -> str:
    """The text already written at the start of the answer (empty for an ordinary example)."""
    return example.prefix if isinstance(example, Prefixed) else ""


def turns_of(example: Any) -> tuple[tuple[str, str], ...]:
    """The (role, text) turns after the prompt (none for a first turn)."""
    if isinstance(example, Prefixed):
        return turns_of(example.base)
    return example.history if isinstance(example, FollowUp) else ()


@runtime_checkable
class FeedbackTask(Protocol):
    """A task whose checker can say why an answer is wrong (multi-turn feedback, ``algo.feedback_turns``)."""

    def feedback(self, example: Any, output: Any, result: RewardResult) -> str | None:
        """The next user turn after ``output`` (e.g. which fields are wrong), or None: nothing to say."""
        ...


@runtime_checkable
class ToolTask(Protocol):
    """A task whose answers may call tools (``algo.tool_turns``): an episode is several model turns, each call
    answered by the task's tool as the next turn, until an output holds no call (the final answer).

    ``reward(example, output)`` of an output that holds a call scores the floor of ``reward_range``: a call is
    no answer (so an episode cut off after too many calls, or a run without ``algo.tool_turns``, scores it so)."""

    tool_names: tuple[str, ...]
    """The tools its answers may call; empty: none (the task is configured without tools)."""

    def call(self, example: Any, output: Any) -> str | None:
        """The turn after ``output`` when it holds a call: the tool's result (an error string for a malformed
        call, never an exception), with whatever re-prompt the task's format needs; None: a final answer."""
        ...

    def reference_turns(self, example: Any) -> tuple[tuple[Any, Any], ...]:
        """A correct episode for the supervised warm start: (context, output) pairs, the context of a later turn
        a :class:`FollowUp` holding the earlier outputs and tool results. One pair when no tool is called."""
        ...


DEMONSTRATION_STEPS_FILE = "demonstration_steps.json"
"""Beside a cached warm start of a :class:`SimulatorTask`: the real steps of its demonstrations, by ``repr(key)``
(written by the warm start that ran them; ``eval/demo_env_steps`` reads it)."""


@runtime_checkable
class SimulatorTask(Protocol):
    """A task whose outputs are episodes of a simulator, where each real simulator step has a cost (robot tasks):
    it says how many real steps episodes and demonstrations took, so a run can log its success against real
    steps (``eval/real_env_steps``, :mod:`mmrl.algos.real_steps`). Episode keys are hashable ids of one
    episode (for the table-top tasks: ``(env_id, seed)``); a key's demonstration is the same episode every time."""

    def real_env_steps(self, outputs: Sequence[Any]) -> int:
        """Real simulator steps the episodes ``outputs`` took (0 for episodes of a learned simulator; 0 for an
        output that is not an episode)."""
        ...

    def demonstration_steps(self, examples: Sequence[Any]) -> dict[Any, int]:
        """The real steps of the scripted-expert demonstration of each distinct example, by episode key (runs
        the demonstrations not yet run, without keeping their frames)."""
        ...

    def demonstrations_run(self) -> dict[Any, int]:
        """The real steps of every demonstration this task object has run for ``reference_output``, by key."""
        ...

    def simulator_data_env_steps(self) -> int:
        """Real steps behind the task's training simulator itself: a learned world model's own training data
        (beyond the warm start's demonstrations); 0 for a real simulator."""
        ...


@runtime_checkable
class HintedTask(Protocol):
    """A task that can put a hint toward an example's answer into its context (Guide, ``algo.guide``)."""

    def hinted(self, example: Any) -> Any:
        """``example`` with a hint in its prompt; the same answer and reward."""
        ...


def hint_prefix(reference: str, fraction: float) -> str:
    """The first round(fraction · len) characters of the reference answer: a partial hint (SEELE's hinted
    rounds, ``algo.seele``; ``data/rows-v0``'s ``{answer_prefix}`` hint field). ``round`` is Python's (half
    to even), so half of a one-character answer is empty."""
    return reference[:round(fraction * len(reference))]


@runtime_checkable
class LogprobFreeConfig(Protocol):
    """A policy config that may describe a policy whose decisions have no log-probability (the ``vla``
    policy's consistency head). ``decisions_without_logprob()`` says why (a sentence naming the key), or None
    when log π exists. The recipe loader then accepts only off-policy learners that need no density and
    refuses everything that reads log π (policy-gradient losses, KL / entropy terms, a reference policy)."""

    def decisions_without_logprob(self) -> str | None: ...


@runtime_checkable
class DiscreteDecisionConfig(Protocol):
    """A policy config that may describe a policy whose decisions are discrete (the ``vla`` policy's token head).
    ``discrete_decisions()`` says why (a sentence naming the key), or None for continuous decisions. The recipe
    loader refuses an off-policy learner (``algo.offpolicy``) for such a policy: its critic, reparameterised actor
    and action edits all need continuous actions."""

    def discrete_decisions(self) -> str | None: ...


@runtime_checkable
class ActionSelector(Protocol):
    """Replaces how a policy chooses its decision from the observation (a learner installs it on a policy that
    offers ``action_selector``; EXPO-FT's Q-guided selection over base samples and their edits). Called once per
    decision step of a rollout, training and evaluation alike, with the step's observations, the policy's
    features ``h`` of them, the rollout's temperature and its generator (every draw from it: seeded rollouts)."""

    def __call__(self, images: Tensor, proprio: Tensor, instruction_ids: Tensor, h: Tensor, temperature: float,
                 generator: Any) -> Tensor:
        ...  # [B, H, W, 3] uint8, [B, P], [B, L], [B, F] → decisions [B, D] as the policy's payload stores them


@dataclass(frozen=True)
class Takeovers:
    """A rollout's scripted takeovers (what a :class:`TakeoverPlan` returns): per episode, ``after[i]`` = k >= 0 lets
    the env's scripted expert take episode i over from its decision k on (−1: never). With ``stall_window`` None it
    takes over at decision k; with w, at the first decision d >= k at which the episode's last w decisions gained
    no reward (their rewards sum to <= 0: no progress on the potential-based reward), the way a human steps in on a
    stalling robot. Either way the expert keeps control to the end of the episode."""

    after: list[int]
    stall_window: int | None = None


@runtime_checkable
class TakeoverPlan(Protocol):
    """Which episodes of a rollout the env's scripted expert takes over, and when (a learner installs it on a policy
    that offers ``takeover``: EXPO-FT's and ConRFT's scripted stand-in for human interventions,
    :mod:`mmrl.algos.offpolicy.interventions`). Called once per rollout with its number of episodes, its
    temperature and its seed; returns the :class:`Takeovers`, or None for no takeover at all (e.g. greedy
    evaluation)."""

    def __call__(self, episodes: int, temperature: float, seed: int) -> Takeovers | None:
        ...


@dataclass
class PolicyOutput:
    """What a re-scoring forward returns, aligned with ``rollout.mask``."""

    logp: Tensor  # [N, T] log π_θ(decision), with gradients
    entropy: Tensor | None = None  # [N, T] entropy of π_θ at each decision (when asked)
    values: Tensor | None = None  # [N, T] value head outputs (policies with a critic)
    # Policies whose decisions are isotropic Gaussians (diffusion steps) also return their
    # parameters, for closed-form KL estimators on the mean (``algo.kl_estimator: gaussian_mean``).
    mean: Tensor | None = None  # [N, T, *D] mean of each decision's Gaussian
    std: Tensor | None = None  # [N, T] its standard deviation


class Policy(nn.Module, ABC):
    """Base of every policy: an ``nn.Module`` whose ``forward`` re-scores a rollout.

    ``forward`` is the only computation with gradients, so wrapping the policy in DDP/FSDP (via
    accelerate) makes gradient synchronisation automatic. ``rollout`` samples without gradients.
    ``version`` counts the optimizer steps taken; rollouts carry it (stale-weight detection).
    """

    version: int = 0

    @abstractmethod
    def rollout(self, examples: Sequence[Any], group_size: int, sampling: SamplingParams,
                seed: int) -> Rollout:
        """Sample ``group_size`` outputs per example; rows of one example share a group id.

        All randomness comes from ``seed``: the same weights, examples and seed give the same rollout.
        """

    @abstractmethod
    def forward(self, rollout: Rollout, with_entropy: bool = False) -> PolicyOutput:
        """Log-probs of the rollout's decisions under the current weights."""

    @abstractmethod
    def save_pretrained(self, path: str) -> None:
        """Save in the ecosystem's format so the model loads without mmrl."""

    @abstractmethod
    def load_weights(self, path: str) -> None:
        """Load weights saved by :meth:`save_pretrained` into this policy (same architecture)."""

    def adapter_disabled(self) -> AbstractContextManager:
        """A context in which the policy runs without its trainable adapters (LoRA): the base
        model, usable as the reference without a second copy in memory."""
        raise TypeError(f"{type(self).__name__} has no adapters: use trainer.ref_model: copy")

    def sft_loss(self, examples: Sequence[Any], targets: Sequence[Any]) -> Tensor:
        """Mean negative log-likelihood of ``targets`` given ``examples`` (supervised warm start).

        Policies that can be warm-started by supervised fine-tuning override this.
        """
        raise TypeError(f"{type(self).__name__} does not support supervised warm starts")

    def rollout_from_outputs(self, examples: Sequence[Any], outputs: Sequence[Any],
                             sampling: SamplingParams) -> Rollout:
        """Rollout rows for *given* outputs (``outputs[i]`` answers ``examples[i]``; row i has group and
        example index i), their log-probs under the current weights at ``sampling.temperature``: e.g.
        the task's reference answers injected into a group (ViSurf). Policies that can score a given
        output override this."""
        raise TypeError(f"{type(self).__name__} cannot score given outputs (rollout.reference_rows needs it)")

    def completion_log_distributions(self, examples: Sequence[Any], outputs: Sequence[Any],
                                     temperature: float) -> tuple[Tensor, Tensor]:
        """The whole next-token distribution at every position of given outputs (each followed by EOS, as
        :meth:`rollout_from_outputs` scores them), with gradients: log softmax(logits / ``temperature``) with the
        suppressed ids at −inf, [n, T, V], and the outputs' token mask [n, T] float. For losses that match
        distributions rather than sampled tokens (SSB's logit distillation, ``algo.ssb``). Token policies
        override this."""
        raise TypeError(f"{type(self).__name__} has no next-token distributions (algo.ssb needs them)")

    def completion_features(self, examples: Sequence[Any], outputs: Sequence[Any]) -> Tensor:
        """[n, D]: the mean of the last hidden state over the tokens of given outputs (each followed by EOS), no
        gradients: a sequence embedding for feature matching (EBFT, ``algo.extra.ebft.features: hidden``).
        Token policies override this."""
        raise TypeError(f"{type(self).__name__} has no hidden-state features (use algo.extra.ebft.features: "
                        f"char_ngram)")
