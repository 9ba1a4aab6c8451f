"""Independent units of work side by side: one dispatch path for every stage.

Sweep runs, profile chunks and measure's group sizes are independent and seeded
per unit (a run's seed, a chunk's index), never per worker, so the results do
not depend on how many workers there are or which one ran what. They are
submitted to a Prefect task runner: a local process pool (``workers``
processes of ``torch_threads`` threads each; one process per core is what the
tiny model needs, since two torch threads on a shared core ran 18x slower), or,
for the sweep on a cluster, Ray (:mod:`tasks.ray_sweep`) — the same submit and
collect code either way.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable

from prefect.futures import PrefectFuture, as_completed
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner

from rollscale.pipeline.errors import DEBUG_ENV, debug_enabled

log = logging.getLogger("rollscale")


# settings the workers need: the same Prefect API (else each worker starts its own
# temporary server, 15-20 s of start-up each on a loaded 2-core machine, and its task
# runs land nowhere the flow can see)
_FORWARDED_ENV = ("PREFECT_SERVER_ANALYTICS_ENABLED", "PREFECT_LOGGING_LEVEL", "PREFECT_API_KEY", DEBUG_ENV)


def worker_env(api_url: str) -> dict[str, str]:
    """Environment variables for worker processes: this flow's Prefect API and settings, and
    every HF_* (hub cache, token, offline mode) and CUDA_* (visible devices) variable."""
    env = {k: os.environ[k] for k in _FORWARDED_ENV if k in os.environ}
    env.update({k: v for k, v in os.environ.items() if k.startswith(("HF_", "CUDA_"))})
    env["PREFECT_API_URL"] = api_url
    return env


def quiet_prefect(debug: bool = False) -> None:
    """Prefect logs a failed run's traceback itself; the one-line error the stage prints
    (:mod:`rollscale.pipeline.errors`) is what a person reads. ``--debug`` keeps them."""
    if not debug:
        for name in ("prefect.flow_runs", "prefect.task_runs", "prefect.flow_engine", "prefect.task_engine"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def flow_api_url() -> str:
    """The API this flow reports to (a temporary one when none is configured)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return str(client.api_url)


def init_worker(torch_threads: int, env: dict[str, str]) -> None:
    """Run once in every worker process, before its first task: the flow's Prefect API,
    the torch thread count, and Prefect's own failure tracebacks off (the stage prints one line).
    Ctrl-C is for the flow's process to act on: it ends the workers (:func:`stop_units`), so a
    worker ignores SIGINT instead of printing a traceback and taking the next unit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env)
    quiet_prefect(debug_enabled())
    import torch

    torch.set_num_threads(torch_threads)


def local_runner(workers: int, torch_threads: int) -> TaskRunner:
    """``workers`` processes side by side; one worker runs in this process (no start-up cost).
    Call inside a flow: the workers report to its API."""
    if workers <= 1:
        return ThreadPoolTaskRunner(max_workers=1)
    # after an interrupt the stage exits without closing the pool (stop_units), and the process
    # multiprocessing keeps to free its locks would warn that they were left: it frees them silently
    os.environ.setdefault("PYTHONWARNINGS", "ignore:resource_tracker:UserWarning")
    return ProcessPoolTaskRunner(max_workers=workers, initializer=init_worker,
                                 initargs=(torch_threads, worker_env(flow_api_url())))


def submit_all(runner: TaskRunner, task, params: list[dict[str, Any]]) -> list[PrefectFuture]:
    """Submit one task run per parameter set (inside an entered runner)."""
    return [runner.submit(task, p) for p in params]


def run_all(
    runner: TaskRunner, task, params: list[dict[str, Any]], labels: list[str],
    on_result: Callable[[int, Any], list[tuple[dict[str, Any], str]] | None] | None = None,
) -> tuple[dict[int, Any], list[tuple[str, BaseException]]]:
    """Run every unit on ``runner``; returns {index: result} and (label, error) per unit that
    raised (each logged as it happens). ``on_result(index, result)`` is called in the flow's
    process as each unit finishes; it may return new (params, label) units, submitted at once
    (a search's next rung of one group: a barrier for that group's runs only) and
    indexed after the ones before them."""
    params, labels = list(params), list(labels)
    results, errors = {}, []
    runner.__enter__()
    futures: list[PrefectFuture] = []
    index: dict[int, int] = {}

    def submit(batch: list[dict[str, Any]]) -> None:
        for p in batch:
            futures.append(runner.submit(task, p))
            index[id(futures[-1])] = len(futures) - 1

    try:
        submit(params)
        pending = set(range(len(futures)))
        while pending:
            for future in as_completed([futures[i] for i in sorted(pending)]):
                i = index[id(future)]
                pending.discard(i)
                try:
                    results[i] = future.result()
                except ImportError:  # the machine lacks a module every unit needs (vLLM): the others would too
                    stop_units(runner, futures)
                    raise
                except Exception as err:  # reported after the other units finish
                    log.error("%s failed: %s: %s", labels[i], type(err).__name__, err)
                    errors.append((labels[i], err))
                    continue
                new = on_result(i, results[i]) if on_result is not None else None
                if new:  # wait on the new units too: as_completed's set is fixed, so start it again
                    params += [p for p, _ in new]
                    labels += [label for _, label in new]
                    first = len(futures)
                    submit([p for p, _ in new])
                    pending.update(range(first, len(futures)))
                    break
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (rollscale.pipeline.interrupts): stop, do not finish
        stop_units(runner, futures)
        raise
    except ImportError:  # the units were stopped where it was raised
        raise
    except BaseException:
        runner.__exit__(*sys.exc_info())
        raise
    runner.__exit__(None, None, None)
    return results, errors


def stop_units(runner: TaskRunner, futures: list[PrefectFuture]) -> None:
    """Stop every unit at once: queued ones never start, running ones end where they are.

    Each unit commits its results atomically (a sweep run's checkpoint is whole or absent, a
    profile chunk is one file), so ending it mid-way loses only the work since its last commit.
    Pool processes get SIGTERM, Ray tasks are cancelled (their worker processes killed); a unit
    running in a thread of this process stops at its next progress update
    (:class:`rollscale.pipeline.progress.Progress`), which the runner's exit waits for.
    """
    executor = getattr(runner, "_executor", None)  # Prefect's process pool has no public handle to it
    if isinstance(executor, ProcessPoolExecutor):
        processes = list((getattr(executor, "_processes", None) or {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(timeout=3)
            if process.is_alive():
                process.kill()
                process.join()
        # the pool itself is not closed: a worker may have died holding its queues' locks, so
        # closing would wait forever; the stage's process exits next (rollscale.pipeline.interrupts)
        return
    refs = [f.wrapped_future for f in futures if type(f).__name__ == "PrefectRayFuture"]
    if refs:
        import ray

        for ref in refs:
            try:
                ray.cancel(ref, force=True)
            except Exception as err:  # noqa: BLE001 - a finished task cannot be cancelled; go on with the rest
                log.debug("ray.cancel: %s", err)
    runner.__exit__(None, None, None)  # waits for a unit in a thread to stop; stops a Ray this sweep started


def raise_first_error(what: str, errors: list[tuple[str, BaseException]]) -> None:
    """After every unit has run (the others' results are stored): raise the first unit's own
    error, so the stage's message names its cause (a missing model, a bad row), not the pool.
    Every failed unit was logged by :func:`run_all`."""
    if errors:
        if len(errors) > 1:
            log.error("%s: %d of the units failed (each logged above); the first error follows", what, len(errors))
        raise errors[0][1]
