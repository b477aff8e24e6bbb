"""Parameter sweeps: a YAML file naming a grid (every combination) or a list of ``train.*`` settings.

    # conf/base/sweeps/lr_batch.yml
    name: lr_batch                # the runs are lr_batch-01, lr_batch-02, ...
    max_steps: 30                 # per-run budget (train.max_steps of every run)
    max_minutes: 5                # optional time budget per run (train.max_minutes: stops at a step boundary)
    metric: final_val_loss        # the comparison table is sorted by it (lower is better)
    grid:                         # or  runs: [{train.optimizer.lr: 0.001}, ...]
      train.optimizer.lr: [0.001, 0.003]
      train.batching.micro_batch_size: [8, 16]

``folds: auto`` (data split with ``split.folds: k``) runs every parameter set once per fold (``train.fold``
0 .. k-1, varying fastest; the grid or runs may then be left out: one run per fold) and the sweep's report
adds the mean and spread of each metric over the folds (``fastlm.reporting.sweep_view.fold_spread``).

Kedro-free: the sweep pipeline reads the file, runs the plan and keeps each finished run's summary in
``<state folder>/<run name>/`` so that an interrupted sweep continues with its first unfinished run.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationInfo, field_validator, model_validator

from fastlm.engine.checkpoint.storage import storage_error
from fastlm.engine.config import TrainParams, parse_train_params
from fastlm.engine.observe import strict_json
from fastlm.errors import ConfigError
from fastlm.redaction import redact
from fastlm.runs import validate_run_name
from fastlm.temporary_files import shown_path, write_file_atomically
from fastlm.unique_keys import KeyTwice, conf_numbers, load_as_conf
from fastlm.validation import Params, parse_params

PARAM = "sweep"
FOLD_KEY = "train.fold"  # set per run by folds: auto
TOP_K_METRIC = re.compile(r"test_top([1-9][0-9]*)_accuracy")  # the runs' top-k accuracy, k = report.top_k
METRICS = (
    "final_val_loss",
    "final_train_loss",
    "test_loss",
    "test_accuracy",
    "test_top<k>_accuracy",
    "test_rouge1",
    "test_rouge2",
    "test_rougeL",
    "test_tool_call_name_accuracy",
    "test_tool_call_exact_match",
    "wall_time_s",
    "real_tokens_per_s",
)


class SweepSpec(Params):
    name: str = Field(min_length=1, max_length=60)
    max_steps: int | None = Field(None, ge=1, description="train.max_steps of every run")
    max_minutes: float | None = Field(
        None, gt=0, description="train.max_minutes of every run (a time budget)"
    )
    metric: str = "final_val_loss"
    grid: dict[str, list[Any]] | None = None
    runs: list[dict[str, Any]] | None = None
    folds: Literal["auto"] | None = Field(
        None, description="auto: every parameter set once per fold of split.folds"
    )

    @field_validator("grid", "runs")
    @classmethod
    def _makes_runs(cls, plan, info: ValidationInfo):
        problem = empty_plan(info.field_name, plan)
        if problem is not None:
            raise ValueError(f"{problem[0]} ({problem[1]})")
        return plan

    @model_validator(mode="after")
    def _one_plan(self) -> SweepSpec:
        if (
            self.grid is not None
            and self.runs is not None
            or (self.grid is None and self.runs is None and self.folds is None)
        ):
            raise ValueError(
                "give either grid (every combination) or runs (a list of settings), not both "
                "(or neither, with folds: auto: one run per fold)"
            )
        if self.metric not in METRICS and not TOP_K_METRIC.fullmatch(self.metric):
            raise ValueError(f"metric must be one of {', '.join(METRICS)} (k: report.top_k)")
        validate_run_name(self.name)
        swept = {key for overrides in self._settings() for key in overrides}
        if self.metric == "final_train_loss" and "train.loss.label_smoothing" in swept:
            raise ValueError(
                "final_train_loss is smoothed by train.loss.label_smoothing, which the runs set apart: "
                "rank them by final_val_loss or test_loss (plain)"
            )
        for key in swept:
            if key == FOLD_KEY and self.folds is not None:
                raise ValueError(
                    f"{FOLD_KEY} is set by folds: auto (one run per fold); remove it from the "
                    "grid or runs, or remove folds: auto"
                )
            budget = key.removeprefix("train.")
            if budget in ("max_steps", "max_minutes") and getattr(self, budget) is not None:
                raise ValueError(
                    f"{key} is swept and {budget} sets it for every run (it would replace the swept "
                    f"values); remove {budget} or the {key} setting"
                )
            if not key.startswith("train."):
                raise ValueError(
                    f"{key}: only train.* parameters can be swept (the tokenized data is reused; "
                    "run a split per setting for split.* parameters)"
                )
        return self

    def _settings(self) -> list[dict[str, Any]]:
        """The parameter sets of the grid or runs (one empty set when neither is given)."""
        if self.runs is not None:
            return [dict(run) for run in self.runs]
        if self.grid is None:
            return [{}]
        keys = list(self.grid)
        return [dict(zip(keys, values, strict=True)) for values in itertools.product(*self.grid.values())]

    def plan(self, folds: int | None = None) -> list[dict[str, Any]]:
        """The parameter sets in run order (a grid: the last key varies fastest; with ``folds: auto`` each
        set once per fold, the fold fastest). ``folds`` is the data's ``split.folds``; refused in one line
        when the sweep runs over folds and the data has none."""
        if self.folds is None:
            return self._settings()
        if folds is None:
            raise ConfigError(
                f"sweep {self.name} runs over folds (folds: auto) but the data was "
                "split without folds (split.folds is not set).",
                fix="run `kedro run --pipeline=split --params split.folds=<k>` first, or remove folds: auto.",
            )
        return [{**settings, FOLD_KEY: fold} for settings in self._settings() for fold in range(folds)]

    def run_names(self, folds: int | None = None) -> list[str]:
        return [f"{self.name}-{index:02d}" for index in range(1, len(self.plan(folds)) + 1)]


def empty_plan(key: str, plan) -> tuple[str, str] | None:
    """(what is wrong, what to do) when the ``grid`` or ``runs`` of a sweep would make no run (the product
    of a grid with no keys or a key without values is empty; so is an empty list of runs), else None."""
    if key == "runs" and isinstance(plan, list) and not plan:
        return "runs lists no runs", "give at least one setting such as {train.optimizer.lr: 0.001}"
    if key != "grid" or not isinstance(plan, dict):
        return None
    if not plan:
        return "the grid has no keys, so it makes no runs", "name at least one train.* key with its values"
    empty = [name for name, values in plan.items() if isinstance(values, list) and not values]
    if empty:
        return (
            f"grid key {empty[0]} has no values, so the grid makes no runs",
            f"give {empty[0]} at least one value, or remove the key",
        )
    return None


def load_sweep(path) -> SweepSpec:
    """The sweep file at ``path`` (the ``sweep`` parameter), validated, or one ConfigError line."""
    if not isinstance(path, str | os.PathLike) or not Path(path).is_file():
        raise ConfigError(
            f"parameter {PARAM} = {path!r} is not a sweep file.",
            fix="pass --params sweep=conf/base/sweeps/lr_batch.yml (a YAML file with name and grid or runs).",
        )
    try:
        raw = load_as_conf(Path(path).read_text(encoding="utf-8"))
    except KeyTwice as twice:
        raise ConfigError(
            f"sweep file {path} line {twice.line} has the key {twice.key!r} twice in one mapping; only the "
            "last value would be read.",
            fix=f"in {path}, keep one of the two {twice.key} keys (merge their values into it).",
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"sweep file {path} is not valid YAML ({str(exc).splitlines()[0]}).", fix="correct the file."
        ) from exc
    for key in ("grid", "runs"):  # named here with the file: the model's own check cannot name it
        problem = empty_plan(key, raw.get(key)) if isinstance(raw, dict) else None
        if problem is not None:
            raise ConfigError(f"sweep file {path}: {problem[0]}.", fix=f"in {path}, {problem[1]}.")
    return parse_params(SweepSpec, raw, prefix="", source=f"sweep file {path}", file_only=True)


def load_sweep_runs(
    path, train_params: dict, folds: int | None = None, top_k: int | None = None
) -> SweepSpec:
    """:func:`load_sweep`, with the train parameters of every run checked before the first one runs
    (``folds``: ``split.folds``, the runs of ``folds: auto``) and a top-k metric against ``top_k`` (the
    report's ``top_k``, the k the runs are scored with).

    A problem of ``train_params`` alone names conf/base/parameters_train.yml (or --params); one that a run's
    settings or the sweep's budgets bring names the sweep file, where it is fixed.
    """
    spec = load_sweep(path)
    named = TOP_K_METRIC.fullmatch(spec.metric)
    if named and top_k is not None and int(named.group(1)) != top_k:
        raise ConfigError(
            f"sweep file {path}: metric {spec.metric} names top-{named.group(1)}, but report.top_k = "
            f"{top_k}: the runs are scored as test_top{top_k}_accuracy.",
            fix=f"write metric: test_top{top_k}_accuracy in {path}, or set report.top_k to {named.group(1)}.",
        )
    parse_train_params(train_params)
    for overrides in spec.plan(folds):
        parse_params(
            TrainParams,
            run_train_params(train_params, spec, overrides),
            prefix="train",
            source=f"sweep file {path}",
            file_only=True,
        )
    return spec


def replaced_budgets(spec: SweepSpec, train_params: dict, path: str) -> list[str]:
    """One line for each budget of the train parameters (``train.max_steps``, ``train.max_minutes``: the
    conf or ``--params``) that the sweep file's own budget replaces in every run, naming both and the fix."""
    lines = []
    for budget in ("max_steps", "max_minutes"):
        asked, used = (train_params or {}).get(budget), getattr(spec, budget)
        if asked is not None and used is not None and asked != used:
            lines.append(
                f"train.{budget} {asked} (conf or --params) is not used: {budget}: {used} of the sweep file "
                f"{path} is every run's budget. Fix: write {budget}: {asked} in {path}, or remove its "
                f"{budget} line to train every run with train.{budget}"
            )
    return lines


def apply_overrides(train_params: dict, overrides: dict[str, Any], max_steps: int | None) -> dict:
    """A copy of ``train_params`` with each ``train.a.b: value`` set (and ``max_steps``, when given)."""
    params = copy.deepcopy(train_params or {})
    for key, value in overrides.items():
        *path, last = key.split(".")[1:]
        node = params
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(
                    f"sweep key {key}: train.{part} is not a group of parameters.",
                    fix="name a parameter such as train.optimizer.lr.",
                )
        node[last] = value
    if max_steps is not None:
        params["max_steps"] = max_steps
    return params


def best_run_command(path: str) -> str:
    """The command that trains the sweep's best setting from its run configuration at ``path`` (the catalog's
    ``sweep_best_run``), with the file named relative to the project folder (the working folder of a run)
    where it is inside it, so sweep.md and the file itself still name it in a moved or copied project
    (``kedro run --config`` reads such a name from the project folder, ``fastlm.cli.config_file``)."""
    file, here = Path(path).resolve(), Path.cwd().resolve()
    return f"kedro run --config {(file.relative_to(here) if file.is_relative_to(here) else file).as_posix()}"


CHECKPOINTS = "sweeps"  # <train.checkpoint_dir>/sweeps/<sweep name>/<run name>/


def best_run_config(
    spec: SweepSpec, overrides: dict[str, Any], train_params: dict, split_params: dict
) -> dict:
    """A Kedro run configuration (``kedro run --config <file>``) that trains the setting ``overrides`` (the
    sweep's best) with the sweep's budgets over the train and split parameters the sweep ran with (its
    ``--env`` and ``--params`` included: Kedro merges them over the parameters files), as ``<sweep>-best``;
    ``train.fold`` left out: the whole training split (null where the parameters the sweep ran with set one:
    a run configuration's parameters merge over the parameters files, so a key left out would keep it)."""
    setting = {key: value for key, value in overrides.items() if key != FOLD_KEY}
    train = apply_overrides(train_params, setting, spec.max_steps)
    if "fold" in train:
        train["fold"] = None
    if spec.max_minutes is not None:
        train["max_minutes"] = spec.max_minutes
    params = {"run_name": f"{spec.name}-best", "train": train, "split": copy.deepcopy(split_params or {})}
    return {"run": {"pipeline": "train", "params": params}}


def run_train_params(train_params: dict, spec: SweepSpec, overrides: dict[str, Any]) -> dict:
    """The train parameters of one run of the sweep: ``overrides`` and the sweep's budgets applied, and the
    checkpoints under ``<train.checkpoint_dir>/sweeps/<sweep name>/``. That folder holds no checkpoint itself,
    so ``train.resume: auto`` of a plain train run never takes a sweep run as "the newest interrupted run"
    (:func:`fastlm.engine.checkpoint.discovery.unfinished_runs` looks one level down), and a sweep resumes
    only its own runs."""
    params = apply_overrides(train_params, overrides, spec.max_steps)
    if spec.max_minutes is not None:
        params["max_minutes"] = spec.max_minutes
    base = Path(str(params.get("checkpoint_dir") or TrainParams().checkpoint_dir))
    params["checkpoint_dir"] = str(base / CHECKPOINTS / spec.name)
    return params


def child_run_params(params: dict, overrides: dict[str, Any]) -> dict[str, Any]:
    """A sweep run's MLflow parameters: its train parameters as a train run logs them (``train.<key>``,
    flattened; lists as they are), which name the sweep's budgets, and its swept values (a fold's too)."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        else:
            flat[prefix] = value

    walk("train", params)
    return {**flat, **overrides}


def finished_summary(folder: Path, identity: dict[str, Any]) -> dict | None:
    """The stored summary of a run that finished with exactly ``identity`` (its effective train parameters and
    the data fingerprint), else None: a changed setting or a re-split reruns it."""
    path = folder / "summary.json"
    if not path.is_file():
        return None
    try:
        stored = strict_json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict):
        return None
    recorded = stored.get("sweep_identity")
    return (
        stored
        if _comparable(recorded) == _comparable(json.loads(json.dumps(identity, default=str)))
        else None
    )


# train settings added after sweeps first kept runs, with the value that trains as a run without them did: a
# kept record without the key reads as holding that value (the project's conf gaining the key is no change)
ADDED_TRAIN_SETTINGS: dict[str, Any] = {"data_seed": None}


def _comparable(identity: Any) -> Any:
    """A sweep run's identity as compared: its train parameters less each of ``ADDED_TRAIN_SETTINGS`` at the
    value a record written before it existed means, and its settings' texts that a conf file reads as numbers
    as those numbers (a run kept when the sweep file's ``1e-3`` was read as text); any other identity as it
    is."""
    if not isinstance(identity, dict) or not isinstance(identity.get("train"), dict):
        return identity
    train = {
        key: value
        for key, value in conf_numbers(identity["train"]).items()
        if key not in ADDED_TRAIN_SETTINGS or value != ADDED_TRAIN_SETTINGS[key]
    }
    comparable = {**identity, "train": train}
    if "overrides" in identity:
        comparable["overrides"] = conf_numbers(identity["overrides"])
    return comparable


def kept_run(
    runs: SweepRuns, sweep: str, run: str, identity: dict[str, Any]
) -> tuple[dict | None, str | None]:
    """(summary, None) of run ``run`` of ``sweep`` when it finished with exactly ``identity``; else (None, why
    it is trained again) where a summary is kept with another identity, in a phrase naming what differs: a
    key its record lacks (``model weights``, a base folder's weights; ``data`` the fingerprint alone, before
    the split texts' digest) was kept by an older version, which did not compare it, so the run is not kept
    on it. (None, None): never kept."""
    done = runs.finished(sweep, run, identity)
    if done is not None:
        return done, None
    path = runs.folder(sweep, run) / "summary.json"
    if not path.is_file():
        return None, None
    try:
        stored = strict_json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stored = None
    recorded = _comparable(stored.get("sweep_identity")) if isinstance(stored, dict) else None
    if not isinstance(recorded, dict):
        return None, f"its kept summary {path} records no identity to compare"
    now = _comparable(json.loads(json.dumps(identity, default=str)))
    older = sorted(key for key in now if key not in recorded)
    changed = sorted(
        key for key in {*now, *recorded} if key not in older and recorded.get(key) != now.get(key)
    )
    said = []
    if changed:
        ordered = [key for key in dict.fromkeys([*now, *recorded]) if key in changed]  # train first
        settings = changed_settings(
            {key: recorded.get(key) for key in ordered}, {key: now.get(key) for key in ordered}
        )
        said.append(f"its {settings} differ from what it finished with")
    if older:
        said.append(f"it was kept by an older version that did not record its {', '.join(older)}")
    return None, "; ".join(said)


SHOWN_SETTINGS = 4  # settings named in the line saying why a kept run is trained again, then "and N more"
SHOWN_VALUE = 40  # characters of a value shown there (longer ones end in "...")
ABSENT = object()


def changed_settings(recorded: dict[str, Any], now: dict[str, Any]) -> str:
    """The settings that differ between a kept run's ``recorded`` identity and ``now``, by dotted name with
    both values (``train.optimizer.lr 0.0003 -> 0.0001``), in the identity's order: the first
    ``SHOWN_SETTINGS``, then how many more. A train setting of ``ADDED_TRAIN_SETTINGS`` a record lacks reads
    as the value it means; a value is masked as :func:`fastlm.redaction.redact` masks it (by its dotted
    name and its shape), then shortened, so a secret is never cut into a shape the masking misses."""
    differences: list[str] = []

    def walk(name: str, old: Any, new: Any) -> None:
        if isinstance(old, dict) and isinstance(new, dict):
            for key in [*new, *(key for key in old if key not in new)]:
                walk(f"{name}.{key}", old.get(key, ABSENT), new.get(key, ABSENT))
        elif old != new:
            differences.append(f"{name} {_shown_value(old, name)} -> {_shown_value(new, name)}")

    for key in [*now, *(key for key in recorded if key not in now)]:
        old, new = recorded.get(key), now.get(key)
        if key == "train" and isinstance(old, dict) and isinstance(new, dict):
            old, new = {**ADDED_TRAIN_SETTINGS, **old}, {**ADDED_TRAIN_SETTINGS, **new}
        walk(key, old, new)
    if not differences:  # equal once the added settings are filled in: name the sections, as compared
        return ", ".join(recorded)
    more = len(differences) - SHOWN_SETTINGS
    return ", ".join(differences[:SHOWN_SETTINGS]) + (f" and {more} more" if more > 0 else "")


def _shown_value(value: Any, name: str) -> str:
    if value is ABSENT:
        return "(none)"
    value = redact(value, name)
    text = value if isinstance(value, str) and value else json.dumps(value, default=str)
    return text if len(text) <= SHOWN_VALUE else text[: SHOWN_VALUE - 3] + "..."


def save_finished(folder: Path, summary: dict, history, eval_history) -> None:
    """Keep a finished run's summary and histories, each atomically (the summary last: it marks the run
    done). A full disk or a denied write is one ``StorageError`` line: the run is not kept."""
    text = strict_json.dumps(summary, indent=2, default=str)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, table in (("history.csv", history), ("eval_history.csv", eval_history)):
            write_file_atomically(
                folder / name, lambda handle, table=table: table.to_csv(handle, index=False)
            )
        write_file_atomically(folder / "summary.json", lambda handle: handle.write(text))
    except OSError as error:
        failure = storage_error(
            error,
            f"could not keep the finished sweep run in {shown_path(folder)}",
            parameter="sweep_runs' path in conf/base/catalog.yml",
            detail="; the run is not kept, so the next sweep trains it again",
        )
        if failure is error:
            raise
        raise failure from error


class SweepRuns:
    """Where sweeps keep their finished runs (catalog entry ``sweep_runs``: ``<root>/<sweep>/<run>/`` with the
    summary, history and evaluation history), so a rerun keeps what finished with the same identity."""

    def __init__(self, root) -> None:
        self.root = Path(root)

    def folder(self, sweep: str, run: str) -> Path:
        return self.root / sweep / run

    def finished(self, sweep: str, run: str, identity: dict[str, Any]) -> dict | None:
        """``finished_summary`` of that run: its summary when it finished with exactly ``identity``."""
        return finished_summary(self.folder(sweep, run), identity)

    def keep(self, sweep: str, run: str, summary: dict, history, eval_history) -> None:
        save_finished(self.folder(sweep, run), summary, history, eval_history)

    def forget(self, sweep: str, run: str) -> None:
        """Drop the run's kept record (its summary, which marks it finished): it is trained again, so a
        retrain stopped part way is an unfinished run the next sweep resumes, not one kept with other
        settings."""
        (self.folder(sweep, run) / "summary.json").unlink(missing_ok=True)

    def histories(self, sweep: str, run: str):
        """The kept run's training and evaluation histories (DataFrames)."""
        import pandas as pd

        folder = self.folder(sweep, run)
        return pd.read_csv(folder / "history.csv"), pd.read_csv(folder / "eval_history.csv")
