"""Matplotlib figures saved as image files atomically (the report's and the tune's and sweep's PNG plots).

Its own module: kedro-datasets' matplotlib dataset imports ``matplotlib.pyplot``, which the catalog's other
file datasets (``datasets.atomic_file``, made at every `kedro run` start-up) do not need.
"""

from __future__ import annotations

import io

from kedro_datasets.matplotlib import MatplotlibDataset

from fastlm.datasets.atomic_file import save_file_atomically


class AtomicMatplotlibDataset(MatplotlibDataset):
    """``matplotlib.MatplotlibDataset`` (``save_args`` as for ``Figure.savefig``) whose local image files are
    written beside and renamed in: a full disk or a Ctrl-C part way leaves the previous plot, never half of
    one (a full disk is one ``StorageError`` line naming the file)."""

    def __init__(self, *, filepath: str, **kwargs) -> None:
        super().__init__(filepath=filepath, **kwargs)

    def _save_to_fs(self, full_key_path: str, plot) -> None:
        if self._protocol != "file":
            super()._save_to_fs(full_key_path=full_key_path, plot=plot)
            return
        image = io.BytesIO()
        plot.savefig(image, **self._save_args)
        save_file_atomically(full_key_path, lambda handle: handle.write(image.getvalue()), binary=True)
