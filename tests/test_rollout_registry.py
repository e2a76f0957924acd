"""The Rollout contract and the task / policy registries."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from mmrl.core.registry import TASKS, UnknownNameError, make_policy, make_task, register_task
from mmrl.core.rollout import Rollout
from mmrl.tasks.sanity import ReverseConfig, ReverseTask


@dataclass(frozen=True)
class RowsPayload:
    ids: torch.Tensor  # [N, L]

    def select(self, index):
        return RowsPayload(self.ids[index])

    @classmethod
    def concat(cls, parts):
        width = max(p.ids.shape[1] for p in parts)
        return cls(torch.cat([torch.nn.functional.pad(p.ids, (0, width - p.ids.shape[1])) for p in parts]))


def make_rollout(n: int, t: int, version: int = 0, offset: float = 0.0) -> Rollout:
    logp = -torch.arange(n * t, dtype=torch.float32).reshape(n, t) - offset
    return Rollout(logp=logp, mask=torch.ones(n, t), group_id=torch.arange(n) // 2,
                   example_index=torch.arange(n) // 2, outputs=[f"o{i}" for i in range(n)],
                   payload=RowsPayload(torch.arange(n)[:, None].repeat(1, t)), policy_version=version)


def test_rollout_checks_shapes():
    r = make_rollout(4, 3)
    with pytest.raises(ValueError, match="mask shape"):
        r.replace(mask=torch.ones(4, 2))
    with pytest.raises(ValueError, match="group_id must have shape"):
        r.replace(group_id=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="outputs has 3 items for 4 rows"):
        r.replace(outputs=["a", "b", "c"])
    with pytest.raises(ValueError, match="values shape"):
        r.replace(values=torch.zeros(4, 5))


def test_select_keeps_rows_aligned():
    r = make_rollout(4, 3).select(torch.tensor([3, 1]))
    assert r.outputs == ["o3", "o1"]
    assert r.logp[0, 0] == -9.0 and r.logp[1, 0] == -3.0
    assert r.payload.ids[:, 0].tolist() == [3, 1]
    assert r.group_id.tolist() == [1, 0]


def test_concat_pads_the_decision_axis():
    r = Rollout.concat([make_rollout(2, 3), make_rollout(2, 5)])
    assert r.logp.shape == (4, 5) and r.payload.ids.shape == (4, 5)
    assert r.mask[:2, 3:].sum() == 0 and r.mask[2:].sum() == 10  # padding is masked out
    assert r.outputs == ["o0", "o1", "o0", "o1"]
    assert r.lengths.tolist() == [3, 3, 5, 5]


def test_concat_refuses_mixed_policy_versions():
    with pytest.raises(ValueError, match="different policy versions"):
        Rollout.concat([make_rollout(2, 3, version=0), make_rollout(2, 3, version=1)])


def test_unknown_task_suggests():
    with pytest.raises(UnknownNameError, match="unknown task 'sanity/reverse-v1'. Did you mean 'sanity/reverse-v0'"):
        make_task("sanity/reverse-v1")


def test_task_ids_are_namespaced_and_versioned():
    with pytest.raises(ValueError, match="must look like 'family/name-v0'"):
        register_task("reverse", ReverseTask, ReverseConfig)
    with pytest.raises(ValueError, match="already registered"):
        register_task("sanity/reverse-v0", lambda cfg: None, ReverseConfig)
    assert "sanity/reverse-v0" in TASKS


def test_make_task_and_policy_validate_args():
    task = make_task("sanity/reverse-v0", {"min_len": 2, "max_len": 2})
    assert task.cfg == ReverseConfig(min_len=2, max_len=2)
    from mmrl.core.config import ConfigError

    with pytest.raises(ConfigError, match="unknown key 'vocab' in policy.args"):
        make_policy("causal_lm", {"vocab": "01"})
    with pytest.raises(ValueError, match="needs pretrained, or both model_config and tokenizer_chars"):
        make_policy("causal_lm", {"tokenizer_chars": "01"})
