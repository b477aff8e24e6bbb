"""engine/launch/job.py: one training job in this process (no process group): the model built from the job's
parameters, the splits read from Arrow, the run trained, and a summary that says what the run held; the number
of metric records the storage check plans for covers what the run writes; ranks started on their own
(torchrun) train only when every rank holds the same tokenized data."""

import signal

import pytest

from fastlm.engine.distributed.parallel import Collectives
from fastlm.engine.launch import job as job_module
from fastlm.engine.launch.job import TrainJob, check_same_data, expected_log_records, run_job, splits_identity
from tests.support import data_ranks
from tests.support.parallel_jobs import job_params, tokenized_splits


def test_one_process_job_trains_and_summarises_what_it_held(tmp_path, bpe_tokenizer, sample_texts):
    train_split, eval_split = tokenized_splits(bpe_tokenizer, sample_texts)
    params = job_params(tmp_path, accum=2, nproc=1)
    job = TrainJob(params, 48, train_split, eval_split, bpe_tokenizer, str(tmp_path / "model"), {"note": "x"})
    result = run_job(job)
    summary = result.summary
    assert summary["train_samples"] == len(train_split) == 360
    assert summary["train_tokens"] == sum(len(row) for row in train_split["input_ids"])
    assert (summary["micro_batch_size"], summary["gradient_accumulation_steps"]) == (2, 2)
    assert summary["distributed_strategy"] == "none" and summary["dataloader_workers"] == 0
    assert summary["note"] == "x" and summary["attention"]
    assert [row["step"] for row in result.history] == [1, 2, 3, 4]
    assert [row["step"] for row in result.eval_history] == [2, 4]
    assert len(result.history) + len(result.eval_history) <= expected_log_records(params)
    assert result.model.config.vocab_size == len(bpe_tokenizer)


def test_the_planned_records_follow_the_logging_and_evaluation_intervals(tmp_path):
    params = job_params(tmp_path, accum=1, nproc=1, max_steps=100, log_every=10, eval_every=25)
    assert expected_log_records(params) == 100 // 10 + 2 + 100 // 25 + 1
    assert expected_log_records(job_params(tmp_path, accum=1, nproc=1, max_steps=None)) is None


@pytest.fixture(scope="module")
def ranks_on_their_data(tmp_path_factory, bpe_tokenizer, sample_texts):
    """Two gloo ranks running one short job as torchrun ranks do, each on the splits it holds: first rank 1
    on a train split of the same rows in another order (same row count and sizes: only the tokens differ),
    then both on the same splits (tests/support/data_ranks)."""
    folder = tmp_path_factory.mktemp("data_ranks")
    train, validation = tokenized_splits(bpe_tokenizer, sample_texts)
    reordered = train.select(list(range(1, len(train))) + [0])
    params = job_params(folder, accum=1, nproc=2, max_steps=1, eval_every=None, save_every=None)
    cases = {"other": [(train, validation), (reordered, validation)], "same": [(train, validation)] * 2}
    return data_ranks.run(folder, params, bpe_tokenizer, cases)


def test_ranks_holding_other_tokenized_data_each_refuse_with_one_line_naming_them(ranks_on_their_data):
    seen = [rank["other"] for rank in ranks_on_their_data]
    assert [case.get("exit_code") for case in seen] == [2, 2]  # every rank refuses, none trains
    line = seen[0]["error"]
    assert line == seen[1]["error"] and "\n" not in line
    assert "rank 1" in line and "rank 0" in line and "05_model_input" in line and "split" in line


def test_ranks_holding_the_same_tokenized_data_train(ranks_on_their_data):
    assert [rank["same"] for rank in ranks_on_their_data] == [{"steps": 1}, {"steps": None}]


class _Echo(Collectives):
    """Two ranks holding what this one holds: what it gathers, twice."""

    world_size = 2

    def __init__(self) -> None:
        self.gathered: list = []

    def gather_host(self, value: object) -> list:
        self.gathered.append(value)
        return [value, value]


def test_launched_workers_compare_the_launchers_record_and_read_no_split_again(
    tmp_path, bpe_tokenizer, sample_texts, monkeypatch
):
    train, validation = tokenized_splits(bpe_tokenizer, sample_texts)
    params = job_params(tmp_path, accum=1, nproc=2)
    job = TrainJob(params, 48, train, validation, bpe_tokenizer, str(tmp_path / "m"))
    job.data_identity = splits_identity(job)  # the launcher's record, which read_job checked in the worker
    monkeypatch.setattr(job_module, "split_identity", lambda split: pytest.fail("a split read again"))
    comm = _Echo()
    check_same_data(job, comm)
    assert comm.gathered == [
        {name: {"rows": i["rows"], "sha256": i["sha256"]} for name, i in job.data_identity.items()}
    ]


def test_a_torchrun_rank_whose_peer_process_was_killed_ends_in_one_line_saying_so(
    tmp_path, bpe_tokenizer, sample_texts
):
    """Rank 1's process killed outright while training (the out-of-memory killer, kill -9): rank 0 fails in
    its next collective on gloo's words ("Connection reset by peer", "Connection closed by peer"). That is
    one user-facing line naming the lost peer, why it may have ended and how to continue, raised from gloo's
    error; the rank then ignores the SIGTERM torchrun's agent sends it on seeing the dead rank, so that it
    ends with that line (its MLflow run FAILED) rather than by the signal, silently. Was: gloo's
    RuntimeError, a traceback of some 280 lines."""
    from fastlm.engine.distributed.parallel import lost_peer
    from tests.support import peer_ranks

    splits = tokenized_splits(bpe_tokenizer, sample_texts)
    params = job_params(tmp_path, accum=1, nproc=2, max_steps=8, eval_every=None, save_every=2, resume="auto")
    seen = peer_ranks.run(tmp_path, params, bpe_tokenizer, splits)
    assert seen["exit_codes"] == [0, -9], seen
    assert seen["type"] == "PeerLostError" and seen["exit_code"] == 2, seen
    line = seen["error"]
    assert "\n" not in line and line.startswith("rank 0 of 2 lost its peer rank 1: "), line
    assert "the other process ended (killed?)" in line and "dmesg" in line, line
    # killed at its third step: the last checkpoint rank 0 saved is step 2's
    last = tmp_path / "checkpoints-2" / "checkpoint-00000002"
    assert line.endswith(f"train.resume: auto continues from the last checkpoint ({last})."), line
    assert lost_peer(RuntimeError(seen["cause"])), seen["cause"]  # raised from gloo's own error
    assert seen["sigterm"] == str(signal.Handlers.SIG_IGN), seen


def _raising(error: BaseException):
    def run_job(*args, **kwargs):
        raise error

    return run_job


def test_only_a_lost_peer_of_several_ranks_is_a_lost_peer_error(tmp_path, monkeypatch):
    """Any other error of a torchrun rank, and one of a single process, is left as it was raised; a stop
    signal (or Ctrl-C) that reached the rank while it unwound a lost peer's error is that lost peer: the
    agent's SIGTERM, sent on seeing the killed rank, in the moment before the rank ignores it."""
    from fastlm.engine.distributed.ranks import RankInfo
    from fastlm.engine.launch.job import PeerLostError, TrainJob, run_torchrun_rank
    from fastlm.errors import FastlmError

    job = TrainJob(job_params(tmp_path, accum=1, nproc=2), 48, None, None, None, str(tmp_path / "model"))
    lost = RuntimeError(
        "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:5: Connection reset by peer."
    )

    def stopped_while_unwinding(*args, **kwargs):
        try:
            raise lost
        except RuntimeError:
            raise KeyboardInterrupt from None

    before = signal.getsignal(signal.SIGTERM)
    try:
        for run_job, rank, expected in (
            (_raising(ValueError("a bad value")), RankInfo(0, 2, 0), ValueError),
            (_raising(lost), RankInfo(0, 1, 0), RuntimeError),
            (_raising(lost), RankInfo(1, 3, 1), PeerLostError),
            (stopped_while_unwinding, RankInfo(0, 2, 0), PeerLostError),
        ):
            monkeypatch.setattr(job_module, "run_job", run_job)
            with pytest.raises(expected) as caught:
                run_torchrun_rank(job, rank)
            if expected is PeerLostError:
                assert isinstance(caught.value, FastlmError) and caught.value.__cause__ is lost
                assert str(caught.value).startswith(f"rank {rank.rank} of {rank.world_size} lost "), (
                    caught.value
                )
    finally:
        signal.signal(signal.SIGTERM, before)


def test_more_ranks_on_a_machine_than_it_has_cores_each_refuse_in_one_line(
    tmp_path, bpe_tokenizer, sample_texts, monkeypatch
):
    """Round thirty-two: torchrun's ``--nproc-per-node=4`` on a 2-core CPU (only ``nproc_per_node``'s own
    launcher counted the cores): the ranks shared cores, each step waiting for the slowest. Two gloo ranks
    on a machine of one usable core here (the ranks are forked: the patched mask is theirs); every rank
    refuses with the same line naming the host, the counts and the fix, before anything is written."""
    monkeypatch.setattr(job_module, "cpu_affinity", lambda: {0})
    monkeypatch.setattr(job_module, "cpu_quota", lambda: None)
    splits = tokenized_splits(bpe_tokenizer, sample_texts)
    params = job_params(tmp_path, accum=1, nproc=2, max_steps=1, eval_every=None, save_every=None)
    ranks = data_ranks.run(tmp_path, params, bpe_tokenizer, {"crowded": [splits] * 2})
    seen = [rank["crowded"] for rank in ranks]
    assert [case.get("exit_code") for case in seen] == [2, 2]
    line = seen[0]["error"]
    assert line == seen[1]["error"] and "\n" not in line
    assert "2 processes of this CPU run are on host" in line and "1 usable CPU cores" in line
    assert "torchrun --nproc-per-node=1" in line and "Fix:" in line
    assert not (tmp_path / "checkpoints-2").exists() and not (tmp_path / "crowded").exists()


class _Ranks(Collectives):
    """A run's ranks as one of them sees them: ``records`` is what each rank gathers (host, mask, quota)."""

    def __init__(self, records: list[dict]) -> None:
        self.records, self.world_size = records, len(records)

    def gather_host(self, value: object) -> list:
        return self.records


def test_ranks_on_cores_of_their_own_or_on_other_machines_are_let_through():
    """Ranks pinned to cores of their own (one each), and the ranks of two 2-core nodes (torchrun on each
    node), are not crowded; a GPU run is not counted by its cores. A crowded node refuses on every rank,
    also where another node is not crowded (every rank judges every host: none goes on alone)."""
    from fastlm.engine.launch.job import refuse_more_ranks_than_cores
    from fastlm.errors import ConfigError

    def rank(host: str, cpus: list[int], quota: int | None = None) -> dict:
        return {"host": host, "cpus": cpus, "quota": quota}

    refuse_more_ranks_than_cores(_Ranks([rank("a", [0]), rank("a", [1])]), "cpu")
    refuse_more_ranks_than_cores(_Ranks([rank("a", [0, 1])] * 2 + [rank("b", [0, 1])] * 2), "cpu")
    refuse_more_ranks_than_cores(_Ranks([rank("a", [0])] * 4), "cuda")
    with pytest.raises(ConfigError, match="4 processes of this CPU run are on host b, which has 2 usable"):
        refuse_more_ranks_than_cores(_Ranks([rank("a", [0, 1])] * 2 + [rank("b", [0, 1])] * 4), "cpu")
    with pytest.raises(ConfigError, match="which has 1 usable CPU cores"):  # a container's quota
        refuse_more_ranks_than_cores(_Ranks([rank("a", [0, 1, 2, 3], quota=1)] * 2), "cpu")
