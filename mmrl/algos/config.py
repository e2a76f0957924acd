"""The algorithm recipe: which estimator, objective, aggregation, regularisers and shaping hooks.

One frozen dataclass; every field is documented with the paper its default comes from. The
registered functions in this package read only the fields they need.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class AlgoConfig:
    # -- advantage estimator -------------------------------------------------------------------
    advantage: str = "grpo"
    """Registered advantage estimator: grpo | rloo | reinforce_pp | gae | returns (+ the paper variants,
    docs/algorithms.md: psr, nsr, w_reinforce, beta_posterior, polychromic, weighted_grpo, direct_opd, ...)."""
    norm_adv_by_std: bool = True
    """GRPO: divide by the group std (DeepSeekMath). False gives Dr. GRPO (Liu et al. 2025)."""
    adv_eps: float = 1e-6
    """Added to the std in GRPO / whitening (EasyR1, verl)."""
    gamma: float = 1.0
    """Discount for gae, returns and reinforce_pp, and per decision in the off-policy critics' TD targets."""
    lam: float = 0.95
    """GAE λ (Schulman et al. 2016)."""
    whiten_advantages: bool = True
    """gae / returns: whiten advantages over the valid tokens of the batch (PPO practice)."""
    kl_in_reward_coef: float = 0.0
    """REINFORCE++ (Hu 2025): per-token reward −β·(log π_old − log π_ref) added before returns."""

    # -- per-token policy objective --------------------------------------------------------------
    policy_loss: str = "ppo_clip"
    """Registered objective: ppo_clip | gspo | gspo_token | reinforce | rw_sft (reward-weighted SFT, arXiv
    2601.09253) | none (the objective is entirely ``loss_terms``: pacs, frpo)."""
    clip_low: float = 0.2
    """Lower clip ε_low: ratio ≥ 1 − ε_low (PPO; DAPO keeps 0.2; GSPO uses 3e-4)."""
    clip_high: float = 0.2
    """Upper clip ε_high: ratio ≤ 1 + ε_high (DAPO clip-higher 0.28; GSPO 4e-4)."""
    dual_clip_c: float | None = None
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens at −c·A (Ye et al.
    2020; EasyR1 uses 3, DAPO recipe 10). None disables it."""
    tis_cap: float | None = None
    """Truncated importance sampling cap C: weight min(π_old/π_behaviour, C) when the trainer
    re-computes π_old and the rollout engine's log-probs differ (Yao et al. 2025). None: off."""

    # -- loss aggregation ----------------------------------------------------------------------
    loss_agg: str = "token-mean"
    """token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm."""
    loss_agg_norm_len: int | None = None
    """Constant length for seq-mean-token-sum-norm (Dr. GRPO: the max completion length). None: the
    trainer uses ``rollout.max_new_tokens``; the pure function falls back to the padded length T."""

    # -- regularisers ----------------------------------------------------------------------------
    kl_coef: float = 0.0
    """β of the KL-to-reference loss term (0 disables the reference model)."""
    kl_estimator: str = "low_var_kl"
    """k1 | k2 | k3 | low_var_kl (Schulman's estimators; low_var_kl = clamped k3, verl/EasyR1), or
    gaussian_mean: closed-form KL of Gaussian decisions from their means (Flow-GRPO; diffusion policies)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (loss −= coef·entropy)."""
    bc_coef: float = 0.0
    """Drift-gated behaviour-cloning regulariser (VLA-RFT, Li et al. 2025, ``use_mse_loss``, coef 0.01 on
    its flow-matching loss): loss += bc_coef · clamp(KL / bc_kl_threshold, 0, 1) · the policy's
    ``sft_loss`` on ``bc_batch_size`` of the warm start's own examples and reference outputs (the SFT data
    reused, as VLA-RFT does: no new demonstrations; needs ``warm_start.sft_steps`` > 0). KL is the
    ``kl_estimator`` mean of π_θ vs the reference model on the update's rows, so it needs
    ``trainer.ref_model`` (``kl_coef`` may stay 0). 0 disables it."""
    bc_kl_threshold: float = 0.2
    """KL at which the BC regulariser is fully on (VLA-RFT: 0.2)."""
    bc_batch_size: int = 16
    """Reference outputs per BC regulariser term (one draw per optimizer step)."""
    value_coef: float = 0.5
    """Weight of the value loss when the policy has a value head (PPO with GAE)."""
    value_clip: float | None = 0.2
    """Clip range of the value update around the rollout's values; None disables clipping."""
    value_huber_delta: float | None = None
    """Huber δ for the value loss; None uses the squared error."""

    # -- shaping and sampling --------------------------------------------------------------------
    shaping: tuple[str, ...] = ()
    """Registered advantage-shaping hooks applied in order after the estimator."""
    adv_clip: float | None = None
    """Used by the ``adv_clip`` hook: clamp advantages to [−c, c] (DDPO uses 5)."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose verifiable outcome has zero variance and refill the batch."""
    max_gen_rounds: int = 3
    """DAPO: at most this many generation rounds per step to fill the batch."""
    overlong_max_len: int | None = None
    """DAPO overlong shaping L_max (tokens); None disables it."""
    overlong_buffer: int = 0
    """DAPO overlong shaping buffer L_buf: linear penalty from L_max − L_buf to L_max."""
    overlong_factor: float = 1.0
    """Multiplier of the overlong penalty."""

    guide: bool = False
    """Guide (seed #63): groups whose samples all fail are drawn again with a hint in the context
    (``task.hinted``), and trained as answers to the hint-free prompt with the importance ratio
    π_θ(y|x) / π_old(y|x, hint) (``extra.guide``; mmrl/algos/variants/hooks.py ``Guide``)."""

    seele: bool = False
    """SEELE (seed #99): each group drawn in rounds with a prefix of the reference answer as a hint, its length
    per prompt from an item-response fit aimed at a target success rate (``extra.seele``;
    mmrl/algos/variants/guidance.py ``Seele``)."""
    ampo: bool = False
    """AMPO (seed #108): groups whose samples all fail get answers of teachers (checkpoint folders or the
    reference answer), the most comprehensible replacing some rows, trained with π_old = 1 (``extra.ampo``;
    mmrl/algos/variants/guidance.py ``Ampo``)."""
    eapo: bool = False
    """EAPO (seed #93): a prompt's earlier successful answers replace rows of its groups that all fail, with
    their stored behaviour log-probs as π_old (importance sampling; ``extra.eapo``; ``Eapo``)."""
    fest: bool = False
    """FEST (seed #46): an SFT term on a fixed few-shot set of demonstrations added at every optimizer step, its
    weight decaying over training (``extra.fest``; mmrl/algos/variants/guidance.py ``Fest``)."""

    answer_prefix: str | None = None
    """TFPI's ThinkFree input (seed #86): every training sample starts with this text already written (e.g.
    ``"<think></think>"``: no thinking), given as context; the task scores prefix + continuation. Evaluation
    samples without it. None: off (mmrl/algos/variants/hooks.py ``AnswerPrefix``)."""
    rorecomp: bool = False
    """RoRecomp (seed #71): each step trains a priority batch of every group's shortest correct and longest
    incorrect rows, and now and then a compensation batch of earlier remaining rows from a replay buffer
    (``extra.rorecomp``; mmrl/algos/variants/rollout_selection.py ``RoRecomp``)."""
    rollout_bandit: bool = False
    """The contextual-bandit rollout scheduler (seed #111): a linear UCB model over rollout contexts chooses the
    rows of each group to train and the earlier groups to train again, rewarded by the gain in training reward
    between consecutive steps (``extra.rollout_bandit``; mmrl/algos/variants/rollout_selection.py)."""
    prompt_selection: str = "uniform"
    """Which prompts a round draws (mmrl/algos/variants/selection.py): uniform (the task's draw) | hard_focus
    (seed #45: highest posterior failure rate; ``extra.hard_focus``) | pos_neg_pairing (seed #65: half hard-but-solvable,
    half easy-but-brittle prompts; ``extra.pos_neg_pairing``) | low_likelihood (SELF, seed #102: lowest
    policy likelihood of the reference answer; ``extra.low_likelihood``) | erpo_reactivate (ERPO's "reactivate",
    seed #113: prompts whose last group was all-correct are drawn again; ``extra.erpo_reactivate``)."""
    dyme: bool = False
    """DyME (seed #33): each step, groups whose rollouts all failed are trained by SFT on the task's reference
    output instead of RL (memorisation vs exploration; ``extra.dyme``; mmrl/algos/variants/hooks.py ``Dyme``)."""
    recap: bool = False
    """RECAP (seed #49): replay of the warm start's data beside RL, the replay term reweighted each step from both
    objectives' short-horizon convergence and instability (``extra.recap``; mmrl/algos/variants/programs.py)."""
    npo: bool = False
    """NPO / AutoNPO (seed #87): rows of a later checkpoint of the same run (an earlier stage of the program)
    replace some of each group's samples, trained with π_old = π_guide (``extra.npo``; programs.py ``Npo``)."""
    scope_rl: bool = False
    """SCOPE-RL (seed #70): prefix-decomposed credit for failed rows until a prompt is first solved, then
    correctness-gated process-shape rewards (``extra.scope_rl``; mmrl/algos/variants/programs.py ``ScopeRl``)."""
    feedback_turns: int = 0
    """Multi-turn feedback-guided RL (seed #28): a row that fails gets the task's feedback
    (``task.feedback``) as a user turn and is answered again, up to this many extra turns; the new answers
    join their prompt's group (``extra.feedback_turns``; mmrl/algos/variants/hooks.py ``FeedbackTurns``). 0: off."""
    tool_turns: int = 0
    """Tool calls (issue 25): an answer that calls one of the task's tools (``task.call``) gets the result as the next
    turn and the policy continues, up to this many calls per episode (one more ends it at the floor reward); every
    turn is a row of its prompt's group carrying the episode's final score (mmrl/core/episodes.py; hooks.py
    ``ToolTurns``). Held-out evaluation runs the same episodes. 0: off."""

    ssb: bool = False
    """Semantic Soft Bootstrapping (SSB, seed #73): for groups with a correct and a wrong answer, the model is
    shown both and writes a new answer; a verified one is distilled (KL of the whole next-token distributions)
    from the hinted context into the bare prompt (``extra.ssb``; mmrl/algos/variants/distillation.py ``Ssb``)."""
    cipo: bool = False
    """CIPO (seed #95): failed samples become correction prompts (prompt, the failed answer, a request to
    correct it), each sampled as a group of its own and trained beside the ordinary groups (``extra.cipo``;
    mmrl/algos/variants/corrections.py ``Cipo``)."""
    ebft: bool = False
    """EBFT (seed #9): the reward of each sample is feature matching against the task's reference answer
    (−distance in a fixed feature space, + a diversity term within the group), no verifier needed
    (``extra.ebft``; mmrl/algos/variants/feature_matching.py ``Ebft``)."""

    rollout_strategy: str = "plain"
    """Registered rollout strategy (mmrl/algos/variants/adaptive_sampling.py): plain (``group_size``
    samples per prompt, all trained on) | aero (AERO adaptive rollouts, arXiv 2602.14338: rescue of
    zero-success prompts, selective rejection of surplus failures; ``extra.aero``)."""

    rehearsal_divergence: str | None = None
    """DPH-RL (arXiv 2509.07430): forward_kl | js | alpha, a mass-covering f-divergence to the initial
    policy on a rehearsal set of its own always-correct samples, added to every update
    (``extra.dph_rl``; mmrl/algos/variants/divergences.py). None: off."""

    temperature_schedule: str = "fixed"
    """Registered per-prompt sampling temperature schedule (mmrl/algos/variants/prompt_temperature.py):
    fixed (every prompt at ``rollout.temperature``) | erpo (ERPO, arXiv 2511.04800: prompts whose last
    group was all-correct are re-sampled hotter, back to ``rollout.temperature`` once mixed; ``extra.erpo``)."""

    loss_terms: tuple[str, ...] = ()
    """Registered extra per-token loss terms added to the objective, aggregated like it
    (mmrl/algos/variants/loss_terms.py): calibrl (CalibRL, arXiv 2602.20197: LeakyReLU calibration
    against the task's reference output, |A|-weighted; ``extra.calibrl``) | pacs (PACS, arXiv 2509.02522:
    BCE of the verifier outcome on a group-centred log-ratio score) | frpo (FRPO, arXiv 2602.08813: the
    max-min robust GRPO objective); pacs and frpo replace the surrogate: use them with ``policy_loss: none``."""

    offpolicy: str | None = None
    """Registered off-policy learner (mmrl/algos/offpolicy/, issue 27): wsrl (WSRL, seed #57: Cal-QL offline
    pre-training on demonstrations, warm-up rollouts, online Q-learning without the offline data;
    ``extra.wsrl``), co_rft (CO-RFT, seed #97: chunked TD over whole action chunks, offline on demonstrations,
    then fine-tuning on a buffer that keeps them; ``extra.co_rft``), conrft (ConRFT, seed #90: a consistency-policy
    actor trained by −η·Q + β·consistency BC, Cal-QL offline then Q-learning online; ``extra.conrft``), expo_ft
    (EXPO-FT, seed #89: a bounded edit actor and Q-guided selection over base samples and their edits, for acting
    and for the TD target, the base VLA trained by BC only; ``extra.expo_ft``), dsrl (DSRL, the fine-tuning of
    CSP / TMRL's seed #98: SAC over the noise a frozen flow head starts from; ``extra.dsrl``). Its loss
    hook stores each step's episodes in a replay buffer and trains a Q ensemble and the policy from it (SAC's
    actor; ConRFT's); use it with ``policy_loss: none``. wsrl / co_rft need a Gaussian action head, conrft the
    consistency (or flow) head (``policy.args.action_head: consistency``), expo_ft any continuous head, dsrl the
    flow head (``policy.args.action_head: flow``). None: off."""

    extra: dict = field(default_factory=dict, hash=False)
    """Hyper-parameters of experimental shaping hooks, by hook name (documented per hook)."""
