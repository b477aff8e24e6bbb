"""Which rank this process is, read from the elastic agent's environment, and nothing else: the Kedro settings
ask it at start-up, so reading it must not import torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fastlm.engine.distributed.ranks import TORCHRUN_VARS, RankInfo, rank_from_env


@pytest.mark.parametrize("environ", [{}, {"RANK": "0"}, {"WORLD_SIZE": "2"}, {"LOCAL_RANK": "1"}])
def test_outside_an_elastic_agent_there_is_no_rank(environ):
    assert rank_from_env(environ) is None


def test_the_agents_variables_give_the_rank():
    info = rank_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_PORT": "29500"})
    assert info == RankInfo(rank=3, world_size=4, local_rank=1) and not info.is_main
    # one node: LOCAL_RANK optional
    assert rank_from_env({"RANK": "0", "WORLD_SIZE": "2"}) == RankInfo(0, 2, 0)
    assert rank_from_env({"RANK": "0", "WORLD_SIZE": "2"}).is_main and RankInfo().is_main


def test_the_process_environment_is_read_by_default(monkeypatch):
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    assert rank_from_env() is None
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert rank_from_env() == RankInfo(1, 2, 0)


def test_reading_the_rank_imports_no_torch():
    code = (
        "import sys; from fastlm.engine.distributed.ranks import rank_from_env; rank_from_env({}); "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"
