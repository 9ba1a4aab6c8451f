"""The whole study through `dvc repro` on a small config, as a user runs it on a fresh clone."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from rollscale.pipeline.stages.specs import RUN_INFO, stage_running
from tests.test_pipeline import SMALL
from tests.test_study import HOLD

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
STAGES = ("base", "profile", "bucket", "measure", "sweep", "fit", "report")

STUDY = {
    **SMALL,
    "study": {"target_budget": None},  # C* = c_max: this small study's own budget, not the default's 160,000
    "bucket": {"val_size": 2, "used": [], "mixtures": {}},
    "measure": {"bucket": "hard", "n": [4], "b_problem": 2, "steps": 1},
    "sweep": {"bucket": "hard", "design": "rollout_axis", "n": [2, 4], "b_problem": [4], "c_max": 48, "seeds": [0],
              "eval_every": 2, "eval_k": 2, "checkpoint_every": 2, "train": {"lr_base": 1e-3, "warmup_steps": 0},
              # DVC's view of the stages is what is tested here: every run to c_max (the search's rungs
              # and stops have their own tests, tests/test_search_sweep.py)
              "search": {"method": "grid"}},
}


def merged(base: dict, over: dict) -> dict:
    """``base`` with ``over`` laid on top, key by key (DVC needs every declared params section)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(base.get(key, {}), value) if isinstance(value, dict) and key != "mixtures" else value
    return out


def run(cmd, cwd, env):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)


def study_env() -> dict:
    """The environment DVC runs the stages in: this venv's python and dvc first on PATH."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def build_study(root: Path) -> tuple[Path, dict]:
    """A clean copy of the tracked tree with a small params.yaml, then `dvc repro` (the README's study)."""
    from tests.shared_builds import copy_tracked

    copy_tracked(root)
    (root / "params.yaml").write_text(yaml.safe_dump(merged(yaml.safe_load((REPO / "params.yaml").read_text()), STUDY)))
    env = study_env()
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "study"]):
        subprocess.run(cmd, cwd=root, check=True, env=env)
    r = run(["dvc", "repro"], root, traced(env, root / LOADED_MODULES))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return root, env


# where the build's processes write the project modules each one loaded (tests/test_stage_deps.py compares them
# with each stage's deps): under .dvc/tmp, which neither git nor DVC looks at
LOADED_MODULES = Path(".dvc/tmp/loaded-modules")
TRACER = """\
import atexit, json, os, sys

def _loaded():
    files = sorted({m.__file__ for m in list(sys.modules.values()) if isinstance(getattr(m, "__file__", None), str)})
    record = {"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv, "cwd": os.getcwd(), "files": files}
    with open(os.path.join(os.environ["ROLLSCALE_LOADED_MODULES"], f"{os.getpid()}.json"), "w") as f:
        json.dump(record, f)

atexit.register(_loaded)
"""


def traced(env: dict, folder: Path) -> dict:
    """``env`` in which every Python process that exits normally writes the modules it loaded into ``folder``
    (a ``sitecustomize`` first on the path: forked workers that end with ``os._exit`` write nothing)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "site").mkdir(exist_ok=True)
    (folder / "site" / "sitecustomize.py").write_text(TRACER)
    path = os.pathsep.join(p for p in (str(folder / "site"), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path, "ROLLSCALE_LOADED_MODULES": str(folder)}


@pytest.fixture(scope="module")
def clone(dvc_study):
    return dvc_study


def test_repro_writes_every_stage(clone):
    root, _ = clone
    art = root / "artifacts"
    for path in ("base/model/config.json", "profile/profile.parquet", "bucket/buckets.parquet",
                 "measure/noise_steps.parquet", "measure/noise_prompts.parquet", "fit/fits.parquet",
                 "report/index.html", "report/summary.md"):
        assert (art / path).exists(), path
    runs = pd.concat(pd.read_parquet(p) for p in (art / "sweep" / "runs").glob("*/run.parquet"))
    assert sorted(runs["run_id"]) == ["np4_nr2_uniform_s0", "np4_nr4_uniform_s0"]
    assert (runs["status"] == "finished").all() and (runs["c"] >= 48).all()
    noise = pd.read_parquet(art / "measure" / "noise_steps.parquet")
    assert {"b_simple", "rho_icc", "k_crit", "crs"} <= set(noise.columns) and len(noise) == 1


def test_second_repro_is_a_no_op(clone):
    root, env = clone
    r = run(["dvc", "repro"], root, env)
    assert r.returncode == 0 and "Running stage" not in r.stdout, r.stdout
    # `make study`'s command: DVC finds nothing stale, so no flow (and no Prefect server) starts
    r = run([sys.executable, "-m", "rollscale.pipeline.cli", "study"], root, env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "study: every stage is up to date with dvc.lock; nothing to run", r.stdout


def cli(root: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "rollscale.pipeline.cli", *args], root, env)


def test_status_and_study_ask_dvc_and_agree_with_it(clone):
    """`rollscale status` and `rollscale study` take what is stale from DVC, and what the study
    runs is recorded in dvc.lock, so `dvc repro` afterwards has nothing to do."""
    root, env = clone
    original = (root / "params.yaml").read_text()
    r = cli(root, env, "status", "--json")
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert {s["stage"]: s["state"] for s in status["stages"]} == {s: "done" for s in STAGES}
    assert {run["status"] for run in status["runs"]} == {"finished"} and len(status["runs"]) == 2
    try:
        params = yaml.safe_load(original)
        params["fit"]["bin_width"] = params["fit"].get("bin_width", 0.1) / 2
        (root / "params.yaml").write_text(yaml.safe_dump(params))
        stages = {s["stage"]: s for s in json.loads(cli(root, env, "status", "--json").stdout)["stages"]}
        assert stages["fit"]["state"] == "stale" and "param fit (params.yaml): modified" in stages["fit"]["detail"]
        assert stages["report"]["state"] == "stale" and stages["report"]["detail"] == "after fit (stale)"
        assert all(stages[s]["state"] == "done" for s in STAGES[:5])
        r = cli(root, env, "study")
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        for stage in STAGES[:5]:
            assert f"study: {stage}: up to date with dvc.lock, skipped" in r.stdout, r.stdout
        assert "study: fit: running (changed: param fit" in r.stdout
        r = run(["dvc", "status"], root, env)
        assert "up to date" in r.stdout, r.stdout
        r = run(["dvc", "repro"], root, env)
        assert r.returncode == 0 and "Running stage" not in r.stdout, r.stdout
    finally:
        (root / "params.yaml").write_text(original)


def test_outputs_ignored_by_git_and_dvc_lock_shown(clone):
    root, env = clone
    r = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, env=env)
    assert "artifacts" not in r.stdout and "dvc.lock" in r.stdout, r.stdout  # dvc.lock is to be committed


def test_changed_param_reruns_only_what_depends_on_it(clone):
    root, env = clone
    original = (root / "params.yaml").read_text()
    params = yaml.safe_load(original)
    params["profile"]["k"] = 8
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    try:
        r = run(["dvc", "status"], root, env)
        assert "profile:" in r.stdout and "base:" not in r.stdout, r.stdout
        r = run(["dvc", "repro", "--dry"], root, env)
        # a dry run cannot know profile's new output yet, so only profile shows as running
        assert "Running stage 'profile'" in r.stdout, r.stdout
        assert "Running stage 'base'" not in r.stdout and "Stage 'base' didn't change" in r.stdout, r.stdout
    finally:
        (root / "params.yaml").write_text(original)


def test_a_new_data_file_makes_the_pool_stages_stale(clone):
    root, env = clone
    extra = root / "data" / "extra.jsonl"
    extra.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    try:
        r = run(["dvc", "status"], root, env)
        assert "base:" in r.stdout and "profile:" in r.stdout and re.search(r"modified:\s+data\b", r.stdout), r.stdout
    finally:
        extra.unlink()


def test_a_new_seed_or_n_trains_only_its_runs(clone, tmp_path):
    """Growing the sweep's grid reruns sweep, fit and report, and trains only the new runs:
    the finished ones are kept as they are (their folders, their rows), not retrained."""
    root = tmp_path / "study"
    shutil.copytree(clone[0], root, symlinks=True)
    env = clone[1]
    runs = root / "artifacts" / "sweep" / "runs"
    def stamps(run_ids):  # a retrained run rewrites its files (a deterministic one, the same bytes)
        return {p.relative_to(runs): p.stat().st_mtime_ns for r in run_ids for p in (runs / r).glob("steps-*.parquet")}

    old = ("np4_nr2_uniform_s0", "np4_nr4_uniform_s0")
    before = stamps(old)
    assert before
    # the params the study was built with (tests above edit the shared clone's params.yaml)
    params = merged(yaml.safe_load((REPO / "params.yaml").read_text()), STUDY)
    params["sweep"]["seeds"] = [0, 1]
    params["sweep"]["n"] = [2, 4, 8]
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    r = run(["dvc", "repro"], root, env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    ran = set(re.findall(r"Running stage '(\w+)'", r.stdout))
    assert ran == {"sweep", "fit", "report"}, r.stdout
    assert not (root / "artifacts" / "sweep" / "archive").exists()  # nothing was moved aside
    assert stamps(old) == before
    table = pd.concat(pd.read_parquet(p) for p in runs.glob("*/run.parquet"))
    assert sorted(table["run_id"]) == sorted(f"np4_nr{n}_uniform_s{s}" for n in (2, 4, 8) for s in (0, 1))
    assert (table["status"] == "finished").all()
    for run_id in old:  # started again, found finished at its last step: nothing trained
        first, again = [json.loads(line) for line in (runs / run_id / "attempts.jsonl").read_text().splitlines()]
        assert first["resume_step"] is None and again["resume_step"] == table.set_index("run_id").loc[run_id, "steps"]


def test_a_damaged_output_is_named_stale_and_rerun(clone, tmp_path):
    """Issue 23, part 4: every stage records its outputs' checksums. An edited `runs` value (a
    persist: true output) is stale for DVC, named by `status` and by the query; a byte flipped
    with size and mtime kept (DVC trusts its cached hash then) is named too, and `rollscale study`
    runs that stage again, which restores the file; the other tables stay queryable meanwhile."""
    root = tmp_path / "study"
    shutil.copytree(clone[0], root, symlinks=True)
    env = clone[1]
    (root / "params.yaml").write_text(yaml.safe_dump(merged(yaml.safe_load((REPO / "params.yaml").read_text()), STUDY)))
    art = root / "artifacts"
    assert all((art / stage / "MANIFEST.json").is_file() for stage in STAGES)

    def states() -> dict[str, dict]:
        r = cli(root, env, "status", "--json")
        assert r.returncode == 0, r.stderr
        return {s["stage"]: s for s in json.loads(r.stdout)["stages"]}

    run_row = sorted((art / "sweep" / "runs").glob("*/run.parquet"))[0]
    original = run_row.read_bytes()
    edited = pd.read_parquet(run_row).assign(c=lambda d: d["c"] + 1)
    edited.to_parquet(run_row, index=False)
    r = run(["dvc", "status", "sweep"], root, env)
    assert re.search(r"modified:\s+artifacts/sweep", r.stdout), r.stdout
    sweep = states()["sweep"]
    assert sweep["state"] == "damaged" and f"{run_row.relative_to(root)}" in sweep["detail"], sweep
    r = cli(root, env, "sql", "select sum(c) from runs")
    assert r.returncode == 1 and str(run_row.relative_to(root)) in r.stderr, r.stderr
    r = cli(root, env, "sql", "select count(*) from buckets")
    assert r.returncode == 0, r.stderr
    run_row.write_bytes(original)
    assert states()["sweep"]["state"] == "done"

    buckets = art / "bucket" / "buckets.parquet"
    good, stat = buckets.read_bytes(), buckets.stat()
    with open(buckets, "r+b") as fh:  # in place: same inode, same size, then the old mtime
        fh.seek(len(good) // 2)
        fh.write(bytes([good[len(good) // 2] ^ 0xFF]))
    os.utime(buckets, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    bucket = states()["bucket"]
    assert bucket["state"] == "damaged" and "buckets.parquet does not match its sha256" in bucket["detail"], bucket
    r = cli(root, env, "study")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "study: bucket: running (damaged: " in r.stdout and "study: measure: up to date" in r.stdout, r.stdout
    assert buckets.read_bytes() == good
    assert {s["state"] for s in states().values()} == {"done"}


def test_study_refused_by_a_running_stage_says_so_in_one_line(clone):
    """As `rollscale run` does (tests/test_study.py), not as DVC's failure wrapped in an internal error."""
    root, env = clone
    art = root / "artifacts"
    holder = subprocess.Popen([sys.executable, "-c", HOLD.replace('"bucket"', '"sweep"'), str(art)],
                              stdout=subprocess.PIPE, text=True, env={"PYTHONPATH": str(REPO), "PATH": ""})
    try:
        assert holder.stdout.readline().strip() == "held"
        r = cli(root, env, "study", "--stages", "sweep", "--force")
    finally:
        holder.kill()
        holder.wait()
        (art / "sweep" / RUN_INFO).unlink(missing_ok=True)  # the shared study stays as it was
    assert r.returncode == 1, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"rollscale: stage 'sweep' is already running (pid {holder.pid} on "), line
    assert line.endswith("wait for it or stop that process first"), line


def test_status_knows_a_stage_run_outside_dvc_and_says_dvc_lock_is_behind(clone, tmp_path):
    """Every stage records its run (tests/test_study.py: the record itself), whichever command ran
    it; `rollscale status` reads it, so a stage run with `rollscale run` is done, not stale or
    "not run", and says what dvc.lock lacks until `dvc commit` records it."""
    root = tmp_path / "study"
    shutil.copytree(clone[0], root, symlinks=True)
    env = clone[1]
    record = json.loads((root / "artifacts" / "base" / ".stage.record.json").read_text())
    assert (record["command"], record["status"]) == ("dvc repro base", "finished")  # run by build_study

    def states():
        r = cli(root, env, "status", "--json")
        assert r.returncode == 0, r.stderr
        return {s["stage"]: s for s in json.loads(r.stdout)["stages"]}

    params = merged(yaml.safe_load((REPO / "params.yaml").read_text()), STUDY)
    params["fit"]["bin_width"] = 0.037  # a value no other test ran fit with
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    assert states()["fit"]["state"] == "stale"
    r = cli(root, env, "run", "fit")
    assert r.returncode == 0, r.stderr[-2000:]
    fit = states()["fit"]
    assert fit["state"] == "done", fit
    assert fit["detail"].startswith("ran by `rollscale run fit`, ended "), fit
    # no advice to `dvc commit`, which would record the outputs unchecked (issue 31)
    assert fit["detail"].endswith("dvc.lock records an older run: `rollscale study` reruns and records it"), fit

    lock = yaml.safe_load((root / "dvc.lock").read_text())
    del lock["stages"]["fit"]  # a stage dvc.lock has never recorded
    (root / "dvc.lock").write_text(yaml.safe_dump(lock))
    assert states()["fit"]["detail"].endswith("not recorded in dvc.lock: `rollscale study` reruns and records it")
    r = run(["dvc", "commit", "-f", "fit"], root, env)
    assert r.returncode == 0, r.stderr
    assert states()["fit"] == {"stage": "fit", "state": "done", "detail": "up to date with dvc.lock"}

    params["fit"]["bin_width"] = 0.041  # the run no longer matches params.yaml
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    fit = states()["fit"]
    assert fit["state"] == "stale" and "param fit (params.yaml): modified" in fit["detail"], fit


def study_with_a_long_sweep(clone, tmp_path: Path) -> tuple[Path, dict]:
    """A copy of the study whose sweep trains long enough for a signal to land in it (n = 2: 40 steps, a
    checkpoint every 2), and the environment of a study that starts its own Prefect server."""
    root = tmp_path / "study"
    shutil.copytree(clone[0], root, symlinks=True)
    env = {k: v for k, v in clone[1].items() if k != "PREFECT_API_URL"}
    params = merged(yaml.safe_load((REPO / "params.yaml").read_text()), STUDY)
    params["sweep"].update(c_max=160, eval_every=8)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root, env


def test_ctrl_c_stops_a_study_started_from_scratch_in_one_line_keeps_its_work_and_the_next_study_resumes(
        clone, tmp_path):
    """Ctrl-C to `rollscale study` while its sweep trains from scratch (`rm -rf artifacts/sweep`; the study's own
    Prefect server, which the stage under `dvc repro` reports to): exit 130 within 10 s with the stage's one line,
    the lock released, dvc.lock not claiming the sweep. The sweep (persist: true, DVC never removed it) keeps its
    checkpoints, and none of the earlier sweep's runs, nor its record of checksums, comes back from DVC's cache
    (issue 42, part 2, case 2). The next study resumes and records it."""
    from rollscale.pipeline.stages.status import study_status
    from tests.test_faults import check_complete_rows, committed_checkpoints, interrupt, said

    root, env = study_with_a_long_sweep(clone, tmp_path)
    sweep = root / "artifacts" / "sweep"
    runs = sweep / "runs"
    shutil.rmtree(sweep)
    first = runs / "np4_nr2_uniform_s0"  # the longest run trains first
    seen: dict[Path, bytes] = {}

    def checkpoints_committed():
        kept = committed_checkpoints(first)[:-1]  # the newest may be replaced as the run goes on
        seen.update({p / "MANIFEST.json": (p / "MANIFEST.json").read_bytes() for p in kept})
        return len(kept) >= 1

    rc, seconds, after, _ = interrupt(["study", "--stages", "sweep"], signal.SIGINT, checkpoints_committed,
                                      "two checkpoints of the new sweep", tmp_path / "study.log", env, root)
    assert rc == 130 and seconds < 10, (rc, seconds, after)
    lines = said(after)
    assert len(lines) == 1, after  # nor "put back from DVC's cache"
    [line] = lines
    assert re.fullmatch(r"sweep: interrupted \(SIGINT\); 0 of 2 runs finished, 1 resumes from its last checkpoint, "
                        r"1 starts from the beginning: rerun `rollscale study` to go on", line), after
    assert not stage_running(root / "artifacts", "sweep")
    assert "sweep:" in run(["dvc", "status", "sweep"], root, env).stdout  # not recorded as done
    # its finished steps are kept: each checkpoint seen is there unchanged, or the run has since committed two newer
    # ones (the store keeps the newest 2: the step the signal let finish can push an old one out)
    now = committed_checkpoints(first)
    for manifest, data in seen.items():
        if manifest.exists():
            assert manifest.read_bytes() == data, manifest
        else:
            assert len([c for c in now if c.name > manifest.parent.name]) >= 2, (manifest, now)
    assert not (sweep / "MANIFEST.json").exists()  # the earlier sweep's record did not come back ...
    assert not list(sweep.glob("runs/*/done.json"))  # ... nor any of its ended runs
    status = study_status(root, root / "artifacts")
    assert {s.stage: s.state for s in status.stages}["sweep"] == "interrupted"
    assert not [r for r in status.runs if r.status in ("finished", "stopped")]

    r = cli(root, clone[1], "study", "--stages", "sweep")  # the tests' Prefect server: no start-up to wait for
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    for run_dir in sorted(runs.glob("*")):
        check_complete_rows(run_dir, 160, 8)
    assert "sweep:" not in run(["dvc", "status", "sweep"], root, env).stdout


def test_a_stage_refused_under_the_study_says_why_in_one_line_and_its_outputs_are_put_back(clone, tmp_path):
    """Issue 31, parts 2 and 4: `rollscale study` from a shell whose PATH lacks the venv (it runs the stages
    with its own interpreter); a forced fit that refuses a damaged evals part ends with fit's own reason and
    exit status in one line (not "internal error ... dvc repro exit 255"), and the fit tables DVC removed
    before running it are put back from DVC's cache."""
    root = tmp_path / "study"
    shutil.copytree(clone[0], root, symlinks=True)
    env = {**clone[1], "PATH": "/usr/bin:/bin"}
    fit = root / "artifacts" / "fit"
    tables = {p.name: p.read_bytes() for p in fit.iterdir() if p.is_file() and not p.name.startswith(".")}
    assert "MANIFEST.json" in tables and len(tables) > 2
    part = sorted((root / "artifacts" / "sweep" / "runs").glob("*/evals-*.parquet"))[0]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    r = cli(root, env, "study", "--stages", "fit", "--force", "--no-check")
    assert r.returncode == 1, (r.stdout + r.stderr)[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("rollscale: stage 'fit' stopped: ") and "does not match its sha256" in last, r.stderr
    assert "internal error" not in r.stderr and "No module named" not in r.stderr, r.stderr[-3000:]
    assert "put back from DVC's cache" in r.stdout, r.stdout[-2000:]
    assert {p.name: p.read_bytes() for p in fit.iterdir() if p.is_file() and not p.name.startswith(".")} == tables


def test_an_interrupted_forced_rerun_puts_the_stage_outputs_back(clone, tmp_path):
    """Issue 31, part 4: SIGTERM to `rollscale study --stages measure --force` once DVC has removed the
    outputs of this stage without `persist`: exit 143, and the earlier outputs are back from DVC's cache
    (the study says so) instead of an empty folder under "nothing partial was kept"."""
    from tests.test_faults import interrupt

    root = tmp_path / "study"
    shutil.copytree(clone[0], root, symlinks=True)
    measure = root / "artifacts" / "measure"
    tables = {p.name: p.read_bytes() for p in measure.iterdir() if p.is_file() and not p.name.startswith(".")}
    assert "MANIFEST.json" in tables and len(tables) > 2
    rc, _, after, _ = interrupt(["study", "--stages", "measure", "--force", "--no-check"], signal.SIGTERM,
                                lambda: not (measure / "MANIFEST.json").exists(), "DVC to remove measure's outputs",
                                tmp_path / "study.log", clone[1], root)
    assert rc == 143, after[-3000:]
    assert "put back from DVC's cache" in after, after[-3000:]
    assert {p.name: p.read_bytes() for p in measure.iterdir() if p.is_file() and not p.name.startswith(".")} == tables
    assert not stage_running(root / "artifacts", "measure")
