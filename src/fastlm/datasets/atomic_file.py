"""CSV, JSON (strict) and YAML files written atomically: to a sibling temporary file, fsynced, then renamed
over the target.

A run killed while writing leaves the previous file (or none), never a cut-off one that looks whole; the
temporary file it leaves (``.name.tmp-<host>-<pid>-<hex>``) is removed by the next write once that process is
gone (another host's: once it has not changed for a day, ``atomic_folder.OTHER_HOST_STALE_S``).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from kedro_datasets.json import JSONDataset
from kedro_datasets.pandas import CSVDataset
from kedro_datasets.yaml import YAMLDataset

from fastlm.datasets.atomic_folder import remove_leftovers
from fastlm.engine.checkpoint.swap import writer_tag
from fastlm.engine.observe import strict_json


def write_file_atomically(target: str | Path, write) -> None:
    """``write(handle)`` into a sibling temporary file (text, UTF-8), fsynced, then renamed to ``target``;
    what earlier writers killed part way left beside ``target`` is removed first (``remove_leftovers``)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(target)
    temporary = target.with_name(f".{target.name}.tmp-{writer_tag()}")
    try:
        with open(temporary, "w", encoding="utf-8", newline="") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


class AtomicCSVDataset(CSVDataset):
    """``pandas.CSVDataset`` (local file, ``save_args`` as for ``DataFrame.to_csv``) saved atomically."""

    def __init__(self, filepath: str, **kwargs) -> None:
        super().__init__(filepath=filepath, **kwargs)

    def save(self, data) -> None:
        write_file_atomically(str(self._filepath), lambda handle: data.to_csv(handle, **self._save_args))


class AtomicJSONDataset(JSONDataset):
    """``json.JSONDataset`` (local file, ``save_args`` as for ``json.dump``) saved atomically, as strict JSON
    (``engine.observe.strict_json``: a non-finite figure is null and noted in ``non_finite_values``, never the
    ``NaN`` / ``Infinity`` a strict parser refuses) and loaded with those figures back as floats."""

    def __init__(self, filepath: str, **kwargs) -> None:
        super().__init__(filepath=filepath, **kwargs)

    def save(self, data) -> None:
        write_file_atomically(
            str(self._filepath), lambda handle: strict_json.dump(data, handle, **self._save_args)
        )

    def load(self):
        return strict_json.restore(JSONDataset.load(self))


class AtomicYAMLDataset(YAMLDataset):
    """``yaml.YAMLDataset`` (local file, ``save_args`` as for ``yaml.dump``) saved atomically: the tuned
    file in conf/local, which every ``kedro run`` reads at its start, is the previous one or the new one."""

    def __init__(self, filepath: str, **kwargs) -> None:
        super().__init__(filepath=filepath, **kwargs)

    def save(self, data) -> None:
        write_file_atomically(str(self._filepath), lambda handle: yaml.dump(data, handle, **self._save_args))
