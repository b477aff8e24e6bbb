"""engine/launch/job.py: one training job in this process (no process group): the model built from the job's
parameters, the splits read from Arrow, the run trained, and a summary that says what the run held; the number
of metric records the storage check plans for covers what the run writes."""

from fastlm.engine.launch.job import TrainJob, expected_log_records, run_job
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
