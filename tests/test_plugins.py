"""Plugins from outside the package (docs/plugins.md): every file and command of that page runs here, for
two training steps: the one-file task through ``--import``, through a recipe's ``imports:``, and as an
installed package with an ``mmrl.plugins`` entry point. A plugin that fails to import is one clear line."""

from __future__ import annotations

import json
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from mmrl.cli import main
from mmrl.core import registry
from mmrl.core.config import ConfigError, load_config

DOC = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"
TINY = ["trainer.steps=2", "eval.every=0", "eval.num_examples=4", "rollout.prompts_per_step=4",
        "rollout.group_size=2", "warm_start.sft_steps=3", "log.progress=false", "log.tensorboard=false", "--no-plot"]


def doc_blocks(kind: str) -> dict[str, str]:
    """The fenced blocks of docs/plugins.md marked ``<!-- kind: name -->``, by name."""
    pattern = rf"<!-- {kind}: (\S+) -->\n```\w*\n(.*?)```"
    return dict(re.findall(pattern, DOC.read_text(), flags=re.DOTALL))


def doc_commands(name: str) -> list[list[str]]:
    """The ``mmrl`` command lines of the run block ``name`` (comments dropped), as argv lists without ``mmrl``."""
    lines = [shlex.split(line, comments=True) for line in doc_blocks("run")[name].splitlines()]
    return [argv[1:] for argv in lines if argv[:1] == ["mmrl"]]


def run_doc_commands(name: str, capsys) -> str:
    """Run a block's commands (training shortened to two steps); returns what ``mmrl list`` printed."""
    listed = ""
    for argv in doc_commands(name):
        extra = {"train": TINY, "eval": ["--num-examples", "4"]}.get(argv[0], [])
        assert main([*argv, *extra]) == 0, (argv, capsys.readouterr().err)
        if argv[0] == "list":
            listed = capsys.readouterr().out
    return listed


@pytest.fixture
def fresh_plugins(monkeypatch, tmp_path):
    """A clean slate for the doc's plugin in this process: the task registry, the imported plugins and the
    entry points loaded are restored (and the doc's modules forgotten) after the test; cwd is ``tmp_path``
    holding the doc's files."""
    registry.load_plugins()  # the built-ins stay registered after the test
    for components in (registry.TASKS, registry.POLICIES):
        monkeypatch.setattr(components, "_entries", dict(components._entries))
    monkeypatch.setattr(registry, "_imported", {})
    monkeypatch.chdir(tmp_path)
    for name, text in doc_blocks("file").items():
        (tmp_path / name).write_text(text)
    yield tmp_path
    for module in ("my_tasks", "my_mmrl_tasks"):
        sys.modules.pop(module, None)


def test_every_block_of_the_doc_is_run_here():
    assert set(doc_blocks("file")) == {"my_tasks.py", "copy.yaml", "pyproject.toml"}
    assert set(doc_blocks("run")) == {"import", "recipe", "package"} and set(doc_blocks("snippet")) == {"imports"}


def test_import_flag(fresh_plugins, capsys):
    listed = run_doc_commands("import", capsys)
    assert re.search(r"^  demo/copy-v0 +--import \./my_tasks\.py$", listed, re.MULTILINE), listed
    assert re.search(r"^  sanity/reverse-v0 +built-in$", listed, re.MULTILINE)
    run = fresh_plugins / "runs" / "copy"
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["task"]["name"] == "demo/copy-v0" and config["imports"] == [str((fresh_plugins / "my_tasks.py").resolve())]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and "eval/exact_match" in rows[-1]


def test_recipe_imports_are_relative_to_the_recipe(fresh_plugins, capsys, monkeypatch):
    recipe = fresh_plugins / "copy.yaml"
    recipe.write_text(doc_blocks("snippet")["imports"] + recipe.read_text())
    elsewhere = fresh_plugins / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the import still resolves next to the recipe
    (argv,) = doc_commands("recipe")
    assert main([*(str(recipe) if a == "copy.yaml" else a for a in argv), *TINY]) == 0, capsys.readouterr().err
    assert registry.TASKS.get("demo/copy-v0").origin == f"imports: {(fresh_plugins / 'my_tasks.py').resolve()}"
    assert (elsewhere / "runs" / "copy_recipe" / "metrics.jsonl").is_file()


def test_installed_package_entry_point(fresh_plugins, capsys, monkeypatch):
    """What ``pip install`` of the doc's pyproject leaves on sys.path: the package and its .dist-info."""
    project = tomllib.loads(doc_blocks("file")["pyproject.toml"])["project"]
    site = fresh_plugins / "site"
    (package := site / "my_mmrl_tasks").mkdir(parents=True)
    (package / "__init__.py").write_text(doc_blocks("file")["my_tasks.py"])
    (dist_info := site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info").mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    entry_points = project["entry-points"]["mmrl.plugins"]
    (dist_info / "entry_points.txt").write_text("[mmrl.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_loaded_plugins", [])  # entry points are read again, as in a new process
    listed = run_doc_commands("package", capsys)
    assert re.search(r"^  demo/copy-v0 +plugin copy \(my-mmrl-tasks\)$", listed, re.MULTILINE), listed
    assert "copy" in registry.load_plugins()
    assert (fresh_plugins / "runs" / "copy_package" / "metrics.jsonl").is_file()


@pytest.mark.parametrize("plugin, message", [
    ("./nowhere.py", r"--import ./nowhere.py: FileNotFoundError: no such file .*nowhere.py"),
    ("no_such_package_xyz", r"--import no_such_package_xyz: ModuleNotFoundError: No module named 'no_such_package_xyz'"),
    ("./broken.py", r"--import ./broken.py: NameError: name 'undefined_name' is not defined \(.*broken.py:2\)"),
    ("./bad_syntax.py", r"--import ./bad_syntax.py: SyntaxError: .*bad_syntax.py, line 1\)"),
    ("./twice.py", r"--import ./twice.py: ValueError: task 'sanity/reverse-v0' is already registered \(.*twice.py:3\)"),
])
def test_a_failing_plugin_is_one_line_naming_it(fresh_plugins, capsys, plugin, message):
    (fresh_plugins / "broken.py").write_text("import math\nvalue = undefined_name\n")
    (fresh_plugins / "bad_syntax.py").write_text("def (:\n")
    (fresh_plugins / "twice.py").write_text("from mmrl.core.registry import register_task\n\n"
                                            "register_task('sanity/reverse-v0', dict, dict)\n")
    out = fresh_plugins / "run"
    assert main(["train", "copy.yaml", "--import", plugin, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.fullmatch(rf"mmrl train: error: {message}", err), err
    assert not out.exists()
    with pytest.raises(ConfigError, match=f"imports: {re.escape(plugin)}"):  # the same through a config's imports
        load_config(str(fresh_plugins / "copy.yaml"), [f"imports=[{plugin}]"])
