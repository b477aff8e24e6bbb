"""Fixtures of the checkpoint tests."""

import pytest

from tests.support.checkpoints import trained_llama


@pytest.fixture
def trained():
    """A tiny Llama, its AdamW and schedule after two training steps."""
    return trained_llama()
