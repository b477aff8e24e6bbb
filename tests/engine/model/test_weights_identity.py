"""The content identity of weight folders: the base weights digest samples large tensors and reads little,
and a folder's identity is its files' names and content, not their metadata (the fixtures: conftest.py)."""

import io
import shutil
from pathlib import Path

import torch

from fastlm.engine.model import weights_identity


def test_the_base_digest_samples_large_tensors_and_reads_little(tmp_path, monkeypatch):
    """Tensors above the whole-tensor limit are read at a few spread blocks: a multi-GB base costs MBs."""
    import safetensors.torch

    weights = {"big": torch.arange(1 << 20, dtype=torch.float32), "small": torch.ones(8)}
    safetensors.torch.save_file(weights, str(tmp_path / "model.safetensors"))
    first = weights_identity.base_weights_digest(tmp_path)
    read = []
    real_open = Path.open

    class Counted(io.BufferedReader):
        def read(self, *size):
            read.append(len(data := super().read(*size)))
            return data

    monkeypatch.setattr(Path, "open", lambda self, *_, **__: Counted(real_open(self, "rb", buffering=0)))
    assert weights_identity.base_weights_digest(tmp_path) == first
    assert 0 < sum(read) < 64 * 1024  # of a 4 MiB file
    monkeypatch.undo()
    weights["big"][0] = -1.0  # inside the first sampled block
    safetensors.torch.save_file(weights, str(tmp_path / "model.safetensors"))
    assert weights_identity.base_weights_digest(tmp_path) != first


def test_a_folders_identity_is_its_files_names_and_content_not_their_metadata(tmp_path, base_dir):
    """``folder_identity`` (the predict parts' and the tune's and sweep's key of a model folder): a copy (new
    inodes) is the same; a file of other bytes written with its size and time put back, a safetensors tensor
    or a whole other file, is not; files outside ``suffixes`` do not count there."""
    import os

    folder = tmp_path / "model"
    shutil.copytree(base_dir, folder)
    (folder / "pytorch_model.bin").write_bytes(bytes(range(256)) * 4)
    weights = (".safetensors", ".bin")
    whole, only = weights_identity.folder_identity(folder), weights_identity.folder_identity(folder, weights)
    shutil.copytree(folder, tmp_path / "copy")
    assert (
        weights_identity.folder_identity(tmp_path / "copy"),
        weights_identity.folder_identity(tmp_path / "copy", weights),
    ) == (
        whole,
        only,
    )
    (folder / "config.json").write_text((folder / "config.json").read_text() + " ")
    assert (
        weights_identity.folder_identity(folder) != whole
        and weights_identity.folder_identity(folder, weights) == only
    )
    stat = (folder / "pytorch_model.bin").stat()
    (folder / "pytorch_model.bin").write_bytes(bytes(range(255, -1, -1)) * 4)
    os.utime(folder / "pytorch_model.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights_identity.folder_identity(folder, weights) != only
