"""Stage ``profile``: the base model's difficulty per problem, avg@k (science §2).

Every problem of the pool gets k samples from the engine ``sampling.backend``
names (temperature and top_p from params, one seed per problem and sample),
scored 0/1 by its verifier; problems with no correct answer get more samples
up to k_extreme, to tell Extremely hard ones apart. The pool is profiled in
chunks, side by side on the machine's cores; each finished chunk is stored, so a
killed profile resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pandas as pd
from prefect import flow

from rollscale.core.seeds import derive_seed
from rollscale.pipeline.progress import Progress
from rollscale.files import write_parquet_atomic
from tasks.common import ARTIFACTS, read_model_ref, read_params, refresh_duckdb
from tasks.models import close_engines
from rollscale.pipeline.runtime.workers import local_runner, raise_first_error, run_all
from tasks.problems import problem_pool
from tasks.profile import profile_chunk


def chunk_dir(out: Path, fingerprint_parts: list[str]) -> Path:
    """Finished chunks live under a key of everything that decides their content."""
    key = hashlib.sha256("\n".join(fingerprint_parts).encode()).hexdigest()[:16]
    return out / "chunks" / key


def kept_work(artifacts: Path) -> str:
    """What an interrupted profile kept: its finished chunks, which are not profiled again."""
    n = len(list((artifacts / "profile" / "chunks").glob("*/chunk-*.parquet")))
    return f"{n} finished {'chunk is' if n == 1 else 'chunks are'} kept"


@flow(name="profile")
def profile_flow(params_path: str = "params.yaml", artifacts: str = str(ARTIFACTS)) -> pd.DataFrame:
    params = read_params(params_path)
    ref = read_model_ref(Path(artifacts))
    pool = problem_pool(params.data)
    k, k_extreme, size = params.profile.k, params.profile.k_extreme, params.profile.chunk_size
    out = Path(artifacts) / "profile"
    chunks = [pool[i : i + size] for i in range(0, len(pool), size)]
    work = chunk_dir(out, [ref.to_json(), params.sampling.model_dump_json(), str(k), str(k_extreme),
                           ",".join(p.problem_id for p in pool), str(size)])
    done = {int(p.stem.split("-")[1]) for p in work.glob("chunk-*.parquet")}
    print(f"profile: {len(pool)} problems x {k} samples in {len(chunks)} chunks ({len(done)} already done)")
    todo = [i for i in range(len(chunks)) if i not in done]
    # seeded per chunk (its index), so the table is the same whichever worker profiles it
    units = [{"ref": ref, "problems": chunks[i], "k": k, "k_extreme": k_extreme, "sampling": params.sampling,
              "seed": derive_seed(params.sampling.seed, i), "device": params.model.device} for i in todo]
    try:
        with Progress(len(pool), "profile", unit="problems", initial=sum(len(chunks[i]) for i in done)) as bar:
            def store(j: int, table: pd.DataFrame) -> None:  # each finished chunk is kept at once
                write_parquet_atomic(table, work / f"chunk-{todo[j]:05d}.parquet")
                bar.update(len(table), mean_avg=f"{table['avg_at_k'].mean():.3f}")

            _, errors = run_all(local_runner(params.workers, params.torch_threads), profile_chunk, units,
                                [f"chunk {i}" for i in todo], store)
    finally:
        close_engines()  # an in-process worker's engine; pool workers release theirs when they exit
    raise_first_error("profile (the other chunks are stored)", errors)
    profile = pd.concat([pd.read_parquet(work / f"chunk-{i:05d}.parquet") for i in range(len(chunks))], ignore_index=True)
    write_parquet_atomic(profile, out / "profile.parquet")
    for old in (p for p in (out / "chunks").iterdir() if p.is_dir() and p != work):
        shutil.rmtree(old, ignore_errors=True)  # chunks of a key no longer current are never read again
    refresh_duckdb(Path(artifacts))
    print(f"profile: mean avg@{k} = {profile['avg_at_k'].mean():.3f}; "
          f"{(profile['avg_at_k'] == 0).mean():.0%} at 0, {(profile['avg_at_k'] == 1).mean():.0%} at 1")
    cut = profile["trunc_rate"].mean()
    if cut > 0:  # truncated rollouts are masked from training (overlong filter): say how many
        print(f"profile: {cut:.1%} of rollouts reached max_new_tokens {params.sampling.max_new_tokens}"
              + ("; `rollscale check` names the max_new_tokens that would cut that" if cut > 0.05 else ""))
    return profile


if __name__ == "__main__":
    profile_flow()
