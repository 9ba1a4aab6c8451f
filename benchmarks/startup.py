"""Fixed start-up cost of a stage: seconds from starting ``python -m flows <stage>`` to the
first unit of work, for the ``bucket`` stage on a tiny hand-made profile (its own work is
milliseconds, so its wall time is start-up). Compared in the same run: a fresh temporary
Prefect server per stage (``dvc repro`` of one stage, ``rollscale run``) against an already
running server (``PREFECT_API_URL``, what the stages started by ``rollscale study`` reuse),
and the parts: importing the stage's modules, and starting the temporary server.

    python benchmarks/startup.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{cmd} failed:\n{r.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rollscale-startup-"))
    (root / "params.yaml").write_text(yaml.safe_dump({"bucket": {"used": [], "mixtures": {}, "val_size": 1}}))
    (root / "artifacts" / "profile").mkdir(parents=True)
    pd.DataFrame({"problem_id": [f"p{i}" for i in range(8)], "avg_at_k": [i / 8 for i in range(8)],
                  "n_correct": list(range(8)), "k": 8, "n_correct_extreme": list(range(8))}).to_parquet(
        root / "artifacts" / "profile" / "profile.parquet")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(root / "prefect-home"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    stage = [sys.executable, "-m", "flows", "bucket", "--params", str(root / "params.yaml"),
             "--artifacts", str(root / "artifacts")]
    load = os.getloadavg()[0]
    rows = {"python -c pass": [], "import the stage (flows.__main__, flows.bucket)": [],
            "whole stage, temporary Prefect server": [], "whole stage, running Prefect server": []}
    timed(stage, env)  # warm-up: the Prefect database is created once per PREFECT_HOME
    port = 4297
    server = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host",
                               "127.0.0.1", "--port", str(port)], env={**env, "PREFECT_UI_ENABLED": "false"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    served = {**env, "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
    try:
        import urllib.request

        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        for _ in range(args.repeats):
            rows["python -c pass"].append(timed([sys.executable, "-c", "pass"], env))
            rows["import the stage (flows.__main__, flows.bucket)"].append(
                timed([sys.executable, "-c", "import flows.__main__, flows.bucket"], env))
            rows["whole stage, temporary Prefect server"].append(timed(stage, env))
            rows["whole stage, running Prefect server"].append(timed(stage, served))
    finally:
        os.killpg(server.pid, 15)
        server.wait()
    print(f"load average at start {load:.1f}, at end {os.getloadavg()[0]:.1f}; {args.repeats} repeats\n")
    print("| what | median s | min s |\n| --- | --- | --- |")
    for what, times in rows.items():
        print(f"| {what} | {statistics.median(times):.1f} | {min(times):.1f} |")


if __name__ == "__main__":
    main()
