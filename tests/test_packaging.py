"""The built wheel installs only the ``mmrl`` namespace: ``tasks/``, ``envs/``, ``configs/`` and
``assets/`` of the checkout become ``mmrl.tasks``, ``mmrl.envs``, ``mmrl.configs``, ``mmrl.assets``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import importlib, sys
import mmrl, mmrl.tasks, mmrl.envs
assert "{venv}" in mmrl.__file__, mmrl.__file__          # the wheel's copy, not the checkout
for name in ("tasks", "envs", "configs", "assets"):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        continue
    sys.exit(f"generic top-level module {{name!r}} is importable")
from mmrl.core.config import load_config
cfg = load_config("sanity/tiny_cpu")                         # recipes shipped inside the package
from mmrl.core.registry import make_policy
make_policy("causal_lm", cfg.policy.args)                    # and the model config asset
print("ok", cfg.task.name)
"""


def test_wheel_installs_into_a_fresh_venv_under_the_mmrl_namespace(tmp_path):
    src, dist = tmp_path / "src", tmp_path / "dist"  # build from a copy: no build/ left in the checkout
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    src.mkdir()
    for item in ("pyproject.toml", "README.md", "mmrl", "tasks", "envs", "configs", "assets"):
        if (ROOT / item).is_dir():
            shutil.copytree(ROOT / item, src / item, ignore=ignore)
        else:
            shutil.copy(ROOT / item, src / item)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(src)], check=True, capture_output=True)
    wheel = next(dist.glob("mmrl-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"mmrl"}
    for expected in ("mmrl/tasks/sanity/reverse.py", "mmrl/envs/__init__.py", "mmrl/configs/sanity/tiny_cpu.yaml",
                     "mmrl/assets/sanity/qwen2_tiny.json", "mmrl/algos/advantages.py"):
        assert expected in names, expected

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    # The heavy dependencies (torch, transformers, ...) come from the test's own environment: a path
    # appended after the fresh venv's site-packages (no .pth files of that environment are run, so
    # the editable install of the checkout stays invisible).
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    result = subprocess.run([str(python), "-c", CHECK.format(venv=venv)], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok sanity/reverse-v0")


def test_every_package_of_the_checkout_is_in_the_wheel():
    """pyproject lists packages explicitly (package-dir maps envs/ and tasks/ into mmrl): a new
    subpackage that is not listed would be silently missing from the wheel."""
    import tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join((name, *init.parent.relative_to(ROOT / folder).parts))
             for name, folder in setup["package-dir"].items()
             for init in (ROOT / folder).rglob("__init__.py") if "__pycache__" not in init.parts}
    missing = sorted(found - set(setup["packages"]))
    assert not missing, f"add these packages to [tool.setuptools] packages in pyproject.toml: {missing}"
