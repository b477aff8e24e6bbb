"""The summary a training run writes (``train_summary``), read back only when it is one."""

from __future__ import annotations

from fastlm.datasets.atomic_file import AtomicJSONDataset
from fastlm.temporary_files import shown_path


class TrainSummaryDataset(AtomicJSONDataset):
    """``AtomicJSONDataset`` (strict JSON, written atomically) whose load refuses, in one line naming the
    file, JSON that is no training run's summary (``{}``, ``null``, a list, an object without its step count):
    the report made of it said "? steps, 0 parameters" or failed with a traceback. ``check_saved`` is the same
    check, run by ``fastlm.hooks.MissingInputsHook`` before a pipeline reading it starts (nothing has run,
    nothing written).
    """

    def load(self) -> dict:
        return self._checked()

    def check_saved(self) -> None:
        self._checked()

    def _checked(self) -> dict:
        from fastlm.reporting.summaries import check_train_summary

        return check_train_summary(AtomicJSONDataset.load(self), shown_path(str(self._filepath)))
