"""scripts/results/plot_real_steps.py and mmrl/experiments/real_steps.py on fabricated metrics files: the points,
the table (arm, real steps, success at each evaluation), the figure, clear errors for bad --runs and for runs without
the counts; scripts/results/plot_wm_results.py still runs on runs logged before the counts existed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from mmrl.experiments.real_steps import eval_points, markdown_table, rollout_steps_by_step

ROOT = Path(__file__).resolve().parents[1]
OOD = ("ood_color", "ood_position", "ood_instruction", "ood_distractor")


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "results" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def eval_row(step: int, test: float, ood: float | None, real: int | None, demo: int | None) -> dict:
    row = {"step": step, "eval/success_rate": test}
    if ood is not None:
        row |= {f"eval/{split}/success_rate": ood for split in OOD}
    if real is not None:
        row |= {"eval/real_env_steps": real, "eval/demo_env_steps": demo}
    return row


def write_run(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture
def runs(tmp_path):
    ppo = write_run(tmp_path / "ppo", [eval_row(0, 0.5, 0.25, 0, 27000),
                                       {"step": 1, "rollout/len_mean": 9.0, "rollout/trained_rows": 32},
                                       eval_row(2, 0.75, 0.5, 600, 27000)])
    wsrl = write_run(tmp_path / "wsrl", [eval_row(0, 0.25, 0.0, 450, 13000), eval_row(4, 0.5, 0.125, 1450, 13000)])
    return ppo, wsrl


def test_points_and_table(runs):
    ppo, wsrl = runs
    points = eval_points(ppo)
    assert [(p.step, p.real_steps, p.demo_steps, p.total_steps) for p in points] == [(0, 0, 27000, 27000),
                                                                                     (2, 600, 27000, 27600)]
    assert points[1].test_success == 0.75 and points[1].mean_success == pytest.approx((0.75 + 4 * 0.5) / 5)
    table = markdown_table({"PPO": points, "WSRL": eval_points(wsrl)}).splitlines()
    assert len(table) == 2 + 4
    assert table[3] == "| PPO | 2 | 600 | 27,000 | 27,600 | 0.750 | 0.550 |"
    assert table[5] == "| WSRL | 4 | 1,450 | 13,000 | 14,450 | 0.500 | 0.200 |"


def test_script_writes_figure_and_table(runs, tmp_path, capsys):
    ppo, wsrl = runs
    out, table = tmp_path / "img" / "fig.png", tmp_path / "table.md"
    script = load_script("plot_real_steps")
    assert script.main(["--runs", f"PPO={ppo}", f"WSRL={wsrl}", "--out", str(out), "--table", str(table)]) == 0
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"
    assert "| WSRL | 0 | 450 | 13,000 | 13,450 | 0.250 | 0.050 |" in table.read_text()
    assert table.read_text() in capsys.readouterr().out


def test_test_split_only_runs_plot_without_the_mean(tmp_path):
    run = write_run(tmp_path / "a", [eval_row(0, 0.5, None, 0, 100), eval_row(1, 0.6, None, 30, 100)])
    assert eval_points(run)[1].mean_success is None
    assert "| A | 1 | 30 | 100 | 130 | 0.600 | – |" in markdown_table({"A": eval_points(run)})
    script = load_script("plot_real_steps")
    assert script.main(["--runs", f"A={run}", "--out", str(tmp_path / "a.png")]) == 0


def test_clear_errors(runs, tmp_path, capsys):
    ppo, _ = runs
    old = write_run(tmp_path / "old", [eval_row(0, 0.5, 0.5, None, None)])
    with pytest.raises(ValueError, match=r"old/metrics.jsonl: the evaluation of step 0 has no eval/real_env_steps"):
        eval_points(old)
    script = load_script("plot_real_steps")
    for runs_arg, message in (([f"PPO{ppo}"], "expected NAME=DIR"), ([f"A={ppo}", f"A={ppo}"], "given twice"),
                              ([f"A={tmp_path / 'none'}"], "has no metrics.jsonl"),
                              ([f"A={old}"], "has no eval/real_env_steps")):
        assert script.main(["--runs", *runs_arg, "--out", str(tmp_path / "x.png")]) == 2
        assert message in capsys.readouterr().err


def test_rollout_steps_of_older_runs():
    rows = [{"step": 0}, {"step": 1, "rollout/len_mean": 9.5, "rollout/trained_rows": 32},
            {"step": 2, "rollout/len_mean": 8.0, "rollout/trained_rows": 32}]
    assert rollout_steps_by_step(rows) == {0: 0, 1: 304, 2: 560}


def test_wm_script_still_plots_runs_without_the_counts(tmp_path, monkeypatch, capsys):
    mujoco = write_run(tmp_path / "mujoco", [eval_row(0, 0.4, 0.2, None, None),
                                             {"step": 1, "rollout/len_mean": 10.0, "rollout/trained_rows": 32},
                                             eval_row(1, 0.5, 0.3, None, None)])
    rft = write_run(tmp_path / "rft", [eval_row(0, 0.4, 0.2, None, None), eval_row(1, 0.45, 0.3, None, None)])
    wm = tmp_path / "wm"
    wm.mkdir()
    (wm / "train_log.json").write_text(json.dumps({"real_env_steps": 14775, "demonstration_env_steps": 13275}))
    out = tmp_path / "wm.png"
    monkeypatch.setattr(sys, "argv", ["plot_wm_results.py", "--bc-steps", "13275", "--world-model", str(wm),
                                      "--mujoco", str(mujoco), "--rft", str(rft), "--out", str(out)])
    load_script("plot_wm_results").main()
    printed = capsys.readouterr().out
    assert "| RL in MuJoCo (mujoco) | 1 | 13,595 |" in printed and "| RFT in WM (rft) | 1 | 14,775 |" in printed
    assert out.is_file()


def test_bc_starts_are_a_table_row_and_a_star_of_their_arm(runs, tmp_path, capsys):
    ppo, wsrl = runs
    bc = write_run(tmp_path / "wsrl_bc", [eval_row(0, 0.125, 0.125, 0, 13000), eval_row(1, 0.2, 0.2, 300, 13000)])
    script = load_script("plot_real_steps")
    out = tmp_path / "fig.png"
    assert script.main(["--runs", f"PPO={ppo}", f"WSRL={wsrl}", "--bc-starts", f"WSRL={bc}", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[lines.index("| WSRL | 0 | 450 | 13,000 | 13,450 | 0.250 | 0.050 |") - 1] == \
        "| WSRL | BC | 0 | 13,000 | 13,000 | 0.125 | 0.125 |"  # the BC start alone, then the run; its step 1 unused
    assert out.is_file() and not any("| WSRL | 1 |" in line for line in lines)
    assert script.main(["--runs", f"PPO={ppo}", "--bc-starts", f"WSRL={bc}", "--out", str(out)]) == 2
    assert "--bc-starts WSRL: not an arm of --runs (PPO)" in capsys.readouterr().err
