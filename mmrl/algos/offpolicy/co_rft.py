"""CO-RFT — Chunked Offline RL Fine-Tuning of VLAs (seed paper #97: "Chunked RL", TD learning over action
chunks, on 30 – 60 demonstrations after imitation learning), as a loss hook of the one trainer loop.

The policy decides a whole chunk of c env steps at a time and the critic is a Q over whole chunks,
Q(s_t, a_{t:t+c}) (the :class:`~mmrl.algos.offpolicy.critic.Critic` reads the decision [c · A]). Its backup
discounts inside the chunk, γ per env step, and bootstraps from the state after the chunk
(:func:`~mmrl.algos.offpolicy.formulas.chunk_td_target`):

    y = Σ_{k<c} γ^k r_{t+k} + γ^c (1 − d) min_{i ∈ M} Q̄_i(s_{t+c}, a'),   a' ~ π(· | s_{t+c})

so the episodes keep each env step's reward inside a decision (``Episode.chunk_rewards``) and Cal-QL's
Monte-Carlo bound is the env-step return-to-go (:class:`~mmrl.algos.offpolicy.buffer.TransitionBuffer`
with ``chunked``). Phases:

1. imitation learning: the recipe's ``warm_start`` (behaviour cloning of the chunk head);
2. **offline RL** with action chunks, when the hook is built: ``offline_steps`` chunked Cal-QL updates of
   critic and actor on the demonstrations (as :class:`~mmrl.algos.offpolicy.wsrl.WSRL`'s offline phase);
   the trainer's step-0 evaluation is CO-RFT's result;
3. fine-tuning on the policy's own rollouts (INFERRED, the paper is offline only): the online buffer starts
   with the offline data (``retain_offline``) and every optimizer step does ``critic_updates`` chunked
   updates on it with the conservative term at ``online_cql_alpha``, then the actor step. ``trainer.steps: 0``
   is the paper's offline-only setting.

State, resume and single-process rules are WSRL's.
"""

from __future__ import annotations

from dataclasses import dataclass

from mmrl.algos.offpolicy.wsrl import WSRL, WSRLParams
from mmrl.algos.variants.params import declare_variant


@dataclass(frozen=True)
class CORFTParams(WSRLParams):
    """``algo.extra.co_rft``: WSRL's critic / offline keys, and what CO-RFT changes (INFERRED where marked)."""

    warmup_steps: int = 0
    """Trainer steps that only collect (none: the buffer already holds the offline data)."""
    retain_offline: bool = True
    """The online buffer starts with the offline episodes (CO-RFT keeps training on its demonstrations;
    INFERRED for the online phase, which the paper does not have)."""
    online_cql_alpha: float = 1.0
    """Conservative term in the updates after the offline phase (INFERRED: offline RL's regulariser kept
    while the demonstrations are still in the buffer; 0 gives plain SAC on the mixed buffer)."""


declare_variant("co_rft", CORFTParams)


class CORFT(WSRL):
    NAME = "co_rft"
    CHUNKED = True
    p: CORFTParams

    def seed_online_buffer(self) -> None:
        """The offline episodes (read again when the offline result came from ``offline.pt``, or when there was no
        offline phase) start the online buffer when ``retain_offline``."""
        if not self.p.retain_offline:
            return
        episodes = self.offline_data or self.offline_episodes()
        if sum(e.length for e in episodes) > self.p.buffer_capacity:
            raise ValueError(f"algo.extra.co_rft.buffer_capacity ({self.p.buffer_capacity}) is smaller than the "
                             f"offline data it retains ({sum(e.length for e in episodes)} decisions)")
        for episode in episodes:
            self.buffer.add(episode)

    def online_cql_alpha(self) -> float:
        return self.p.online_cql_alpha
