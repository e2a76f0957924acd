"""Samplers: how decisions are drawn for a policy (HF generate, vLLM, gymnasium vector-env runner,
diffusion scheduler steps with log-probs). Policies call them; the trainer never does."""
