"""Project pipelines."""

from __future__ import annotations

from kedro.framework.project import find_pipelines
from kedro.pipeline import Pipeline


def register_pipelines() -> dict[str, Pipeline]:
    """Every pipeline under ``fastlm.pipelines``; ``__default__`` is the main job: split -> train -> report.

    ``tune`` only runs when asked for (it measures and rewrites conf/local/parameters_tuned.yml).
    """
    pipelines = find_pipelines(raise_errors=True)
    main_job = [pipelines[name] for name in ("split", "train", "report") if name in pipelines]
    pipelines["__default__"] = sum(main_job, Pipeline([]))
    return pipelines
