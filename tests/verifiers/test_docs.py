"""docs/verifiers.md runs: its python blocks in order in one namespace, in a fresh folder (blocks that
start with ``# file: NAME`` are written to NAME and must be used by a later block), and the ``reward`` of
every YAML block builds. ``models/my-judge`` and ``models/my-rm`` are the tiny models of conftest.py."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from mmrl.verifiers import VERIFIERS, build_reward

DOC = Path(__file__).resolve().parents[2] / "docs" / "verifiers.md"
BLOCK = re.compile(r"^```(python|yaml)\n(.*?)^```", re.DOTALL | re.MULTILINE)
FILE = re.compile(r"\A# file: (\S+)\n")


def blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(DOC.read_text())


def test_the_doc_has_examples_of_every_built_in():
    text = DOC.read_text()
    assert len(blocks()) >= 20
    for name in ("math", "choice", "number", "exact", "iou", "json_f1", "format", "classifier", "judge"):
        assert f"### `{name}`" in text or f"**`{name}`**" in text, name


def test_doc_examples_run(tmp_path, monkeypatch, classifier_dirs, judge_dirs, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "my-judge").symlink_to(judge_dirs["plain"])
    (tmp_path / "models" / "my-rm").symlink_to(classifier_dirs["single"])
    namespace: dict = {}
    written: list[str] = []
    sources = blocks()
    try:
        for index, (language, source) in enumerate(sources):
            if language == "yaml":
                reward = yaml.safe_load(source)["task"]["args"]["reward"]
                build_reward(reward, base_dir=tmp_path)
            elif match := FILE.match(source):
                (tmp_path / match.group(1)).write_text(source)
                written.append(match.group(1))
                later = "".join(s for _, s in sources[index + 1:])
                assert match.group(1) in later, f"{match.group(1)} is never used"
            else:
                exec(compile(source, f"{DOC.name}[block {index}]", "exec"), namespace)  # noqa: S102
    finally:
        VERIFIERS._entries.pop("ends_with_period", None)  # registered by the doc's last example
    assert written == ["my_rewards.py", "graded.py", "flaky.py", "chat_rewards.py"]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("unknown verifier 'maths'. Did you mean 'math'")
    assert printed[1].startswith("unknown key 'rel_tl' in reward.number (did you mean 'rel_tol'?)")
    assert printed[2].startswith("reward file 'missing.py' not found")
