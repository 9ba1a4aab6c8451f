"""The outer loop of a GRPO run (science §1, §5): evaluate at step 0, train steps until
C >= c_max, evaluate every ``eval_every`` steps and at the end, checkpoint every
``checkpoint_every`` steps and at the end, resume from the newest valid checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rollscale.train.checkpoint import RunStore
from rollscale.train.run_config import RunResult
from rollscale.train.step import NonFiniteLossError

if TYPE_CHECKING:
    from rollscale.train.trainer import GRPOTrainer


def run(
    trainer: GRPOTrainer,
    store: RunStore,
    on_step: Callable[[dict], None] | None = None,
    on_eval: Callable[[dict], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Train until cumulative C >= c_max (science §1), resuming from ``store``.

    Evaluates at step 0, every ``eval_every`` steps and at the end;
    checkpoints every ``checkpoint_every`` steps and at the end, with the
    rows since the previous checkpoint. A run whose ``done.json`` says
    finished is not trained again (its last checkpoint is loaded); a failed
    one is retried from its newest valid checkpoint. ``on_step`` /
    ``on_eval`` get each row, ``progress`` gets ``(c, c_max)`` after each step.

    A non-finite loss ends the run as "failed": the rows of the good steps
    before it are checkpointed, ``done.json`` records the error. Any other
    exception is recorded in ``done.json`` as failed and raised again.
    """
    cfg = trainer.config
    done = store.done()
    if done is not None and done.get("status") == "finished":
        trainer._check_same_run(done, store)
        ckpt = store.latest()
        if ckpt is not None:
            trainer.load_checkpoint(ckpt)
        return trainer._result("finished", None)
    ckpt = store.latest()
    if ckpt is not None:
        trainer._check_same_run(ckpt.state, store)
        trainer.load_checkpoint(ckpt)
    store.rollback_to(ckpt)

    step_rows: list[dict] = []
    eval_rows: list[dict] = []

    def log_eval() -> None:
        row = trainer.evaluate()
        eval_rows.append(row)
        if on_eval is not None:
            on_eval(row)

    info = {"run_id": cfg.run_id, "config_hash": trainer.config_hash}
    try:
        if trainer.last_eval_step < 0:
            log_eval()  # step 0: before training
        while trainer.c < cfg.c_max:
            row = trainer.train_step()
            step_rows.append(row)
            if on_step is not None:
                on_step(row)
            if progress is not None:
                progress(trainer.c, cfg.c_max)
            if trainer.step % cfg.eval_every == 0:
                log_eval()
            if trainer.step % cfg.checkpoint_every == 0:
                trainer._save(store, step_rows, eval_rows)
        if trainer.last_eval_step != trainer.step:
            log_eval()
        if step_rows or eval_rows:
            trainer._save(store, step_rows, eval_rows)
    except NonFiniteLossError as err:
        if step_rows or eval_rows:
            trainer._save(store, step_rows, eval_rows)
        store.mark_done("failed", error=str(err), steps=trainer.step, c=trainer.c, c_tokens=trainer.c_tokens, **info)
        return trainer._result("failed", str(err))
    except Exception as err:
        try:
            store.mark_done("failed", error=f"{type(err).__name__}: {err}", steps=trainer.step, c=trainer.c,
                            c_tokens=trainer.c_tokens, **info)
        except OSError:
            pass  # the store itself is failing; the original error says why
        raise
    store.mark_done("finished", steps=trainer.step, c=trainer.c, c_tokens=trainer.c_tokens, **info)
    return trainer._result("finished", None)
