"""The disk pre-check stays cautious (never below what a run writes) but within 3x of it."""

from pathlib import Path

from fastlm.engine.checkpoint.storage import check_training_storage
from fastlm.engine.config import parse_train_params
from fastlm.engine.launch.job import TrainJob, run_job
from fastlm.engine.model.build import build_model


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_estimate_covers_what_a_small_run_writes_within_3x(tmp_path, bpe_tokenizer):
    ids = bpe_tokenizer(["배송이 빠르고 좋아요 정말 만족합니다"] * 60)["input_ids"]
    import datasets

    split = datasets.Dataset.from_dict({"input_ids": ids})
    raw = {
        "max_steps": 6,
        "log_every": 1,
        "eval_every": None,
        "save_every": 2,
        "keep_last": 2,
        "quiet": True,
        "resume": "never",
        "checkpoint_dir": str(tmp_path / "checkpoints"),
        "batching": {"micro_batch_size": 4},
        "model": {"hidden_size": 32, "intermediate_size": 64},
        "runtime": {"device": "cpu", "num_threads": 1},
    }
    params = parse_train_params(raw)
    result = run_job(TrainJob(params, 48, split, None, bpe_tokenizer, str(tmp_path / "model")))
    model = build_model(params.model, bpe_tokenizer, max_length=48, attn_implementation="sdpa")
    estimate = check_training_storage(
        model,
        checkpoint_dir=tmp_path / "fresh",
        model_dir=tmp_path / "m2",
        keep_last=2,
        saves_checkpoints=True,
        tokenizer=bpe_tokenizer,
        log_records=6,
    )
    written = tmp_path / "checkpoints" / "checkpoint-00000006"
    result.model.save_pretrained(tmp_path / "model")
    bpe_tokenizer.save_pretrained(tmp_path / "model")
    one_checkpoint, final_model = _bytes(written), _bytes(tmp_path / "model")
    assert one_checkpoint <= estimate.checkpoint <= 3 * one_checkpoint
    assert final_model <= estimate.final_model <= 3 * final_model
