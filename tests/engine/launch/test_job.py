"""engine/launch/job.py: one training job in this process (no process group): the model built from the job's
parameters, the splits read from Arrow, the run trained, and a summary that says what the run held; the number
of metric records the storage check plans for covers what the run writes; ranks started on their own
(torchrun) train only when every rank holds the same tokenized data."""

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
