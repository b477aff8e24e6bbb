"""Fixtures of the attention tests."""

import pytest

from tests.support.packed_attention import reference_outputs


@pytest.fixture(scope="module")
def reference():
    """Each sample alone (batch of one, no mask, no padding): its logits and summed loss."""
    return reference_outputs()
