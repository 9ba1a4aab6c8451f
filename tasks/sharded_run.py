"""A sweep run on several devices (``sweep.devices_per_run`` > 1): ``torchrun`` starts one
process per device on this node, each runs this module, and the run is one FSDP2-sharded
GRPO run (:mod:`rollscale.train.distributed`).

:func:`train_sharded` (called by :func:`tasks.sweep.train_run` in its worker) writes the
run's arguments to ``<run_dir>/.sharded-args.pt``, starts ``torchrun --standalone
--nproc_per_node N -m tasks.sharded_run <that file>`` and reads the result rank 0 wrote.
Every rank writes its shards of each checkpoint, rank 0 the rows, manifests and done marker
(:mod:`rollscale.train.sharded_checkpoint`); every rank resumes from it.
One rank failing or killed ends the others (torchrun's agent stops the group), and the run
resumes from its last checkpoint when it is started again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from rollscale.train.run_config import RunResult

ARGS, RESULT = ".sharded-args.pt", ".sharded-result.json"


def train_sharded(devices: int, torch_threads: int, **run) -> RunResult:
    """One run over ``devices`` processes; ``run``: :func:`tasks.sweep.train_run`'s arguments
    (ref, config, bucket, train_problems, val_problems, run_dir, lora, device, sampling, budget)."""
    run_dir = Path(run["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RESULT).unlink(missing_ok=True)
    torch.save(run, run_dir / ARGS)
    env = dict(os.environ, OMP_NUM_THREADS=str(torch_threads), ROLLSCALE_TORCH_THREADS=str(torch_threads))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={devices}",
           "-m", "tasks.sharded_run", str(run_dir / ARGS)]
    done = subprocess.run(cmd, env=env, cwd=Path(__file__).resolve().parents[1], preexec_fn=_die_with_parent)
    if done.returncode != 0 or not (run_dir / RESULT).exists():
        raise RuntimeError(f"run {run['config'].run_id}: the sharded run ({devices} processes) exited with "
                           f"status {done.returncode}; its ranks' errors are above; it resumes from its last checkpoint")
    return RunResult(**json.loads((run_dir / RESULT).read_text()))


def _die_with_parent() -> None:
    """torchrun gets SIGTERM when this worker dies (the sweep's Ctrl-C ends its workers with SIGTERM,
    and a worker ignores SIGINT), and its agent then stops every rank: no run trains on orphaned."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _rank_main(args_path: str) -> None:
    from rollscale.train.checkpoint import RunStore
    from rollscale.train.distributed import destroy_ranks, init_ranks
    from rollscale.train.trainer import GRPOTrainer
    from tasks.models import resolve_device, training_model

    torch.set_num_threads(int(os.environ.get("ROLLSCALE_TORCH_THREADS", "1")))
    run = torch.load(args_path, weights_only=False)
    ranks = init_ranks(resolve_device(run["device"]))
    try:
        with training_model(run["ref"], run["sampling"], run["lora"], run["device"]) as (model, tok, engine, use_lora):
            trainer = GRPOTrainer(model, tok, run["train_problems"], run["val_problems"], run["config"],
                                  use_chat_template=run["ref"].chat_template, lora=use_lora, engine=engine,
                                  chat_template_kwargs=run["sampling"].chat_template_kwargs, ranks=ranks)
            result = trainer.run(RunStore(run["run_dir"]), budget=run["budget"])
        if ranks.leader:
            tmp = Path(run["run_dir"]) / (RESULT + ".tmp")
            tmp.write_text(json.dumps(dataclasses.asdict(result)))
            os.replace(tmp, Path(run["run_dir"]) / RESULT)
    finally:
        destroy_ranks()


if __name__ == "__main__":
    _rank_main(sys.argv[1])
