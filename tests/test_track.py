"""``rollscale track`` (issue 40, parts 2-4): a production run's logs read as they grow, against the study's band.

The study is written by hand (tests/track_study.py: runs' evaluations committed as the sweep commits them, the
decision computed by the fit stage's own function). The readers are checked on logs written by each framework's
own writer: TensorBoard's SummaryWriter as transformers' TensorBoardCallback uses it, MLflow's client, and verl's
FileLogger class loaded from the installed verl (its documented line format where verl is absent).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rollscale.config import parse_params
from rollscale.core.fit.analysis import run_evals
from rollscale.integrations.track.band import study_band
from rollscale.integrations.track.logs import RunLog, logged_n, read_log, reward_series
from rollscale.integrations.track.points import departure, merged, one_per_step
from rollscale.integrations.track.tick import track_tick
from rollscale.pipeline.cli import main
from tests.track_study import PARAMS, study_runs, write_study


@pytest.fixture
def study(tmp_path, monkeypatch):
    decision = write_study(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path, decision


def study_hashes(root: Path) -> dict[str, str]:
    """Every file of the study's own stages (not production/)."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((root / "artifacts").rglob("*"))
            if p.is_file() and "production" not in p.parts}


def verl_log(path: Path, steps, score=lambda s: 0.2 + 0.04 * s, mode: str = "w") -> None:
    with path.open(mode) as f:
        for s in steps:
            f.write(json.dumps({"step": s, "data": {"critic/score/mean": score(s), "actor/lr": 1e-3}}) + "\n")


def test_the_band_at_c_star_is_the_decisions():
    runs, evals = study_runs()
    ev = run_evals(runs, evals)
    from rollscale.core.fit.decision_table import decision_table

    lead = decision_table(ev, 160.0, 0.02, 2.0).query("status == 'leader'").iloc[0]
    band = study_band(ev, "n", "easy", "uniform", "all", int(lead["key"]), 160.0)
    reward, lo, hi = (float(v[0]) for v in band.at(np.array([160.0])))
    assert (reward, lo, hi) == pytest.approx((lead["reward"], lead["reward_lo"], lead["reward_hi"]), abs=1e-9)
    assert np.all(np.diff(band.reward[np.isfinite(band.reward)]) > -1e-9)  # the sigmoid rises
    assert math.isnan(float(band.at(np.array([400.0]))[0][0]))  # no forecast past C*


def test_a_resumed_run_keeps_one_point_per_step():
    series = pd.DataFrame({"step": [1, 2, 3, 4, 3, 4, 5], "value": [.1, .2, .3, .4, .35, .45, .5], "order": range(7)})
    points, restarts = one_per_step(series)
    assert points["step"].tolist() == [1, 2, 3, 4, 5] and points["value"].tolist() == [.1, .2, .35, .45, .5]
    assert [(r.after, r.at) for r in restarts] == [(4, 3)]
    # verl rewrites its file on a restart: the table keeps the steps before it, the new ones replace the rest
    before = pd.DataFrame({"step": [1, 2, 3, 4], "value": [.1, .2, .3, .4]})
    now = pd.DataFrame({"step": [3], "value": [.33]})
    kept, restart = merged(before, now)
    assert kept["step"].tolist() == [1, 2, 3] and kept["value"].tolist() == [.1, .2, .33]
    assert (restart.after, restart.at) == (4, 3)
    assert merged(before, before)[0].equals(before) and merged(before, before)[1] is None


def test_verl_jsonl_in_verls_documented_format(tmp_path):
    """verl's FileLogger (verl/utils/tracking.py, verl 0.9) writes {"step": s, "data": {metric: value}} a line;
    a line still being written is left for the next tick; metric keys beside "step" are read too."""
    path = tmp_path / "run.jsonl"
    verl_log(path, [1, 2])
    path.write_text(path.read_text() + json.dumps({"step": 3, "critic/score/mean": 0.5}) + "\n" + '{"step": 4, "da')
    metric, series = reward_series(read_log(str(path), "verl-jsonl"), ["val-core/x", "critic/score/mean"])
    assert metric == "critic/score/mean" and series["step"].tolist() == [1, 2, 3]
    assert series["value"].tolist() == pytest.approx([0.24, 0.28, 0.5])
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"run.jsonl:2: not a JSON object"):
        read_log(str(path), "verl-jsonl")


def test_verl_jsonl_written_by_verls_own_logger(tmp_path, monkeypatch):
    spec = importlib.util.find_spec("verl")
    tracking = Path(spec.submodule_search_locations[0]) / "utils/tracking.py" if spec else None
    if tracking is None or not tracking.exists():
        pytest.skip("verl is not installed (uv pip install --no-deps verl==0.9.1): its documented format is tested above")
    # verl's package imports its GPU dependencies: its tracking module alone is loaded from its file
    loaded = importlib.util.spec_from_file_location("verl_tracking", tracking)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "verl.jsonl"))
    logger = module.FileLogger("proj", "exp")
    for step in (1, 2, 3):
        logger.log({"critic/score/mean": np.float32(0.1 * step), "val-core/gsm8k/reward/mean@4": 0.3}, step)
    logger.finish()
    log = read_log(str(tmp_path / "verl.jsonl"), "verl-jsonl")
    metric, series = reward_series(log, ["critic/score/mean"])
    assert series["step"].tolist() == [1, 2, 3] and series["value"].tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert "val-core/gsm8k/reward/mean@4" in set(log.points["metric"])


def test_tensorboard_as_trl_writes_it(tmp_path):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "out/runs/Nov27_host"
    with SummaryWriter(str(run)) as w:  # transformers' TensorBoardCallback: args as text, then train/ scalars
        w.add_text("args", json.dumps({"num_generations": 4, "learning_rate": 1e-3}))
        for step in (1, 2, 3, 4):
            w.add_scalar("train/reward", 0.1 * step, step)
    with SummaryWriter(str(run)) as w:  # resumed from the checkpoint at step 2
        for step in (3, 4, 5):
            w.add_scalar("train/reward", 0.2 * step, step)
    log = read_log(str(tmp_path / "out"), "tensorboard")
    assert logged_n(log.settings) == 4
    metric, series = reward_series(log, ["eval/reward", "train/reward"])
    points, restarts = one_per_step(series)
    assert metric == "train/reward" and points["step"].tolist() == [1, 2, 3, 4, 5]
    assert points["value"].tolist() == pytest.approx([0.1, 0.2, 0.6, 0.8, 1.0]) and len(restarts) == 1


def test_mlflow_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow import MlflowClient

    uri = (tmp_path / "mlruns").resolve().as_uri()
    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(client.create_experiment("prod"))
    client.log_param(run.info.run_id, "num_generations", "2")
    for step in (1, 2, 3):
        client.log_metric(run.info.run_id, "reward", 0.1 * step, step=step)
    log = read_log(str(tmp_path / "mlruns"), "mlflow")
    assert log.source.endswith(run.info.run_id) and logged_n(log.settings) == 2
    assert reward_series(log, ["eval_reward", "reward"])[1]["step"].tolist() == [1, 2, 3]


def tick_of(study, log: RunLog, table=None, **track):
    root, decision = study
    params = parse_params(PARAMS)
    runs, evals = study_runs()
    settings = params.track.model_copy(update=track)
    return track_tick(params, settings, decision, run_evals(runs, evals), log, table, log.source, "verl-jsonl")


def test_a_run_below_the_band_is_flagged_with_the_settings_that_differ(study):
    low = pd.DataFrame({"metric": "critic/score/mean", "step": range(1, 9), "value": 0.2, "order": range(8)})
    log = RunLog("prod", low, {"num_generations": 4, "learning_rate": 5e-3, "per_device_train_batch_size": 8})
    done = tick_of(study, log, patience=3)
    assert done.table["below"].sum() >= 3 and len(done.table) == 8
    flag = next(line for line in done.lines if line.startswith("The run left the study's band"))
    assert "K = 3" in flag
    assert any("learning_rate: study 0.001, run 0.005" in line for line in done.lines)
    assert 'class="flag"' in done.page and "learning_rate" in done.page
    again = tick_of(study, log, done.table, patience=3)  # nothing new: nothing to write
    assert again.table is None and again.page is None and "nothing new" in again.lines[0]
    assert tick_of(study, log, done.table, patience=20).table is None  # K changes the page only when it writes


def run_track(*args: str) -> int:
    """One tick in this process (what `rollscale track` starts as `python -m flows.track`)."""
    from flows.track import main as track_main

    return track_main(list(args))


def test_bad_input_is_one_line_and_leaves_the_study(study, capsys):
    root, _ = study
    before = study_hashes(root)
    # a log folder that does not exist yet: the tick waits and says so
    assert run_track("--logs", "out/runs", "--every", "5") == 0
    out = capsys.readouterr().out
    assert "track: waiting for the run's logs:" in out and "out/runs does not exist yet" in out
    assert not (root / "artifacts/production").exists()
    # issue 55, case 9: a verl JSONL opened and not yet written waits as an empty folder does
    (root / "verl.jsonl").write_text("")
    assert run_track("--logs", "verl.jsonl", "--format", "verl-jsonl") == 0
    out = capsys.readouterr().out
    assert "track: waiting for the run's logs:" in out and "verl.jsonl has no metric yet" in out
    # ... and a TensorBoard event file of garbage is named as damaged (it read as "no metric yet", exit 1)
    (root / "tb").mkdir()
    (root / "tb" / "events.out.tfevents.1.host").write_bytes(np.random.default_rng(0).bytes(5000))
    assert run_track("--logs", "tb") == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"rollscale track: {root / 'tb' / 'events.out.tfevents.1.host'}: damaged"), line
    assert not (root / "artifacts/production").exists()
    # a metric the log lacks: one line naming the ones it has
    verl_log(root / "verl.jsonl", range(1, 6))
    assert run_track("--logs", "verl.jsonl", "--format", "verl-jsonl", "--metric", "val/score") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rollscale track: {root / 'verl.jsonl'}: no metric val/score in the log; it has: actor/lr, "
                   "critic/score/mean (name one with --metric)"]
    # --serve without a Prefect server that schedules: one line, exit 1 (the environment)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PREFECT_API_URL")
        assert run_track("--logs", "verl.jsonl", "--serve") == 1
    assert "--serve needs a Prefect server whose scheduler starts the ticks" in capsys.readouterr().err
    # bad flags: one line naming the key
    assert run_track("--logs", "verl.jsonl", "--cron", "every minute") == 2
    assert "cron" in capsys.readouterr().err
    # a good tick, then one that finds nothing new and writes nothing
    assert run_track("--logs", "verl.jsonl", "--format", "verl-jsonl") == 0
    assert "track: 5 new points" in capsys.readouterr().out
    table = root / "artifacts/production/production.parquet"
    stamp = (table.stat().st_mtime_ns, (root / "artifacts/production/index.html").stat().st_mtime_ns)
    assert run_track("--logs", "verl.jsonl", "--format", "verl-jsonl") == 0
    assert "track: nothing new" in capsys.readouterr().out
    assert (table.stat().st_mtime_ns, (root / "artifacts/production/index.html").stat().st_mtime_ns) == stamp
    # a log that goes backwards (verl rewrote its file on a resume from step 3): one warning, no doubled points
    verl_log(root / "verl.jsonl", [3, 4], score=lambda s: 0.5)
    assert run_track("--logs", "verl.jsonl", "--format", "verl-jsonl") == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the log goes back from step 5 to step 3 (a run resumed from a checkpoint)" in err[0]
    rows = pd.read_parquet(table)
    assert rows["step"].tolist() == [1, 2, 3, 4] and rows["reward"].tolist()[2:] == [0.5, 0.5]
    assert study_hashes(root) == before  # nothing of the study's tables was written


def test_a_run_exported_with_another_n_is_warned(study):
    log = RunLog("prod", pd.DataFrame({"metric": "train/reward", "step": [1, 2], "value": .3, "order": [0, 1]}),
                 {"num_generations": 8})
    done = tick_of(study, log)
    assert len(done.warnings) == 1
    assert "the run logs n = 8 rollouts per prompt but was exported with n = 4" in done.warnings[0]


def test_production_is_queryable_and_no_stage(study, capfd):
    from rollscale.report.base import check_tables, stages_not_run

    root, _ = study
    assert main(["sql", "select count(*) as n from production"]) == 2
    assert "table 'production' does not exist yet: run `rollscale track --logs DIR`" in capfd.readouterr().err
    verl_log(root / "verl.jsonl", range(1, 4))
    assert main(["track", "--logs", "verl.jsonl", "--format", "verl-jsonl"]) == 0  # the command: its own process
    assert "track: 3 new points" in capfd.readouterr().out
    assert main(["sql", "select step, c, metric from production order by step"]) == 0
    out = capfd.readouterr().out
    assert "critic/score/mean" in out and out.split()[-3:] == ["3", "24.0", "critic/score/mean"]
    # the report's stages are dvc.yaml's: a production table never makes a "production" stage that has not run
    assert "production" not in stages_not_run(check_tables({}))


TRAINER = '''
import json, sys, time
from pathlib import Path

import pandas as pd
import torch
import trl
from datasets import Dataset
from transformers import TrainerCallback
from trl.scripts.grpo import make_parser

from rollscale.integrations.export.rewards import trl_reward
from rollscale.lm.models import char_tokenizer

torch.set_num_threads(1)
TABLE = Path("artifacts/production/production.parquet")


class WaitForTheTracker(TrainerCallback):
    """At two steps the run waits (at most 400 s: a tick's process starts in 5 s on an idle machine, 30-60 s on
    this busy 2-core VM) until the served tracker has ticked past them, so that
    both ticks land while it trains; the times it was seen are written for the test."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (6, 12):
            deadline = time.time() + 400
            while time.time() < deadline:
                if TABLE.exists() and pd.read_parquet(TABLE)["step"].max() >= state.global_step - 1:
                    with open("seen.jsonl", "a") as f:
                        f.write(json.dumps({"step": state.global_step, "rows": len(pd.read_parquet(TABLE))}) + "\\n")
                    break
                time.sleep(0.5)


_, args, model, _ = make_parser().parse_args_and_config(
    ["--config", "export/trl_grpo.yaml", "--output_dir", "out", "--report_to", "tensorboard", "--use_cpu", "true",
     "--logging_steps", "1", "--save_strategy", "no"])
data = Dataset.from_dict({"prompt": ["1+2=", "3+4=", "2+2=", "5+1="] * 4, "answer": ["3", "7", "4", "6"] * 4})
trainer = trl.GRPOTrainer(model=model.model_name_or_path, reward_funcs=[trl_reward("numeric")], args=args,
                          train_dataset=data, processing_class=char_tokenizer(), callbacks=[WaitForTheTracker()])
trainer.train()
print("trained", trainer.state.global_step, flush=True)
'''


@pytest.mark.slow
def test_a_trl_run_tracked_live_by_the_served_deployment(study, tmp_path, capsys):
    """The study's answer exported to TRL, a GRPOTrainer of the tiny model trained from the export with TensorBoard
    logging in a process of its own, `rollscale track --serve` ticking while it trains, the page in Chromium and
    the production table through `rollscale sql`."""
    pytest.importorskip("trl")
    pytest.importorskip("tensorboard")
    import os
    import subprocess
    import sys
    import time

    import torch

    from rollscale.lm.models import char_tokenizer, tiny_llama
    from tests.browser import CHROMIUM, chromium, console_messages
    from tests.test_schedule import stop

    root, decision = study
    torch.manual_seed(0)
    tiny_llama(len(char_tokenizer()), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
               max_positions=32).save_pretrained(root / "artifacts/base/model")
    assert main(["export", "--to", "trl"]) == 0
    assert "M = 20 steps" in capsys.readouterr().out
    (root / "train.py").write_text(TRAINER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]),
           "PREFECT_RUNNER_POLL_FREQUENCY": "1", "OMP_NUM_THREADS": "1"}
    served = subprocess.Popen([sys.executable, "-m", "rollscale.pipeline.cli", "track", "--logs", "out", "--serve",
                               "--every", "2"], cwd=root, env=env, stdout=open(tmp_path / "serve.log", "w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    trainer = subprocess.Popen([sys.executable, "train.py"], cwd=root, env=env, stdout=open(tmp_path / "train.log", "w"),
                               stderr=subprocess.STDOUT)
    try:
        assert trainer.wait(timeout=900) == 0, (tmp_path / "train.log").read_text()[-3000:]
        table = root / "artifacts/production/production.parquet"
        deadline = time.time() + 400  # the tick after the run's last step
        while time.time() < deadline and not (table.exists() and pd.read_parquet(table)["step"].max() == 20):
            time.sleep(1)
    finally:
        stop(served)
        if trainer.poll() is None:
            trainer.kill()
    log = (tmp_path / "serve.log").read_text()
    seen = [json.loads(line) for line in (root / "seen.jsonl").read_text().splitlines()]
    assert [s["step"] for s in seen] == [6, 12] and seen[0]["rows"] < seen[1]["rows"] < 20, log[-3000:]  # 2 ticks mid-run
    assert "track: deployment track/rollscale-track, every 2 s" in log
    rows = pd.read_parquet(table)
    assert rows["step"].tolist() == list(range(1, 21)) and rows["c"].tolist() == [8.0 * s for s in range(1, 21)]
    # the band from the study's first evaluation past step 0 (C = 32 for n = 4) to C*, where it is the decision's
    lead = decision[decision["status"] == "leader"].iloc[0]
    assert set(rows["metric"]) == {"train/reward"} and rows.loc[rows["c"] >= 32, "forecast"].notna().all()
    assert rows["forecast"].iloc[-1] == pytest.approx(lead["reward"], abs=1e-9)
    html = root / "artifacts/production/index.html"
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is absent (apt-get install chromium): the page was written, not rendered")
    dom = chromium(["--dump-dom", html.as_uri()], tmp_path / "profile")
    assert dom.returncode == 0 and console_messages(dom.stderr) == [], dom.stderr[-2000:]
    assert 'class="marks"' in dom.stdout and "Expected at C* = 160 rollouts" in dom.stdout
    assert main(["sql", "select count(*) as points, max(c) as c from production"]) == 0
    assert capsys.readouterr().out.split()[-2:] == ["20", "160.0"]


def test_track_names_what_it_compares_and_never_prints_a_nan_band_past_c_star(study):
    """Issue 56: TRL's train reward on all 400 problems was set against the study's validation reward without a word,
    and past the budget the line read "the study's band nan - nan" and "it is back in since"."""
    steps = range(1, 61)  # B = 4 x 2 = 8 rollouts a step: C* = 160 at step 20, the run goes on to 480
    low = pd.DataFrame({"metric": "critic/score/mean", "step": steps, "value": 0.2, "order": range(len(steps))})
    done = tick_of(study, RunLog("prod", low, {}), patience=3)
    text = "\n".join(done.lines)
    assert "nan" not in text.lower(), text
    assert "past the study's budget C* = 160 rollouts: no band there" in done.lines[0]
    compared = next(line for line in done.lines if line.startswith("Compared: "))
    assert "the run's train reward 'critic/score/mean' on the problems it trains on" in compared
    assert "against the study's validation avg@" in compared and "validation problems of bucket easy" in compared
    flag = next(line for line in done.lines if line.startswith("The run left the study's band"))
    assert "back in since" not in flag and "the run is past the study's budget C* = 160 rollouts" in flag
    assert "band nan" not in done.page.lower() and "no band there" in done.page
