"""Errors a person can read: each user-facing error, run through the `rollscale` command, prints
one short message naming the place (file and line, params key, model path) and exits non-zero;
`--debug` shows the traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def rollscale(root: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PREFECT_HOME": str(root / "prefect-home")}
    return subprocess.Popen([sys.executable, "-m", "rollscale.pipeline.cli", "--artifacts", str(root / "artifacts"),
                             *args, "--params", str(root / "params.yaml")], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def short(stderr: str) -> str:
    """The one message: a ``rollscale: `` line, then at most a few indented detail lines (one per
    bad params key); fails if the output is a traceback or long."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    start = [i for i, line in enumerate(lines) if line.startswith("rollscale: ")]
    assert len(start) == 1 and len(lines) <= 8, stderr[-3000:]
    message = lines[start[0]:]
    assert all(line.startswith("  ") for line in message[1:]), stderr[-3000:]
    assert all(len(line) < 400 for line in message)
    return "\n".join(message)


def case(root: Path, params: dict) -> Path:
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root


def test_params_error_is_one_line_and_debug_shows_the_traceback(tmp_path):
    root = case(tmp_path / "params", {"profile": {"k": 0}})
    proc = rollscale(root, "run", "profile")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "profile.k" in short(err)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollscale.pipeline.cli", "--debug", "run", "profile", "--params",
         str(root / "params.yaml")], cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "Traceback" in err and "profile.k" in "\n".join(err.splitlines()[-3:])
    # the stages are dvc.yaml's: an unknown one is refused naming them, before any process starts
    proc = rollscale(case(tmp_path / "stage", {}), "run", "bukket")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "unknown stage(s) ['bukket'] (dvc.yaml has: base, profile, bucket," in err


@pytest.mark.slow
def test_stage_errors_are_short_and_name_the_place(tmp_path):
    from rollscale.lm.models import ModelRef

    # a data row with a control character in its JSON (and the message says "at" once)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "a\x01b", "answer": "#### 3"}\n')
    data_row = case(tmp_path / "data_row", {"data": {"source": "gsm8k", "path": str(bad)}})
    # a bucket that later stages need is empty
    bucket = case(tmp_path / "bucket", {"bucket": {"used": ["easy"], "mixtures": {}, "easy": [0.4, 0.5]}})
    pd.DataFrame({"problem_id": ["p1", "p2"], "avg_at_k": [0.0, 1.0], "n_correct": [0, 4], "k": [4, 4],
                  "n_correct_extreme": [0, 8]}).to_parquet((bucket / "artifacts" / "profile").mkdir(parents=True)
                                                           or bucket / "artifacts" / "profile" / "profile.parquet")
    # the base model is gone
    model = case(tmp_path / "model", {"data": {"size": 4}})
    (model / "artifacts" / "base").mkdir(parents=True)
    missing = tmp_path / "no-such-model"
    (model / "artifacts" / "base" / "model_ref.json").write_text(ModelRef(str(missing), fingerprint="x").to_json())

    procs = {"data_row": rollscale(data_row, "run", "base"), "bucket": rollscale(bucket, "run", "bucket"),
             "model": rollscale(model, "run", "profile")}
    out = {name: (p.communicate(timeout=600)[1], p.returncode) for name, p in procs.items()}

    err, code = out["data_row"]
    message = short(err)
    assert code == 2 and f"{bad} line 2" in message and "at at" not in message and "Invalid control character" in message
    err, code = out["bucket"]
    message = short(err)
    assert code == 2 and "bucket 'easy' is empty" in message and "section bucket" in message
    err, code = out["model"]
    message = short(err)
    assert code == 2 and f"{missing} not found" in message  # bad input (issue 42, case 6: was exit 1)


def test_lock_races_and_refused_stages_are_one_line_not_internal_errors():
    """Issue 31, part 4: DVC's lock held by another study, and a stage that `dvc repro` ran and that refused
    (its own message and exit status passed on, not DVC's exit 255), are no internal errors."""
    from dvc.lock import LockError

    from rollscale.pipeline.errors import explain
    from rollscale.pipeline.stages.specs import StageFailedError

    message, code = explain(LockError("'/s/artifacts/measure' is busy, it is being blocked by:"))
    assert code == 1 and "internal error" not in message and "\n" not in message, message
    assert "'/s/artifacts/measure' is busy" in message and "run again" in message
    message, code = explain(StageFailedError("stage 'fit' stopped: bucket: bucket 'easy' is empty", 2))
    assert (message, code) == ("stage 'fit' stopped: bucket: bucket 'easy' is empty", 2)


def test_a_missing_engine_or_memory_is_one_line_of_the_environment_not_an_internal_error():
    """Issue 55, case 7: `sampling.backend: vllm` where vLLM is not installed ended `run profile` with "internal
    error ImportError" (exit 3): one line naming what to install, exit 1 (a pool stops at the first such unit:
    rollscale.pipeline.runtime.workers.run_all). A MemoryError is the machine's too."""
    from rollscale.lm.engines.vllm import VLLMEngine
    from rollscale.pipeline.errors import explain

    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError) as missing:
            VLLMEngine.from_config(None, None, None)
        message, code = explain(missing.value)
        assert code == 1 and message.startswith("sampling.backend 'vllm' needs vLLM: `pip install vllm`"), message
    message, code = explain(ModuleNotFoundError("No module named 'vllm'"))
    assert code == 1 and "\n" not in message and "install it here, or change the setting" in message, message
    # a bare KeyError names its key alone ("rollscale: bucket", exit 2, for a foreign decision table): no
    # code of the project raises one, so it is shown as the bug it is, with its class
    assert explain(KeyError("bucket")) == ("internal error KeyError: 'bucket' (run with --debug for the traceback)", 3)
    message, code = explain(MemoryError("Unable to allocate 233. GiB for an array"))
    assert code == 1 and message.startswith("out of memory (Unable to allocate 233. GiB") and "internal" not in message


def test_a_worker_killed_mid_stage_is_one_line_saying_the_work_is_kept():
    """A pool worker that dies (killed, or the OOM killer) broke the sweep with "internal error BrokenProcessPool"
    (2026-11-27): one line, exit 1, saying that a rerun resumes."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    from rollscale.pipeline.errors import explain

    with ProcessPoolExecutor(1) as pool:
        with pytest.raises(Exception) as died:
            pool.submit(os._exit, 9).result()
    message, code = explain(died.value)
    assert type(died.value).__name__ == "BrokenProcessPool"
    assert code == 1 and "internal error" not in message and "\n" not in message, message
    assert "worker process ended abruptly" in message and "resume" in message


def _lock_holder(path: Path, hold: str = "time.sleep(60)") -> subprocess.Popen:
    """Another process that takes ``path``'s stage lock, says so, then runs ``hold``."""
    code = ("import sys, time; from filelock import FileLock; lock = FileLock(sys.argv[1]); lock.acquire(); "
            f"print('held', flush=True); {hold}")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_running_stage_is_named_by_the_process_that_holds_it(tmp_path):
    """Issue 42, case 6: two studies started together said "stage 'base' is already running (pid None on None,
    since None)": the holder had not written its record yet (or a killed run's record was read)."""
    import json
    import socket

    from rollscale.pipeline.errors import explain
    from rollscale.pipeline.stages.specs import LOCK, RUN_INFO, busy_error, stage_running

    folder = tmp_path / "artifacts" / "base"
    folder.mkdir(parents=True)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a killed run's record stays behind: its pid is no process now
    (folder / RUN_INFO).write_text(json.dumps({"stage": "base", "pid": gone.pid, "host": socket.gethostname(),
                                               "started_at": "2026-11-27T01:00:00+00:00"}))
    holder = _lock_holder(folder / LOCK)
    try:
        assert stage_running(tmp_path / "artifacts", "base")
        message, code = explain(busy_error("base", tmp_path / "artifacts"))
        assert code == 1 and f"stage 'base' is already running (pid {holder.pid} on {socket.gethostname()}" in message
        assert "None" not in message and str(gone.pid) not in message and "\n" not in message
    finally:
        holder.kill()
        holder.wait()


def test_a_look_at_the_lock_never_refuses_the_stage_that_starts_then(tmp_path):
    """`rollscale status` or a second study looks at a stage's lock by taking it for an instant: a stage
    starting in that instant refused, naming no holder (issue 42, case 6)."""
    from rollscale.pipeline.stages.specs import LOCK, stage_lock

    folder = tmp_path / "artifacts" / "bucket"
    folder.mkdir(parents=True)
    looker = _lock_holder(folder / LOCK, "lock.release()\nfrom filelock import Timeout\nfor _ in range(4000):\n"
                          "    try:\n        lock.acquire(timeout=0)\n    except Timeout:\n        continue\n"
                          "    time.sleep(0.002); lock.release(); time.sleep(0.001)")
    try:
        for _ in range(10):
            with stage_lock("bucket", tmp_path / "artifacts"):
                pass
        assert looker.poll() is None  # it was looking all along
    finally:
        looker.kill()
        looker.wait()


def _dvc_study(folder: Path) -> Path:
    """A study folder as a clone has it: git, DVC over git, a dvc.yaml of one stage."""
    folder.mkdir()
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=folder, check=True)
    (folder / "dvc.yaml").write_text("stages:\n  base:\n    cmd: echo base\n")
    return folder


def _status(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rollscale.pipeline.cli", "status"], cwd=folder, text=True,
                          capture_output=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_study_folder_without_its_git_is_one_line_with_the_fix(tmp_path):
    """Issue 42, case 6: "internal error SCMError" (exit 3)."""
    import shutil

    folder = _dvc_study(tmp_path / "study")
    shutil.rmtree(folder / ".git")
    r = _status(folder)
    message = short(r.stderr)
    assert r.returncode == 1 and "is not a git repository" in message and "internal error" not in message
    assert "dvc config core.no_scm true" in message


# a study file DVC or rollscale reads, broken: (file, its bytes, exit status, the message's start, its fix)
BROKEN_STUDY_FILES = {
    # issue 42, case 6: "internal error YAMLSyntaxError" (exit 3)
    "dvc.lock not YAML": ("dvc.lock", b'schema: "2.0"\nstages:\n  base: [unclosed\n   : :\n', 1,
                          "rollscale: dvc.lock is not valid YAML (line 4)",
                          "restore it (`git checkout dvc.lock` in a clone) or delete it"),
    # issue 55, case 7: "internal error EncodingError" (exit 3)
    "dvc.lock not UTF-8": ("dvc.lock", b'schema: "2.0"\nstages: {\xff\xfe}\n', 1, "rollscale: dvc.lock is not UTF-8 text",
                           "restore it (`git checkout dvc.lock` in a clone) or delete it"),
    # issue 55, part 6: PyYAML's own errors (rollscale reads dvc.yaml itself) were "internal error ParserError"
    "dvc.yaml not YAML": ("dvc.yaml", b"stages:\n  base: [unclosed\n   : :\n", 2,
                          "rollscale: dvc.yaml is not valid YAML (line 3): ", "restore it (`git checkout dvc.yaml`)"),
}


@pytest.mark.parametrize("case", BROKEN_STUDY_FILES)
def test_a_broken_study_file_is_named_with_the_fix(tmp_path, case):
    name, data, code, starts, fix = BROKEN_STUDY_FILES[case]
    folder = _dvc_study(tmp_path / "study")
    (folder / name).write_bytes(data)
    r = _status(folder)
    message = short(r.stderr)
    assert r.returncode == code and message.startswith(starts) and fix in message, message


def test_status_refuses_a_yaml_bomb_in_params_before_dvc_reads_it(tmp_path):
    """Issue 55, case 6: a YAML bomb in params.yaml hung `status` (2.2 GB, killed at 60-120 s)."""
    from tests.test_bad_settings import YAML_BOMB

    folder = _dvc_study(tmp_path / "study")
    (folder / "params.yaml").write_text(YAML_BOMB)
    r = _status(folder)
    message = short(r.stderr)
    assert r.returncode == 2 and message.startswith("rollscale: params.yaml: its aliases (*name) expand to"), message


def test_dvcs_line_for_a_stage_stopped_by_a_signal_is_dropped_and_no_other():
    """Ctrl-C to `rollscale study` is the stage's one line: DVC's "failed to reproduce ... exited with 130" after it
    raced with the study ending DVC (CI, 2026-11-27). The launcher's filter drops that record, from DVC's own
    exception classes, and keeps every other error of DVC's."""
    import logging

    from dvc.exceptions import ReproductionError
    from dvc.stage.exceptions import StageCmdFailedError

    from rollscale.pipeline.stages.dvc_quiet import drops

    def record(err: BaseException) -> logging.LogRecord:
        try:
            raise err
        except BaseException:
            import sys

            return logging.LogRecord("dvc.cli", logging.ERROR, __file__, 1, "", None, sys.exc_info())

    def failed(status: int) -> ReproductionError:
        try:
            raise ReproductionError("failed to reproduce 'sweep'") from StageCmdFailedError("python -m flows sweep",
                                                                                            status)
        except ReproductionError as err:
            return err

    assert drops(record(failed(130))) and drops(record(failed(143)))
    assert drops(record(failed(-2))) and drops(record(failed(-15)))  # the stage's process killed by the signal
    assert not drops(record(failed(1))) and not drops(record(failed(2)))  # a stage that failed: DVC says so
    assert not drops(record(failed(-9))) and not drops(record(failed(-11)))  # killed otherwise: DVC says so
    assert not drops(record(ReproductionError("failed to reproduce 'sweep'")))
    assert not drops(logging.LogRecord("dvc.cli", logging.ERROR, __file__, 1, "configuration error", None, None))
