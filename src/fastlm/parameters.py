"""The one registry of parameter groups: which ``conf/base/parameters_<group>.yml`` group is validated by
which schema. Hooks validate every group a run reads before any node runs; nodes parse their groups
through :func:`parse_group`; a test checks that each file parses to its schema's defaults.

Kedro-free. The schema modules are imported only for the groups asked for (the tune package imports torch).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParameterGroup:
    """A top-level key of the parameters files and the function that validates its value."""

    name: str
    module: str
    parser: str  # module-level function: raw value -> validated object (one ConfigError line on bad input)
    schema: str | None  # the pydantic class whose defaults the conf/base file spells out (None: not a mapping)

    @property
    def source(self) -> str:
        return f"conf/base/parameters_{self.name}.yml"

    def parse(self, raw: Any) -> Any:
        return getattr(importlib.import_module(self.module), self.parser)(raw)

    def defaults(self) -> Any:
        """The schema's defaults (what the group's conf/base file must spell out)."""
        if self.schema is None:
            raise TypeError(f"parameter group {self.name} has no schema with defaults")
        return getattr(importlib.import_module(self.module), self.schema)()


GROUPS: dict[str, ParameterGroup] = {group.name: group for group in (
    ParameterGroup("split", "fastlm.corpus.params", "parse_split_params", "SplitParams"),
    ParameterGroup("train", "fastlm.engine.config", "parse_train_params", "TrainParams"),
    ParameterGroup("report", "fastlm.reporting.params", "parse_report_params", "ReportParams"),
    ParameterGroup("tune", "fastlm.pipelines.tune.params", "parse_tune_params", "TuneParams"),
    ParameterGroup("sweep", "fastlm.sweeps", "load_sweep", None),  # a path to a sweep file
)}


def parse_group(name: str, raw: Any) -> Any:
    """``raw`` (the ``params:<name>`` value) validated by the group's schema."""
    return GROUPS[name].parse(raw)
