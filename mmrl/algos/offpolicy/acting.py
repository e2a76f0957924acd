"""Evaluating a run whose off-policy learner acts for its policy.

Most learners train the run's policy itself (WSRL, ConRFT, CO-RFT): a checkpoint's policy weights are the policy.
EXPO-FT and DSRL act through their learners instead (EXPO-FT's Q-guided choice over base samples and their edits,
DSRL's latent actor choosing the flow head's noise; each installed as the policy's ``action_selector``): the saved
weights are only the base, and the learner's actor and critics live in ``<run>/offpolicy/``. :func:`restore_acting_learner` rebuilds such a learner around a policy that already holds
the checkpoint's weights, loads the learner's state of the same checkpoint and installs it, so that ``mmrl eval``
of the run measures the policy the run's own held-out evaluations measured (the scripted expert's takeovers, a
stand-in for a human during training, stay off).

Order matters: the learner's constructor reads the run's offline result (``offline.pt``), which holds the policy's
weights after the offline phase; the checkpoint's weights are put back after it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mmrl.algos.hooks import HookContext, LossHook

ACTING_LEARNERS = frozenset({"expo_ft", "dsrl"})
"""Learners that install themselves as the policy's ``action_selector``: their runs are evaluated through them."""


def restore_acting_learner(run: Path, cfg: Any, policy: Any, task: Any, checkpoint_state: dict[str, Any]
                           ) -> LossHook | None:
    """The learner of ``run`` (config ``cfg``) installed on ``policy`` (holding the checkpoint's weights) with the
    state that checkpoint saved (``checkpoint_state``: its trainer state), or None when the run's learner does not
    act for its policy. Errors name what is missing; nothing is trained here."""
    from mmrl.algos.offpolicy import OFFPOLICY_LEARNERS
    from mmrl.algos.offpolicy.wsrl import OFFLINE_FILE, STATE_DIR
    from mmrl.algos.variants.params import variant_params

    name = cfg.algo.offpolicy
    if name not in ACTING_LEARNERS:
        return None
    state = checkpoint_state.get("loss_hooks", {}).get("offpolicy")
    if not state:
        raise ValueError(f"{run}: the checkpoint holds no state of algo.offpolicy: {name}, which acts for the policy; "
                         f"it cannot be evaluated as it ran")
    if variant_params(cfg.algo, name).offline_steps > 0 and not (run / STATE_DIR / OFFLINE_FILE).is_file():
        raise FileNotFoundError(f"{run / STATE_DIR / OFFLINE_FILE} is missing: the run's offline result is needed to "
                                f"rebuild its {name} learner")
    weights = {key: value.clone() for key, value in policy.state_dict().items()}
    ctx = HookContext(cfg=cfg, policy=policy, model=policy, task=task, engine=SimpleNamespace(rank=0, world_size=1),
                      score=None, warm_start_examples=list, out=run)
    learner = OFFPOLICY_LEARNERS.get(name)(ctx)
    policy.takeover = None  # the scripted expert's takeovers are part of training, not of the policy
    policy.load_state_dict(weights)
    learner.load_state_dict(state)
    return learner
