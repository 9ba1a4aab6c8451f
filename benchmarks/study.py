"""Wall seconds of the study, stage by stage, from a clean artifacts folder.

    python benchmarks/study.py                      # the default study (params.yaml)
    python benchmarks/study.py --set sweep.c_max=4000 --compare-workers 1 2
    python benchmarks/study.py --fresh-clone        # the README's `make study` in a fresh clone

``--fresh-clone`` clones this repository's HEAD into a temporary folder and runs
the README's first command there as two timed parts: ``make install`` with the
package caches off (what a fresh machine downloads) and ``make study``; a
stage's wall time runs from the line announcing it to the next one, so it
includes DVC's and the stage process's start-up.

Each stage runs as ``rollscale run <stage>`` (what ``dvc repro`` runs) in a fresh
process, in dvc.yaml order, so the times include start-up. ``--set key=value``
overrides params (dotted keys, YAML values) in a copy of the params file.
``--compare-workers 1 2`` runs the sweep again with each worker count on the
same prepared stages and prints the speed-up, measured in the same run.
The table names the machine's core count and its load average, since a
loaded machine stretches every figure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rollscale.pipeline.stages.specs import load_stage_specs  # noqa: E402


def set_key(params: dict, dotted: str, value: str) -> None:
    *path, last = dotted.split(".")
    node = params
    for key in path:
        node = node.setdefault(key, {})
    node[last] = yaml.safe_load(value)


def run_stage(stage: str, params: Path, artifacts: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rollscale.pipeline.cli", "--artifacts", str(artifacts), "run", stage,
                    "--params", str(params)], check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def fresh_clone_study(keep: str | None) -> None:
    """``make install`` (cache-free) and ``make study`` in a fresh clone of HEAD, timed; ``keep``:
    a folder that receives the clone's artifacts and ``dvc.lock``."""
    work = Path(tempfile.mkdtemp(prefix="rollscale-fresh."))
    clone = work / "rollscale"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {**os.environ, "UV_NO_CACHE": "1", "PIP_NO_CACHE_DIR": "1"}
    env.pop("VIRTUAL_ENV", None)
    load0 = os.getloadavg()[0]
    start = time.perf_counter()
    subprocess.run(["make", "install"], cwd=clone, env=env, check=True, stdout=subprocess.DEVNULL)
    install = time.perf_counter() - start
    marks: list[tuple[str, float]] = []
    start = time.perf_counter()
    proc = subprocess.Popen(["make", "study"], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    with (work / "study.log").open("w") as log:
        for line in proc.stdout:
            log.write(line)
            if m := re.match(r"study: (\w+): running", line):
                marks.append((m.group(1), time.perf_counter() - start))
                print(f"  {m.group(1)} starts at {marks[-1][1]:.0f} s", file=sys.stderr)
    if proc.wait() != 0:
        raise SystemExit(f"make study failed: see {work / 'study.log'}")
    study = time.perf_counter() - start
    ends = [t for _, t in marks[1:]] + [study]
    print(f"{os.cpu_count()} cores; load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print("\n| part | wall seconds |\n| --- | ---: |")
    print(f"| install (`make install`, no package cache) | {install:.1f} |")
    print(f"| study start-up (before the first stage) | {marks[0][1] if marks else study:.1f} |")
    for (stage, t0), t1 in zip(marks, ends):
        print(f"| {stage} | {t1 - t0:.1f} |")
    print(f"| **all** (`make study` on a fresh clone) | **{install + study:.1f}** |")
    if keep:
        shutil.rmtree(keep, ignore_errors=True)
        shutil.copytree(clone / "artifacts", Path(keep) / "artifacts", copy_function=shutil.copy2)
        shutil.copy2(clone / "dvc.lock", Path(keep) / "dvc.lock")
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--stages", nargs="*", default=list(load_stage_specs(ROOT)))
    ap.add_argument("--compare-workers", nargs="*", type=int, default=[])
    ap.add_argument("--keep", help="artifacts folder to keep (default: a temporary one, removed); with --fresh-clone, "
                    "a folder that gets the clone's artifacts/ and dvc.lock")
    ap.add_argument("--start-from", help="an artifacts folder whose stages are copied in first (then run only "
                    "--stages): e.g. a prepared base/profile/bucket for --compare-workers")
    ap.add_argument("--fresh-clone", action="store_true", help="time the README's `make study` in a fresh clone "
                    "of HEAD, install included (of the other options, only --keep applies)")
    args = ap.parse_args()
    if args.fresh_clone:
        fresh_clone_study(args.keep)
        return
    params = yaml.safe_load(Path(args.params).read_text()) or {}
    for item in args.set:
        key, _, value = item.partition("=")
        set_key(params, key, value)
    work = Path(tempfile.mkdtemp(prefix="rollscale-study-bench."))
    artifacts = Path(args.keep) if args.keep else work / "artifacts"
    shutil.rmtree(artifacts, ignore_errors=True)  # a clean artifacts folder: nothing reused
    if args.start_from:
        shutil.copytree(args.start_from, artifacts, copy_function=shutil.copy2)
    params_file = work / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    load0 = os.getloadavg()[0]
    rows = [(stage, run_stage(stage, params_file, artifacts)) for stage in args.stages]
    for stage, seconds in rows:
        print(f"  {stage}: {seconds:.1f} s", file=sys.stderr)
    speed = []
    for workers in args.compare_workers:
        variant = dict(params, workers=workers)
        vfile = work / f"params-w{workers}.yaml"
        vfile.write_text(yaml.safe_dump(variant))
        shutil.rmtree(artifacts / "sweep", ignore_errors=True)
        speed.append((workers, run_stage("sweep", vfile, artifacts)))
    load1 = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores; load average {load0:.1f} at the start, {load1:.1f} at the end; "
          f"workers {params.get('workers', 'default')}, torch_threads {params.get('torch_threads', 'default')}")
    print("\n| stage | wall seconds |\n| --- | ---: |")
    for stage, seconds in rows:
        print(f"| {stage} | {seconds:.1f} |")
    print(f"| **all** | **{sum(s for _, s in rows):.1f}** |")
    if speed:
        base = speed[0][1]
        print("\n| sweep workers | wall seconds | speed-up |\n| ---: | ---: | ---: |")
        for workers, seconds in speed:
            print(f"| {workers} | {seconds:.1f} | {base / seconds:.2f}x |")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
