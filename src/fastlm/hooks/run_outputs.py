"""The run's name, resolved once before any node runs, and its outputs: their folders checked writable
before the run starts, a copy of each kept per training run."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from kedro.framework.hooks import hook_impl

from fastlm.engine.checkpoint.storage import check_writable
from fastlm.hooks.catalog import local_path, put

log = logging.getLogger(__name__)


RUN_NAME = "params:run_name"


class RunNameHook:
    """Resolve the run's name once, before any node runs, and put it in the catalog as ``params:run_name``.

    Every node and hook then reads the same name (``fastlm.runs``: ``--params run_name=...``, else the
    pipeline and a timestamp, else, for a training run with ``train.resume: auto``, the newest interrupted
    run). An unsafe name is one ConfigError line before anything is written.
    """

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        from fastlm.engine.config import TrainParams
        from fastlm.runs import resolve_run_name

        given = catalog.load(RUN_NAME) if RUN_NAME in catalog else None
        trains = "params:train" in pipeline.inputs() and any(
            "params:train" in node.inputs and "trained_model" in node.outputs for node in pipeline.nodes
        )
        train = catalog.load("params:train") if trains and "params:train" in catalog else {}
        train = train if isinstance(train, dict) else {}
        launch = (
            os.environ.get("TORCHELASTIC_RUN_ID") if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 else None
        )
        name = resolve_run_name(
            given,
            run_params.get("pipeline_names"),
            Path(str(train.get("checkpoint_dir", TrainParams().checkpoint_dir))),
            resume=str(train.get("resume", "auto")),
            trains=trains,
            launch_id=launch if launch not in (None, "", "none") else None,
        )
        put(catalog, RUN_NAME, name)
        log.info("Run name: %s", name)


class OutputFoldersWritableHook:
    """Before a run starts, refuse an output folder that cannot be written: one line, nothing has run.

    A read-only ``data/`` folder would otherwise fail after the slow steps (tokenization, training).
    Each distinct parent folder of the pipeline's file outputs gets one probe file, written and removed.
    """

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        checked: set[Path] = set()
        for name in sorted(pipeline.all_outputs()):
            path = local_path(catalog, name)
            if path is None or path.parent in checked:
                continue
            checked.add(path.parent)
            check_writable(path.parent, parameter=f"{name} (conf/base/catalog.yml)")


class RunOutputsHook:
    """Keep a copy of each output whose catalog entry has ``metadata: {keep_per_run: <folder>}`` in
    ``<folder>/<run name>/`` (a model folder as hard links where the disk allows, so no second copy of the
    weights), so an earlier run's model and report survive the next run for comparison.

    The run name is the TRAINING run's: this run's own name when it trains, else the name in the
    ``train_summary`` that a report run reads (its own name when that summary has none).
    """

    def __init__(self) -> None:
        self._catalog = None
        self._trained: str | None = None

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        self._catalog = catalog
        self._trained = catalog.load(RUN_NAME) if "train_summary" in pipeline.all_outputs() else None

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data, node) -> None:
        catalog = self._catalog
        if catalog is None or dataset_name not in catalog:
            return
        folder = (getattr(catalog[dataset_name], "metadata", None) or {}).get("keep_per_run")
        path = local_path(catalog, dataset_name)
        if not folder or path is None or not path.exists():
            return
        from fastlm.datasets.atomic_folder import write_folder_atomically

        target = Path(folder) / self._owner() / path.name
        try:
            if path.is_dir():
                write_folder_atomically(
                    target,
                    lambda tmp: shutil.copytree(path, tmp, dirs_exist_ok=True, copy_function=_link_or_copy),
                )
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
        except OSError as error:
            log.warning(
                "could not keep a copy of %s in %s (%s); the output itself is written", path, target, error
            )

    def _owner(self) -> str:
        if self._trained is None:
            try:
                summary = self._catalog.load("train_summary") if "train_summary" in self._catalog else None
            except Exception:  # noqa: BLE001 - no summary yet: this run's own name
                summary = None
            name = summary.get("run_name") if isinstance(summary, dict) else None
            self._trained = name or self._catalog.load(RUN_NAME)
        return self._trained


def _link_or_copy(source: str, target: str) -> None:
    """A hard link (no extra disk; the saved files are replaced, never rewritten in place), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
