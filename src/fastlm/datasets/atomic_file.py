"""CSV, Parquet, JSON (strict), YAML and text files written atomically: to a sibling temporary file, fsynced,
then renamed over the target (``datasets.atomic_plot`` for the PNG plots).

A run killed while writing leaves the previous file (or none), never a cut-off one that looks whole; the
temporary file it leaves (``.name.tmp-<host>-<pid>-<hex>``) is removed by the next write once that process is
gone (another host's: once it has not changed for a day, ``atomic_folder.OTHER_HOST_STALE_S``). The writer,
``write_file_atomically``, is ``fastlm.temporary_files``'s, shared with the project's other files written
atomically. A write stopped part way by a full disk (or a denied write) is one ``StorageError`` line naming
the file, the previous one kept (:func:`save_file_atomically`); a Ctrl-C leaves the previous file too.
"""

from __future__ import annotations

import yaml
from kedro_datasets.json import JSONDataset
from kedro_datasets.pandas import CSVDataset, ParquetDataset
from kedro_datasets.text import TextDataset
from kedro_datasets.yaml import YAMLDataset

from fastlm.datasets.atomic_folder import write_failure
from fastlm.engine.observe import strict_json
from fastlm.temporary_files import write_file_atomically


def save_file_atomically(target, write, *, binary: bool = False) -> None:
    """``temporary_files.write_file_atomically``, a full disk or a denied write raised as one ``StorageError``
    line naming ``target`` and the fix (the previous file is kept: the new one is renamed in only whole)."""
    try:
        write_file_atomically(target, write, binary=binary)
    except Exception as exc:
        error = write_failure(exc, target, "; the previous file is kept")
        if error is not None:
            raise error from exc
        raise


class AtomicCSVDataset(CSVDataset):
    """``pandas.CSVDataset`` (local file, ``save_args`` as for ``DataFrame.to_csv``) saved atomically."""

    def __init__(self, filepath: str, **kwargs) -> None:
        super().__init__(filepath=filepath, **kwargs)

    def save(self, data) -> None:
        save_file_atomically(str(self._filepath), lambda handle: data.to_csv(handle, **self._save_args))


class AtomicParquetDataset(ParquetDataset):
    """``pandas.ParquetDataset`` (local file, ``save_args`` as for ``DataFrame.to_parquet``) saved atomically:
    the split's ``corpus_splits``, which the train, report and sweep pipelines read, is the previous one or
    the new one."""

    def __init__(self, *, filepath: str, **kwargs) -> None:
        super().__init__(filepath=filepath, **kwargs)

    def save(self, data) -> None:
        save_file_atomically(
            str(self._filepath), lambda handle: data.to_parquet(handle, **self._save_args), binary=True
        )


class AtomicJSONDataset(JSONDataset):
    """``json.JSONDataset`` (local file, ``save_args`` as for ``json.dump``) saved atomically, as strict JSON
    (``engine.observe.strict_json``: a non-finite figure is null and noted in ``non_finite_values``, never the
    ``NaN`` / ``Infinity`` a strict parser refuses) and loaded with those figures back as floats."""

    def __init__(self, filepath: str, **kwargs) -> None:
        super().__init__(filepath=filepath, **kwargs)

    def save(self, data) -> None:
        save_file_atomically(
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
        save_file_atomically(str(self._filepath), lambda handle: yaml.dump(data, handle, **self._save_args))


class AtomicTextDataset(TextDataset):
    """``text.TextDataset`` (local file, text as given: the report's HTML and Markdown, the sweep's verdict
    and best run file) saved atomically."""

    def __init__(self, filepath: str, **kwargs) -> None:
        super().__init__(filepath=filepath, **kwargs)

    def save(self, data: str) -> None:
        save_file_atomically(str(self._filepath), lambda handle: handle.write(data))
