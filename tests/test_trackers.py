"""Sweep rows copied to TensorBoard and a local MLflow store (rollscale.train.trackers):
only committed rows, each once, equal to the run store's tables."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("mlflow", reason="mlflow-skinny is not installed (pip install 'rollscale[trackers]')")
pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install 'rollscale[trackers]')")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from rollscale.config import TrackingParams  # noqa: E402
from rollscale.core.problems.sets import reasoning_gym_problems  # noqa: E402
from rollscale.lm.models import char_tokenizer, tiny_llama  # noqa: E402
from rollscale.core.rollouts import SamplingConfig  # noqa: E402
from rollscale.train.trackers import (  # noqa: E402
    ExportingRunStore,
    RunExporter,
    flatten_params,
    tracker_targets,
)
from rollscale.train.checkpoint import RunStore  # noqa: E402
from rollscale.train.run_config import RunConfig  # noqa: E402
from rollscale.train.trainer import GRPOTrainer  # noqa: E402

ARCH = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=32)


def _trainer(run_id: str) -> GRPOTrainer:
    torch.set_num_threads(1)
    tok = char_tokenizer()
    problems = reasoning_gym_problems("chain_sum", 200, 0, dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1),
                                      prompt_style="expression")
    cfg = RunConfig(run_id=run_id, n=4, b_problem=4, c_max=16 * 4, train=dict(lr_base=1e-3, b_base=16), eval_per_doubling=0, eval_every=2, eval_k=2,
                    checkpoint_every=2, sampling=SamplingConfig(temperature=1.0, max_new_tokens=4))
    return GRPOTrainer(tiny_llama(len(tok), **ARCH).eval(), tok, problems[:40], problems[100:108], cfg,
                       use_chat_template=False)


def test_tracker_targets_off_by_default(tmp_path):
    assert tracker_targets(TrackingParams(), tmp_path) is None
    assert flatten_params({"a": 1, "s": {"t": 0.5, "k": [1, 2]}}) == {"a": "1", "s.t": "0.5", "s.k": "[1, 2]"}


def test_rows_reach_tensorboard_and_mlflow_once(tmp_path):
    from mlflow import MlflowClient

    targets = tracker_targets(TrackingParams(tensorboard=True, mlflow=True), tmp_path / "trackers")
    trainer = _trainer("r1")
    run_dir = tmp_path / "runs" / "r1"
    exporter = RunExporter(targets, run_dir, "r1", trainer.config.to_dict())
    exported = []
    real = exporter.export
    exporter.export = lambda status=None: exported.append(real(status)) or exported[-1]
    result = trainer.run(ExportingRunStore(run_dir, exporter))
    assert result.status == "finished" and len(exported) == 2  # one export per checkpoint (steps 2 and 4)
    assert exporter.export("finished") == 0  # everything was sent at the commits; nothing twice
    steps = RunStore(run_dir).rows("steps")
    evals = RunStore(run_dir).rows("evals")
    assert len(steps) == 4

    events = EventAccumulator(str(targets.tensorboard_dir / "r1")).Reload()
    loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert loss == [(int(s), pytest.approx(v, rel=1e-6, abs=1e-7)) for s, v in zip(steps["step"], steps["loss"])]
    assert [e.step for e in events.Scalars("eval/avg_at_k")] == evals["step"].tolist()

    client = MlflowClient(tracking_uri=targets.mlflow_uri)
    exp = client.get_experiment_by_name("rollscale")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "r1" and run.info.status == "FINISHED"
    assert run.data.params["n"] == "4" and run.data.params["sampling.max_new_tokens"] == "4"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [
        (int(s), pytest.approx(v, rel=1e-6, abs=1e-7)) for s, v in zip(steps["step"], steps["loss"])]
    assert len(client.get_metric_history(run.info.run_id, "eval/avg_at_k")) == len(evals)


def test_uncommitted_rows_are_not_exported(tmp_path):
    """Rows of parts no valid checkpoint commits stay out of the trackers."""
    targets = tracker_targets(TrackingParams(tensorboard=True), tmp_path / "trackers")
    trainer = _trainer("r2")
    run_dir = tmp_path / "runs" / "r2"
    trainer.run(RunStore(run_dir))
    newest = sorted(run_dir.glob("ckpt-*"))[-1]
    (newest / "MANIFEST.json").unlink()  # the last checkpoint never committed
    exporter = RunExporter(targets, run_dir, "r2", trainer.config.to_dict())
    with pytest.warns(RuntimeWarning, match="skipping corrupt checkpoint"):
        exporter.export()
    events = EventAccumulator(str(targets.tensorboard_dir / "r2")).Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2]


def test_a_failing_tracker_does_not_stop_training(tmp_path, caplog):
    targets = tracker_targets(TrackingParams(tensorboard=True), tmp_path / "trackers")
    trainer = _trainer("r3")
    run_dir = tmp_path / "runs" / "r3"
    exporter = RunExporter(targets, run_dir, "r3", trainer.config.to_dict())

    def broken(status=None):
        raise OSError("disk full")

    exporter.export = broken
    assert trainer.run(ExportingRunStore(run_dir, exporter)).status == "finished"
    assert "tracker export failed (OSError: disk full)" in caplog.text
    assert len(RunStore(run_dir).rows("steps")) == 4
