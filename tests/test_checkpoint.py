"""Tests of the run store: atomic checkpoints, checksums, row parts, resume
rollback and the done marker (science §1: C and the data position persist)."""

import errno
import json
import os

import pandas as pd
import pytest
import torch

import rollscale.train.checkpoint as checkpoint_module
import rollscale.train.manifest as manifest_module
from rollscale.train.checkpoint import RunStore
from rollscale.train.manifest import read_manifest


def _model_state(step: int) -> dict:
    return {"w": torch.full((4, 3), float(step)), "b": torch.arange(3, dtype=torch.float32) + step}


def _optimizer_state(step: int) -> dict:
    return {"state": {0: {"step": torch.tensor(float(step)), "exp_avg": torch.ones(3) * step}},
            "param_groups": [{"lr": 1e-3, "params": [0]}]}


def _save(store: RunStore, step: int, rows_from: int):
    step_rows = [{"step": s, "c": 10 * s, "reward_mean": s / 10} for s in range(rows_from, step + 1)]
    eval_rows = [{"step": step, "avg_at_k": step / 100}]
    return store.save(step, _model_state(step), _optimizer_state(step), {"c": 10 * step, "note": "x"},
                      step_rows, eval_rows)


def _ckpt_dirs(root):
    return sorted(p.name for p in root.iterdir() if p.name.startswith("ckpt-"))


def test_save_and_load_round_trip(tmp_path):
    store = RunStore(tmp_path / "run")
    assert store.latest() is None
    assert store.rows("steps").empty and store.done() is None
    ckpt = _save(store, 3, 1)
    assert ckpt.path == tmp_path / "run" / "ckpt-000003"
    assert sorted(p.name for p in ckpt.path.iterdir()) == ["MANIFEST.json", "model.pt", "optimizer.pt", "state.json"]
    latest = store.latest()
    assert latest.step == 3 and latest.state["c"] == 30 and latest.state["step"] == 3
    for name, value in _model_state(3).items():
        assert torch.equal(latest.model_state()[name], value)
    assert torch.equal(latest.optimizer_state()["state"][0]["exp_avg"], torch.ones(3) * 3)
    manifest = json.loads((ckpt.path / "MANIFEST.json").read_text())
    assert set(manifest["files"]) == {"model.pt", "optimizer.pt", "state.json"}
    assert set(manifest["parts"]) == {"steps-000003.parquet", "evals-000003.parquet"}
    assert list(store.rows("steps")["step"]) == [1, 2, 3]
    assert list(store.rows("evals")["step"]) == [3]


def test_keeps_last_two_checkpoints_and_all_rows(tmp_path):
    store = RunStore(tmp_path)
    _save(store, 2, 1)
    _save(store, 4, 3)
    _save(store, 6, 5)
    assert _ckpt_dirs(tmp_path) == ["ckpt-000004", "ckpt-000006"]
    assert list(store.rows("steps")["step"]) == [1, 2, 3, 4, 5, 6]
    assert list(store.rows("evals")["step"]) == [2, 4, 6]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_sharded_checkpoint_lists_its_shards_and_a_damaged_shard_falls_back(tmp_path):
    """A sharded run's save (``shards=``, the ranks' torch.distributed.checkpoint folder): the folder
    moves into the checkpoint as shards/, every file in the manifest; a changed shard is caught."""
    store = RunStore(tmp_path)
    _save(store, 2, 1)
    folder = store.shard_folder(4)
    folder.mkdir()
    for name, data in ((".metadata", b"meta"), ("__0_0.distcp", b"rank 0"), ("__1_0.distcp", b"rank 1")):
        (folder / name).write_bytes(data)
    ckpt = store.save(4, None, None, {"c": 40}, [{"step": 3}, {"step": 4}], shards=folder)
    assert not folder.exists() and ckpt.shards == ckpt.path / "shards"
    assert sorted(read_manifest(ckpt.path)["files"]) == ["shards/.metadata", "shards/__0_0.distcp",
                                                         "shards/__1_0.distcp", "state.json"]
    assert store.latest().step == 4 and list(store.rows("steps")["step"]) == [1, 2, 3, 4]
    assert store.latest().shards is not None and RunStore(tmp_path).checkpoint_dirs()[0][0] == 2
    (ckpt.shards / "__1_0.distcp").write_bytes(b"rank X")  # same size, other bytes
    with pytest.warns(RuntimeWarning, match=r"ckpt-000004.*__1_0\.distcp.*sha256.*using .*ckpt-000002"):
        assert store.latest().step == 2


def test_corrupt_checkpoint_falls_back_with_warning(tmp_path):
    store = RunStore(tmp_path)
    _save(store, 2, 1)
    newest = _save(store, 4, 3)
    data = bytearray((newest.path / "model.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different bytes
    (newest.path / "model.pt").write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match=r"ckpt-000004.*model\.pt.*sha256.*using .*ckpt-000002"):
        latest = store.latest()
    assert latest.step == 2
    assert torch.equal(latest.model_state()["w"], _model_state(2)["w"])
    # rows count only up to the valid checkpoint
    with pytest.warns(RuntimeWarning):
        assert list(store.rows("steps")["step"]) == [1, 2]


def test_truncated_file_is_detected(tmp_path):
    store = RunStore(tmp_path)
    _save(store, 2, 1)
    newest = _save(store, 4, 3)
    path = newest.path / "optimizer.pt"
    path.write_bytes(path.read_bytes()[:10])
    with pytest.warns(RuntimeWarning, match=r"optimizer\.pt has 10 bytes.*truncated"):
        assert store.latest().step == 2


def test_corrupt_row_part_invalidates_its_checkpoint(tmp_path):
    store = RunStore(tmp_path)
    _save(store, 2, 1)
    _save(store, 4, 3)
    part = tmp_path / "steps-000004.parquet"
    part.write_bytes(part.read_bytes()[:-5])
    with pytest.warns(RuntimeWarning, match="steps-000004.parquet"):
        assert store.latest().step == 2


def test_interrupted_write_without_manifest_is_skipped(tmp_path):
    store = RunStore(tmp_path)
    _save(store, 2, 1)
    newest = _save(store, 4, 3)
    (newest.path / "MANIFEST.json").unlink()
    with pytest.warns(RuntimeWarning, match="no MANIFEST.json"):
        assert store.latest().step == 2


def test_all_checkpoints_corrupt_gives_none(tmp_path):
    store = RunStore(tmp_path)
    ckpt = _save(store, 2, 1)
    (ckpt.path / "state.json").write_text("{}")
    with pytest.warns(RuntimeWarning, match="no valid checkpoint remains"):
        assert store.latest() is None


def test_rollback_deletes_later_parts_checkpoints_and_done(tmp_path):
    store = RunStore(tmp_path)
    _save(store, 2, 1)
    newest = _save(store, 4, 3)
    store.mark_done("failed", error="boom")
    (newest.path / "MANIFEST.json").unlink()
    # a part written just before a crash, never committed by a manifest
    (tmp_path / "steps-000006.parquet").write_bytes(b"partial")
    with pytest.warns(RuntimeWarning):
        resume_from = store.latest()
    store.rollback_to(resume_from)
    assert _ckpt_dirs(tmp_path) == ["ckpt-000002"]
    assert sorted(p.name for p in tmp_path.glob("*.parquet")) == ["evals-000002.parquet", "steps-000002.parquet"]
    assert store.done() is None
    # the resumed run writes steps 3-4 again: no duplicates, none missing
    _save(store, 4, 3)
    assert list(store.rows("steps")["step"]) == [1, 2, 3, 4]


def test_rollback_to_none_clears_everything(tmp_path):
    store = RunStore(tmp_path)
    _save(store, 2, 1)
    store.rollback_to(None)
    assert _ckpt_dirs(tmp_path) == [] and not list(tmp_path.glob("*.parquet"))
    assert store.latest() is None


def test_full_disk_names_path_and_keeps_earlier_checkpoint(tmp_path, monkeypatch):
    store = RunStore(tmp_path / "run")
    _save(store, 2, 1)
    real_write = checkpoint_module._write_bytes
    calls = []

    def full_disk(path, data):
        calls.append(path)
        if len(calls) > 2:  # let the row parts through, fail inside the checkpoint directory
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_write(path, data)

    monkeypatch.setattr(checkpoint_module, "_write_bytes", full_disk)
    with pytest.raises(OSError, match=str(tmp_path / "run")) as info:
        _save(store, 4, 3)
    assert info.value.errno == errno.ENOSPC
    monkeypatch.setattr(checkpoint_module, "_write_bytes", real_write)
    latest = store.latest()  # no warning: the failed write left no half checkpoint behind
    assert latest.step == 2
    assert _ckpt_dirs(tmp_path / "run") == ["ckpt-000002"]
    assert list(store.rows("steps")["step"]) == [1, 2]
    # the parts written before the failure are removed: no row past the last commit stays
    assert sorted(p.name for p in (tmp_path / "run").glob("*.parquet")) == ["evals-000002.parquet",
                                                                             "steps-000002.parquet"]


def test_unwritable_directory_gives_error_naming_path(tmp_path):
    root = tmp_path / "readonly"
    root.mkdir()
    store = RunStore(root)
    os.chmod(root, 0o500)
    try:
        probe = root / "probe"
        try:
            probe.write_bytes(b"x")
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip("chmod does not stop writes here (running as root); the full-disk test covers OSError")
        with pytest.raises(OSError, match=str(root)):
            _save(store, 2, 1)
        with pytest.raises(OSError, match="done.json"):
            store.mark_done("finished")
    finally:
        os.chmod(root, 0o700)


def test_done_marker(tmp_path):
    store = RunStore(tmp_path)
    assert store.done() is None
    store.mark_done("failed", error="step 3: NaN", steps=2)
    assert store.done() == {"status": "failed", "error": "step 3: NaN", "steps": 2}
    store.mark_done("finished", steps=5)
    assert store.done()["status"] == "finished"
    with pytest.raises(ValueError, match="status"):
        store.mark_done("crashed")


def test_bad_input(tmp_path):
    store = RunStore(tmp_path)
    with pytest.raises(ValueError, match="kind"):
        store.rows("metrics")
    with pytest.raises(ValueError, match="step"):
        store.save(-1, {}, {}, {})
    with pytest.raises(ValueError, match="JSON"):
        store.save(1, {}, {}, {"bad": object()})
    assert not list(tmp_path.iterdir())  # nothing half-written
    with pytest.raises(ValueError, match="keep"):
        RunStore(tmp_path, keep=0)


def test_rows_empty_before_any_checkpoint(tmp_path):
    store = RunStore(tmp_path / "nothing")
    assert isinstance(store.rows("evals"), pd.DataFrame) and store.rows("evals").empty


@pytest.mark.parametrize("damage", ["truncate_weights", "tamper_old_part", "truncate_last_part"])
def test_finished_run_with_damage_is_not_done_and_resumes_from_last_good(tmp_path, damage):
    store = RunStore(tmp_path / "run", keep=3)
    for step, start in ((2, 1), (4, 3), (6, 5)):
        _save(store, step, start)
    store.mark_done("finished", steps=6)
    assert store.done()["status"] == "finished" and store.damage() is None
    root = tmp_path / "run"
    if damage == "truncate_weights":
        target, good = root / "ckpt-000006" / "model.pt", 4
        target.write_bytes(target.read_bytes()[:10])
    elif damage == "tamper_old_part":
        target, good = root / "steps-000004.parquet", 2
        target.write_bytes((root / "steps-000002.parquet").read_bytes())
    else:
        target, good = root / "evals-000006.parquet", 4
        target.write_bytes(target.read_bytes()[:-5])
    assert target.name in store.damage()
    with pytest.warns(RuntimeWarning, match="marked finished but is damaged"):
        assert store.done() is None  # so the trainer resumes it instead of skipping it
    with pytest.warns(RuntimeWarning, match="skipping corrupt checkpoint"):
        latest = store.latest()
    assert latest.step == good
    store.rollback_to(latest)
    assert max(store.rows("steps")["step"]) == good and store.damage() is None


def test_manifest_commits_every_part_so_far(tmp_path):
    store = RunStore(tmp_path / "run")
    for step, start in ((2, 1), (4, 3), (6, 5)):
        _save(store, step, start)
    parts, problem = manifest_module.committed_parts(tmp_path / "run")
    assert problem is None
    assert parts == [f"{k}-{s:06d}.parquet" for k in ("evals", "steps") for s in (2, 4, 6)]
