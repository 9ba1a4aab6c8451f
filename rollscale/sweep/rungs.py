"""The sweep's rungs for every search method (``sweep.search.method``, science §9.4): plan, train to the next
budget, decide, repeat. The one place that drives a sweep's runs (``flows/sweep.py`` calls it); its decisions
are the method's pure functions of the runs' tables (:mod:`rollscale.core.search`), written as the ``search``
table.

:class:`SweepSearch` plans the runs of the method: a method that does not search (``grid``) trains every run
to C_max at once; one that does (``decision``, science §9.4) trains the groups of
:func:`rollscale.sweep.groups.search_plan` in rungs of budget. ``start()`` gives
the runs of every group's next rung (and the runs alone in their group, to
C_max); ``finished(run)`` is called as each run comes back and, once every
run of that group's rung is in, refits the group's curves
(:func:`rollscale.core.search.decisions.decide`, the method's rules), writes the decisions
(``sweep/search.parquet``, the ``search`` table) before any run trains on,
marks the runs of stopped keys as ended ("stopped", with their rung and
rule), and gives the runs of the group's next rung. A rung is a barrier for
one group's runs only. The decisions are read back on a rerun (while the
settings and groups are the same, ``search.json``), so a killed sweep
resumes to the same decisions.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from rollscale.config import StudyParams
from rollscale.core.rollouts import SamplingConfig
from rollscale.core.search.decisions import decide, search_method
from rollscale.core.search.state import (
    GroupState,
    SearchGroup,
    SearchSettings,
    empty_decisions,
    group_state,
    plan,
    rung_budgets,
)
from rollscale.files import write_json_atomic, write_parquet_atomic
from rollscale.train.checkpoint import RunStore
from rollscale.train.run_config import RunConfig, RunResult, config_hash, run_row
from rollscale.sweep.groups import SearchPlan, search_plan, search_settings
from rollscale.sweep.grid import GridPoint, point_config, run_configs

SEARCH_TABLE = "search.parquet"  # under artifacts/sweep (rollscale.tables.TABLES["search"])
SEARCH_IDENTITY = "search.json"

# a unit of the pool: the run's config and the budget it trains to (None: C_max)
Unit = tuple[RunConfig, float | None]


def search_identity(search: SearchPlan, settings: SearchSettings) -> dict[str, Any]:
    """What the stored decisions are valid for: the settings and the groups (keys, seeds, C_max, limits)."""
    groups = [{f.name: getattr(g, f.name) for f in dataclasses.fields(g) if f.init} for g in search.groups]
    return json.loads(json.dumps({"settings": settings.identity(), "groups": groups}, default=list))


def _archive(path: Path, why: str) -> None:
    stamp = time.strftime('%Y%m%d-%H%M%S')
    dest = path.parent / "archive" / f"{path.stem}-{stamp}{path.suffix}"
    for i in range(2, 1000):  # two archives in one second keep both
        if not dest.exists():
            break
        dest = dest.with_name(f"{path.stem}-{stamp}-{i}{path.suffix}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    print(f"sweep: archiving {path.name} ({why}) to {dest}")
    shutil.move(str(path), dest)


def load_decisions(sweep_dir: Path, identity: dict[str, Any], archive: bool = True) -> pd.DataFrame:
    """The decisions of an earlier sweep with the same settings and groups; other decisions are archived
    (the runs keep their progress: the run store resumes them), or with ``archive=False`` only not read
    (a sweep moves nothing before it has checked its input)."""
    table, ident = sweep_dir / SEARCH_TABLE, sweep_dir / SEARCH_IDENTITY
    if not table.exists():
        return empty_decisions()
    stored = pd.read_parquet(table)
    same = ident.exists() and json.loads(ident.read_text()) == identity
    if same or stored.empty:
        return stored if same else empty_decisions()
    if archive:
        _archive(table, "the search's settings or groups changed")
    return empty_decisions()


def save_decisions(sweep_dir: Path, decisions: pd.DataFrame, identity: dict[str, Any]) -> None:
    """Write the ``search`` table, then what it is valid for (a crash between them reads as changed: the
    decisions are made again, from the same runs, to the same rows)."""
    write_json_atomic({}, sweep_dir / SEARCH_IDENTITY)
    write_parquet_atomic(decisions, sweep_dir / SEARCH_TABLE)
    write_json_atomic(identity, sweep_dir / SEARCH_IDENTITY)


def no_search(sweep_dir: Path, damage: str | None = None) -> None:
    """A grid sweep: an empty ``search`` table (earlier decisions archived: a grid trains every run on; a
    ``damage``d table archived unread)."""
    table = sweep_dir / SEARCH_TABLE
    if table.exists() and damage:
        _archive(table, "damaged: a grid makes no decisions, so nothing is rebuilt")
    elif table.exists() and not pd.read_parquet(table).empty:
        _archive(table, "sweep.search.method is grid")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(empty_decisions(), table)
    (sweep_dir / SEARCH_IDENTITY).unlink(missing_ok=True)


def decision_line(group: SearchGroup, rows: pd.DataFrame) -> str:
    """One decision in words: ``n:...: rung 2 (C = 5,000): stop 16 (rule b); continue 4, 8; add 2``."""
    parts = []
    for action in ("stop", "continue", "finish", "add", "seed", "resume"):
        mine = rows[rows["action"] == action]
        if mine.empty:
            continue
        keys = []
        for key, r in mine.groupby("key", sort=False):
            rule = r["rule"].iloc[0]
            keys.append(f"{key}" + (f" (rule {rule})" if action == "stop" else ""))
        parts.append(f"{action} {', '.join(keys)}")
    r0 = rows.iloc[0]
    return f"search: {group.group}: rung {r0['rung']} (C = {r0['c']:,.0f}): " + "; ".join(parts)


def mark_stopped(run_dir: Path, config: RunConfig, bucket: str, rung: int, rule: str) -> None:
    """End a run the search stopped: ``done.json`` "stopped" and its ``runs`` row (a finished run with a
    shorter C, the rung and rule that stopped it); a run that reached C_max already keeps "finished"."""
    store = RunStore(run_dir)
    done = store.done()
    if done is not None and done.get("status") == "finished":
        return  # (a run stopped before is marked again: decisions made anew had it paused in between)
    ckpt = store.latest()
    state = ckpt.state if ckpt is not None else {}
    result = RunResult(config.run_id, "stopped", None, int(state.get("step", 0)), int(state.get("c", 0)),
                       int(state.get("c_tokens", 0)))
    store.mark_done("stopped", steps=result.steps, c=result.c, c_tokens=result.c_tokens, run_id=config.run_id,
                    stop_rung=rung, stop_rule=rule)
    write_parquet_atomic(run_row(config, bucket, "stopped", result, stop={"rung": rung, "rule": rule}),
                         run_dir / "run.parquet")


class SweepSearch:
    """The rungs of one sweep (module docstring): ``params``' sweep section, its runs under ``sweep_dir``/runs,
    sampled with ``sampling`` (``params.sampling`` as the runs take it). Building it reads the decisions of an
    earlier sweep with the same settings and moves nothing."""

    def __init__(self, params: StudyParams, sweep_dir: Path, sampling: SamplingConfig,
                 damage: str | None = None) -> None:
        """``damage``: what is wrong with the stored ``search`` table (the stage's check of it against its record,
        :func:`rollscale.pipeline.stages.outputs.search_table_damage`), None when it is whole or absent."""
        sweep = params.sweep
        self.sweep, self.sweep_dir, self.bucket = sweep, sweep_dir, sweep.bucket
        self.sampling = sampling
        self.grid = {c.run_id: c for c in run_configs(sweep, self.sampling)}
        self.method = search_method(sweep.search.method)
        self.searching = self.method.searches  # every method that searches runs in this one loop
        self.pending: dict[str, tuple[SearchGroup, Any]] = {}  # run id -> (group, key) of a rung still training
        self.settings = search_settings(sweep, params.study, params.bucket.val_size)
        self.damage = damage  # a damaged table is never read again: begin() replaces it
        if not self.searching:  # a grid: every run alone, trained to C_max
            self.search = SearchPlan(None, [], {}, [], tuple(sweep.rules))
            self.identity, self.decisions, self.alone = {}, empty_decisions(), list(self.grid.values())
            return
        self.search = search_plan(sweep)
        self.alone = [self._config(p) for p in self.search.alone]
        self.identity = search_identity(self.search, self.settings)
        self.rebuilt = False  # the decisions were made again from the runs' records (saved by begin())
        if damage:
            # (after a sweep that did not finish, its own table differs from that record too: made again alike)
            print(f"sweep: the search table is not the one the last finished sweep recorded ({damage}): its "
                  "decisions are made again from the runs' evaluations")
            self.decisions = empty_decisions()
        else:
            self.decisions = load_decisions(sweep_dir, self.identity, archive=False)  # archived by begin()
        if damage or not (sweep_dir / SEARCH_TABLE).exists():
            self._replay()

    def config_of(self, group: str, key: Any, seed: int) -> RunConfig:
        """The config of ``key``'s run with ``seed`` in ``group`` (a key or seed the grid lacks too)."""
        return self._config(self.search.point(group, key, seed))

    def run_dir(self, config: RunConfig) -> Path:
        return self.sweep_dir / "runs" / config.run_id

    def configs(self) -> list[RunConfig]:
        """Every run in play: those the decisions so far have put in play (the grid's and those added), and
        the grid points the search does not search (each once)."""
        out = {c.run_id: c for *_, c in self._in_play(self.search.groups)}
        return list({**out, **{c.run_id: c for c in self.alone}}.values())

    def begin(self) -> None:
        """Archive decisions made under other settings or groups, or any for a grid (after the sweep checked
        its input), and say how the runs will advance."""
        if not self.searching:
            no_search(self.sweep_dir, self.damage)
            return
        if not self.damage:
            load_decisions(self.sweep_dir, self.identity)
        if self.rebuilt or self.damage:  # the rebuilt decisions (none yet: the search starts over) replace it
            save_decisions(self.sweep_dir, self.decisions, self.identity)
        s = self.sweep.search
        if self.search.groups:
            rungs = rung_budgets(self.sweep.c_max, s.eta, s.first_rung)
            print(f"sweep: {self.method.words} over {self.search.design} in {len(self.search.groups)} group(s), rungs at C = "
                  f"{', '.join(f'{c:,}' for c in rungs)} (eta {s.eta}, alpha {s.alpha})")
        else:
            print(f"sweep: {self.method.words}: no two keys to choose between in this grid; every run trains to C_max")

    def start(self, damaged: set[str]) -> list[Unit]:
        """The first runs to train, the longest (most steps: more evaluations and per-step work) first, so the
        pool's last round is short runs, not one long run beside an idle worker: every group's next rung, the
        runs alone in their group to C_max, and the damaged runs (:meth:`repair`) neither gives."""
        first = [u for g in self.search.groups for u in self._advance(g, decide_now=False)]
        first += [(c, None) for c in self.alone]
        first += self.repair(damaged - {c.run_id for c, _ in first})
        return sorted(first, key=lambda u: -u[0].nominal_steps)

    def repair(self, damaged: set[str]) -> list[Unit]:
        """The runs in ``damaged`` (ended runs whose stored results failed their checks, the done marker
        removed) that the rungs did not give: each trained again to where the search had it, its key's
        stop budget (marked stopped again when it comes back) or C_max."""
        units = []
        for g, st, key, _, config in self._in_play(self.search.groups):
            if config.run_id in damaged and config.run_id not in self.pending:
                self.pending[config.run_id] = (g, key)
                units.append((config, st.stopped.get(key)))
        return units

    def finished(self, config: RunConfig, result: RunResult) -> list[Unit]:
        """A run came back: the runs of its group's next rung once the group's rung is complete."""
        entry = self.pending.pop(config.run_id, None)
        if entry is None:  # a run outside the search (alone in its group): trained to C_max
            return []
        g, key = entry
        if key in group_state(g, self.decisions, self.settings).stopped:  # a seed added to a stopped key
            self._mark(g, key, [config.seed])                               # ends where the key stopped
        if any(other is g for other, _ in self.pending.values()):
            return []
        return self._advance(g, decide_now=True)

    def _advance(self, g: SearchGroup, decide_now: bool) -> list[Unit]:
        while True:
            todo = plan([g], self.decisions, self.settings)
            if todo.empty:
                return []
            if not decide_now:
                runs = [(r.key, self.config_of(g.group, r.key, int(r.seed)), float(r.c)) for r in todo.itertuples()]
                runs = [(key, c, b) for key, c, b in runs if not self._at_c_max(c)]
                if runs:
                    self.pending.update({c.run_id: (g, key) for key, c, _ in runs})
                    return [(c, b) for _, c, b in runs]
            new = decide(self._points(g), [g], self.decisions, self.settings)
            self.decisions = pd.concat([self.decisions, new], ignore_index=True) if len(self.decisions) else new
            save_decisions(self.sweep_dir, self.decisions, self.identity)
            print(decision_line(g, new), flush=True)
            for (key, rung, rule), rows in new[new["action"] == "stop"].groupby(["key", "rung", "rule"]):
                self._mark(g, g.key_of(key), rows["seed"].astype(int).tolist(), int(rung), str(rule))
            decide_now = False

    def _replay(self) -> None:
        """The decisions made again from the runs' own records (the ``search`` table was removed or damaged):
        each group's rungs in order, as long as every run of the rung has committed evaluations to its budget.
        ``decide`` reads each run's evaluations only up to its rung's budget, so the rows are the lost ones
        (science §8, §9.4), and the runs the decisions added count as the sweep's, never as stale ones."""
        for g in self.search.groups:
            while not (todo := plan([g], self.decisions, self.settings)).empty:
                if not all(self._reached(self.config_of(g.group, r.key, int(r.seed)), float(r.c))
                           for r in todo.itertuples()):
                    break
                new = decide(self._points(g), [g], self.decisions, self.settings)
                self.decisions = pd.concat([self.decisions, new], ignore_index=True) if len(self.decisions) else new
                self.rebuilt = True

    def _reached(self, config: RunConfig, budget: float) -> bool:
        """Whether the run has trained (and been evaluated) to ``budget``: ended at C_max, or its newest
        checkpoint at or past it. A folder of another config is not this run: a study whose ``c_max`` changed
        replayed its first rungs from the earlier runs (still there until the sweep archives them), and its new
        runs then trained straight to the fifth rung."""
        store = RunStore(self.run_dir(config))
        if self._at_c_max(config):
            return True
        ckpt = store.latest()
        return ckpt is not None and ckpt.state.get("config_hash") == config_hash(config) and \
            float(ckpt.state.get("c", 0)) >= budget and (
                ckpt.state.get("last_eval_step") == ckpt.state.get("step") or store.done() is not None)

    def _mark(self, g: SearchGroup, key: Any, seeds: list[int], rung: int | None = None,
              rule: str | None = None) -> None:
        if rung is None:
            stop = self.decisions[(self.decisions["group"] == g.group) & (self.decisions["action"] == "stop")
                                  & (self.decisions["key"] == str(key))].iloc[-1]
            rung, rule = int(stop["rung"]), str(stop["rule"])
        for seed in seeds:
            config = self.config_of(g.group, key, seed)
            mark_stopped(self.run_dir(config), config, self.bucket, rung, str(rule))

    def _at_c_max(self, config: RunConfig) -> bool:
        done = RunStore(self.run_dir(config)).done()
        return done is not None and done.get("status") == "finished" and done.get("config_hash") == config_hash(config)

    def _points(self, g: SearchGroup) -> pd.DataFrame:
        """Every committed evaluation of the group's runs (``decide`` reads each only up to its budget)."""
        frames = []
        for _, _, key, seed, config in self._in_play([g]):
            evals = RunStore(self.run_dir(config)).rows("evals")
            if evals.empty:
                continue
            frames.append(pd.DataFrame({"group": g.group, "key": key, "run_id": config.run_id, "seed": seed,
                                        "c": evals["c"].astype(float), "avg_at_k": evals["avg_at_k"].astype(float),
                                        "b": float(config.n * config.b_problem)}))
        cols = ["group", "key", "run_id", "seed", "c", "avg_at_k", "b"]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)

    def _in_play(self, groups: list[SearchGroup]) -> Iterator[tuple[SearchGroup, GroupState, Any, int, RunConfig]]:
        """Every run the decisions so far have put in play in ``groups``: (group, its state, key, seed, config)."""
        for g in groups:
            st = group_state(g, self.decisions, self.settings)
            for key in st.keys:
                for seed in st.seeds[key]:
                    yield g, st, key, seed, self.config_of(g.group, key, seed)

    def _config(self, point: GridPoint) -> RunConfig:
        config = point_config(self.sweep, self.sampling, point)
        return self.grid.get(config.run_id, config)
