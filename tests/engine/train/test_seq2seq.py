"""Issue 19: encoder-decoder (BART, T5) folders train through the engine on prompt/response samples.

The prompt feeds the encoder, the response + EOS is the decoder target; tiny models are built from configs
and saved with ``save_pretrained`` into temporary folders (no hub).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fastlm.engine.batching import make_batching, seq2seq_batching
from fastlm.engine.config import parse_train_params
from fastlm.engine.data import PackedSeq2SeqCollator, Seq2SeqCollator
from fastlm.engine.data.schema import IGNORE_INDEX
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.model.build import build_model
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.train.loop import train
from fastlm.errors import ConfigError
from tests.support.tiny_seq2seq import SMALL_BART_LAYERS
from tests.support.tolerances import (
    MERGED_ADAPTER_ATOL,
    OTHER_FP32_KERNEL_GRAD,
    OTHER_FP32_MODEL,
    TRAINED_FP32_LOSS_REL,
)

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

VOCAB, PAD, EOS = 64, 1, 2


def _tiny(kind: str, init_std: float = 0.02):
    from transformers import BartConfig, BartForConditionalGeneration, T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    if kind == "bart":
        return BartForConditionalGeneration(
            BartConfig(
                vocab_size=VOCAB,
                **SMALL_BART_LAYERS,
                pad_token_id=PAD,
                eos_token_id=EOS,
                bos_token_id=0,
                decoder_start_token_id=EOS,
                dropout=0.0,
                init_std=init_std,
            )
        )
    return T5ForConditionalGeneration(
        T5Config(
            vocab_size=VOCAB,
            d_model=16,
            d_kv=8,
            d_ff=32,
            num_layers=1,
            num_heads=2,
            pad_token_id=PAD,
            eos_token_id=EOS,
            decoder_start_token_id=PAD,
            dropout_rate=0.0,
        )
    )


def copy_samples(n: int, seed: int) -> TokenSequences:
    """prompt = a few tokens, response = the same tokens reversed, then EOS (a task only the encoder can
    solve)."""
    rng = np.random.default_rng(seed)
    rows, prompts = [], []
    for _ in range(n):
        prompt = rng.integers(3, 12, size=int(rng.integers(3, 10))).tolist()
        rows.append(prompt + prompt[::-1] + [EOS])
        prompts.append(len(prompt))
    lengths = np.array([len(r) for r in rows])
    return TokenSequences(np.concatenate(rows), np.concatenate([[0], np.cumsum(lengths)]), np.array(prompts))


def _params(tmp_path, folder, **batching):
    return parse_train_params(
        {
            "model": {"name_or_path": str(folder)},
            "batching": {"mode": "length_grouped", "micro_batch_size": 8, **batching},
            "optimizer": {"lr": 1e-2, "warmup_steps": 2},
            "max_steps": 40,
            "log_every": 5,
            "eval_every": 40,
            "save_every": None,
            "quiet": True,
            "checkpoint_dir": str(tmp_path / "checkpoints"),
            "resume": "never",
            "runtime": {"device": "cpu", "num_threads": 1},
            "profile": {"enabled": False},
        }
    )


class _Tokenizer:  # what build_model needs of a tokenizer: its size (the folder has no tokenizer of its own)
    def __len__(self):
        return VOCAB


@pytest.mark.parametrize(("kind", "mode"), [("bart", "packed"), ("t5", "packed"), ("bart", "length_grouped")])
def test_seq2seq_folder_trains_and_reloads_with_its_encoder_trained(tmp_path, kind, mode):
    from fastlm.corpus.tokenizer_source import train_bpe_tokenizer
    from fastlm.datasets.pretrained_model import PretrainedModelDataset

    folder = tmp_path / kind
    _tiny(kind).save_pretrained(folder)
    params = _params(tmp_path, folder, mode=mode)
    model = build_model(params.model, _Tokenizer(), max_length=64, attn_implementation="sdpa")
    assert model.config.is_encoder_decoder
    before = {name: p.detach().clone() for name, p in model.named_parameters() if "encoder." in name}
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
    result = train(
        model,
        copy_samples(200, 1),
        copy_samples(24, 2),
        params=params,
        runtime=runtime,
        pad_id=PAD,
        max_length=64,
        attn="sdpa",
    )
    losses = [record["loss"] for record in result.history]
    assert losses[-1] < losses[0] - 0.5
    assert result.eval_history and np.isfinite(result.eval_history[-1]["val_loss"])
    assert result.summary["batching"] == mode  # BART and T5 pack on sdpa (issue 19: packed == alone tests)
    assert result.summary["padding_efficiency"] > (0.8 if mode == "packed" else 0.5)

    saved = tmp_path / "trained"
    result.model.save_pretrained(saved)
    # with a tokenizer, as the train node writes a model folder (the loader refuses one without)
    train_bpe_tokenizer(["a b c"] * 8, vocab_size=300, min_frequency=1, model_max_length=64).save_pretrained(
        saved
    )
    reloaded = PretrainedModelDataset(str(saved)).load()["model"]
    assert type(reloaded) is type(model)
    trained = dict(reloaded.named_parameters())
    changed = [name for name, value in before.items() if not torch.equal(trained[name], value)]
    assert len(changed) > len(before) // 2, "the encoder was not trained"
    for name in changed:
        # saved, loaded: lossless
        assert torch.equal(trained[name], dict(result.model.named_parameters())[name]), name


def test_collator_pads_encoder_and_decoder_to_their_own_maxima():
    samples = copy_samples(4, 3)
    batch = Seq2SeqCollator(pad_id=PAD, decoder_start_id=EOS, pad_to_multiple_of=None)(
        samples.__getitems__(range(4))
    )
    prompts = samples.prompt_lengths
    responses = samples.lengths - prompts
    assert batch["input_ids"].shape == (4, prompts.max())
    assert batch["decoder_input_ids"].shape == (4, responses.max() + 1)
    assert batch["attention_mask"].sum(1).tolist() == prompts.tolist()
    assert (batch["decoder_input_ids"][:, 0] == EOS).all()
    first = samples[0]
    p = int(prompts[0])
    # labels follow the causal convention (position t predicts labels[t + 1]): the response and its EOS
    assert batch["labels"][0, 1 : responses[0] + 1].tolist() == first[p:].tolist()
    assert int(batch["num_target_tokens"]) == int(responses.sum())
    assert int(batch["num_real_tokens"]) == int(samples.lengths.sum() + 4)


def test_seq2seq_needs_prompt_response_data(tmp_path):
    plain = TokenSequences(np.arange(3, 13), np.array([0, 5, 10]))
    with pytest.raises(ConfigError, match="prompt/response"):
        seq2seq_batching(_tiny("bart"), plain)


def test_packed_seq2seq_batches_pack_where_the_family_and_attention_keep_samples_apart():
    samples = copy_samples(20, 0)
    params = _params(Path("unused"), "unused", mode="packed")
    for attn, expected in (
        ("sdpa", PackedSeq2SeqCollator),
        ("eager", PackedSeq2SeqCollator),
        ("flash_attention_2", Seq2SeqCollator),
    ):
        sampler, collator = make_batching(
            params,
            samples.lengths,
            pad_id=PAD,
            max_length=64,
            seed=0,
            sides=seq2seq_batching(_tiny("bart"), samples, attn),
        )
        assert isinstance(collator, expected), attn
        sampler.set_epoch(0, start_batch=0)
        assert sorted(i for batch in sampler for i in batch) == list(range(20))
    # no attention path: the report's
    _, collator = make_batching(
        params,
        samples.lengths,
        pad_id=PAD,
        max_length=64,
        seed=0,
        sides=seq2seq_batching(_tiny("bart"), samples),
    )
    assert isinstance(collator, Seq2SeqCollator)  # per-sample evaluation keeps padded rows


def test_packed_decoder_labels_never_reach_across_samples():
    """Through the engine's own packed batching: every target is predicted from a position of its own sample
    (position t predicts labels[t + 1]), and each sample's labels are its response and EOS, nothing more."""
    samples = copy_samples(40, 4)
    params = _params(Path("unused"), "unused", mode="packed")
    sampler, collator = make_batching(
        params,
        samples.lengths,
        pad_id=PAD,
        max_length=64,
        seed=0,
        sides=seq2seq_batching(_tiny("bart"), samples, "sdpa"),
    )
    assert isinstance(collator, PackedSeq2SeqCollator)
    sampler.set_epoch(0, start_batch=0)
    shared_rows = 0
    for indices in sampler:
        batch = collator(samples.__getitems__(indices))
        labels, segments = batch["labels"], batch["decoder_segment_ids"]
        targets = labels != IGNORE_INDEX
        assert not targets[:, 0].any()
        predicted_by = segments[:, :-1][targets[:, 1:]]  # the segment of the position before each target
        assert torch.equal(predicted_by, segments[:, 1:][targets[:, 1:]])
        for k, index in enumerate(indices):
            response = samples[index][int(samples.prompt_lengths[index]) :].tolist()
            assert labels[segments == k].tolist() == [IGNORE_INDEX, *response]
        shared_rows += sum(len(set(row.tolist()) - {-1}) > 1 for row in segments)
        assert int(batch["num_target_tokens"]) == int(targets.sum())
    assert shared_rows > 0  # rows hold several samples: the check had boundaries to cross


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_a_packed_and_a_padded_run_take_the_same_steps(tmp_path, kind):
    """One micro-batch holds all the samples in both modes, so both runs take the same two steps: the same
    loss and gradient norm up to the kernels' rounding (packed rows vs one padded row each), and the loss
    falls."""
    folder = tmp_path / kind
    _tiny(kind, init_std=0.5).save_pretrained(folder)  # not near-uniform attention: a leak would show
    samples = copy_samples(8, 3)
    histories = {}
    for mode in ("packed", "length_grouped"):
        params = _params(tmp_path / mode, folder, mode=mode).model_copy(
            update={"max_steps": 2, "log_every": 1, "eval_every": None}
        )
        model = build_model(params.model, _Tokenizer(), max_length=64, attn_implementation="sdpa")
        sampler, _ = make_batching(
            params,
            samples.lengths,
            pad_id=PAD,
            max_length=64,
            seed=params.seed,
            sides=seq2seq_batching(model, samples, "sdpa"),
        )
        sampler.set_epoch(0, start_batch=0)
        assert [sorted(indices) for indices in sampler] == [list(range(8))]
        runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
        result = train(
            model, samples, None, params=params, runtime=runtime, pad_id=PAD, max_length=64, attn="sdpa"
        )
        assert result.summary["batching"] == mode
        histories[mode] = result.history
    packed, padded = histories["packed"], histories["length_grouped"]
    assert [row["step"] for row in packed] == [row["step"] for row in padded] == [1, 2]
    assert packed[0]["loss"] == pytest.approx(padded[0]["loss"], rel=OTHER_FP32_MODEL["rtol"])
    assert packed[0]["grad_norm"] == pytest.approx(padded[0]["grad_norm"], rel=OTHER_FP32_KERNEL_GRAD["rtol"])
    assert packed[1]["loss"] == pytest.approx(padded[1]["loss"], rel=TRAINED_FP32_LOSS_REL)
    assert packed[1]["loss"] < packed[0]["loss"]


def test_packed_seq2seq_batches_length_grouped_and_says_so_once(tmp_path, caplog):
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    folder = tmp_path / "pegasus"  # sinusoidal absolute positions: no packing hook checked for this family
    torch.manual_seed(0)
    PegasusForConditionalGeneration(
        PegasusConfig(
            vocab_size=VOCAB,
            **SMALL_BART_LAYERS,
            pad_token_id=PAD,
            eos_token_id=EOS,
            decoder_start_token_id=PAD,
            dropout=0.0,
        )
    ).save_pretrained(folder)
    params = _params(tmp_path, folder, mode="packed")
    samples = copy_samples(20, 0)
    model = build_model(params.model, _Tokenizer(), max_length=64, attn_implementation="sdpa")
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
    params = params.model_copy(update={"max_steps": 2, "eval_every": 2})
    with caplog.at_level("WARNING"):
        result = train(
            model,
            samples,
            copy_samples(8, 1),
            params=params,
            runtime=runtime,
            pad_id=PAD,
            max_length=64,
            attn="sdpa",
        )
    warnings = [r.getMessage() for r in caplog.records if "packed is not available" in r.getMessage()]
    assert len(warnings) == 1 and "the pegasus family is not checked" in warnings[0]
    assert result.summary["batching"] == "length_grouped"


@pytest.mark.parametrize(
    ("kind", "targets"),
    [
        ("bart", {"q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"}),
        ("t5", {"q", "k", "v", "o", "wi", "wo"}),
    ],
)
def test_lora_trains_the_family_targets_of_an_encoder_decoder_and_loads_back(tmp_path, kind, targets):
    from fastlm.engine.model.adapter_folder import load_adapter_model

    folder = tmp_path / kind
    # frozen embeddings (LoRA) of BART's usual init (std 0.02) in 16 dimensions barely move the tied logits
    _tiny(kind, init_std=0.5).save_pretrained(folder)
    params = _params(tmp_path, folder, mode="packed")  # packed through the PEFT wrapper
    params = params.model_copy(
        update={
            "max_steps": 30,
            "optimizer": params.optimizer.model_copy(update={"lr": 2e-2}),
            "model": params.model.model_copy(
                update={
                    "lora": params.model.lora.model_copy(
                        update={"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0}
                    )
                }
            ),
        }
    )
    model = build_model(params.model, _Tokenizer(), max_length=64, attn_implementation="sdpa")
    adapted = {
        name.split(".lora_A")[0].rsplit(".", 1)[-1]
        for name, _ in model.named_parameters()
        if "lora_A" in name
    }
    assert adapted == targets
    assert any("encoder" in name and "lora_A" in name for name, _ in model.named_parameters())
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
    result = train(
        model,
        copy_samples(200, 1),
        None,
        params=params,
        runtime=runtime,
        pad_id=PAD,
        max_length=64,
        attn="sdpa",
    )
    losses = [record["loss"] for record in result.history]
    assert losses[-1] < losses[0] - 0.3 and result.summary["batching"] == "packed"
    result.model.save_pretrained(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_2_SEQ_LM" and targets <= set(config["target_modules"])
    merged = load_adapter_model(tmp_path / "adapter")
    assert type(merged).__name__ == type(_tiny(kind)).__name__
    batch = Seq2SeqCollator(pad_id=PAD, decoder_start_id=EOS)(copy_samples(4, 5).__getitems__(range(4)))
    inputs = {
        key: batch[key]
        for key in ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")
    }
    result.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            merged(**inputs).logits, result.model(**inputs).logits, rtol=0, atol=MERGED_ADAPTER_ATOL
        )


def test_tune_measures_the_seq2seq_training_step(tmp_path, monkeypatch):
    from fastlm.engine.train import tune

    params = _params(tmp_path, tmp_path)
    runtime = setup_runtime(RuntimeConfig(device="cpu", num_threads=1))
    model = _tiny("t5")
    dataset = copy_samples(60, 1)
    before = [p.detach().clone() for p in model.parameters()]
    stepped = []  # at the trial's end, before its starting weights are put back: whether steps changed them
    restore = tune.restore_weights

    def restoring(model, copies):
        params = [(name, p) for name, p in model.named_parameters() if name in copies]
        stepped.append(any(not torch.equal(p.detach(), copies[name]) for name, p in params))
        restore(model, copies)

    monkeypatch.setattr(tune, "restore_weights", restoring)
    measure = tune.real_step_measurer(
        model,
        dataset,
        params=params,
        runtime=runtime,
        pad_id=PAD,
        max_length=64,
        attn="sdpa",
        warmup=1,
        timed=2,
    )
    trial = measure(4)
    # the timed steps are the run's own (length-grouped seq2seq batches of 4):
    # their real tokens over their time
    trial_params = params.model_copy(
        update={"batching": params.batching.model_copy(update={"micro_batch_size": 4})}
    )
    sampler, collator = make_batching(
        trial_params,
        dataset.lengths,
        pad_id=PAD,
        max_length=64,
        seed=params.seed,
        sides=seq2seq_batching(model, dataset, "sdpa"),
    )
    sampler.set_epoch(0)
    timed = [indices for _, indices in zip(range(3), iter(sampler), strict=False)][1:]  # after 1 warm-up step
    real = sum(int(collator(dataset.__getitems__(indices))["num_real_tokens"]) for indices in timed)
    assert real == sum(int(dataset.lengths[i]) + 1 for indices in timed for i in indices)  # + decoder start
    assert round(trial.real_tokens_per_s * trial.step_time_s * 2) == real  # the 2 timed steps' real tokens
    assert trial.samples_per_micro_batch == 4.0
    assert stepped == [True], "no step was taken"
    # the next trial starts from the weights the model was built with
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize(
    "weights",
    [{}, {"precision": "bf16", "param_dtype": "bf16"}],
    ids=["fp32", "bf16-weights"],  # T5 keeps its wo layers fp32 (transformers' _keep_in_fp32_modules)
)
def test_seq2seq_run_resumes_from_its_checkpoint_to_the_same_weights(tmp_path, weights):
    folder = tmp_path / "t5"
    _tiny("t5").save_pretrained(folder)
    runtime_params = {"device": "cpu", "num_threads": 1, "deterministic": True, **weights}

    def run(root, callbacks=(), **overrides):
        params = _params(root, folder, mode="packed").model_copy(
            update={"max_steps": 8, "save_every": 4, "eval_every": None, "log_every": 1, **overrides}
        )
        params = params.model_copy(update={"runtime": params.runtime.model_copy(update=runtime_params)})
        runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
        model = build_model(params.model, _Tokenizer(), max_length=64, attn_implementation="sdpa")
        return train(
            model,
            copy_samples(120, 1),
            None,
            params=params,
            runtime=runtime,
            pad_id=PAD,
            max_length=64,
            attn="sdpa",
            callbacks=callbacks,
        )

    def interrupt(kind, record):
        if record["step"] == 6:
            raise KeyboardInterrupt

    straight = run(tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "b", callbacks=[interrupt])
    resumed = run(tmp_path / "b", resume="auto")
    assert resumed.summary["resumed_from_step"] == 4 and resumed.summary["steps_trained"] == 4
    assert resumed.summary["batching"] == "packed"
    assert resumed.history[-1]["loss"] == straight.history[-1]["loss"]
    assert ("bf16 weights" in resumed.summary["param_dtype"]) == bool(weights)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert a.dtype == torch.float32 and torch.equal(a, b)


@pytest.mark.parametrize("checkpoint", ["forced_bos", "no_start_id"])
def test_generation_starts_the_decoder_as_training_did(tmp_path, checkpoint, caplog):
    """fastlm trains the decoder on ``[start] + response + EOS``. facebook/bart-* checkpoints force BOS as the
    first generated token (``forced_bos_token_id: 0``): every generation (the report's ROUGE, predict) put BOS
    where the response's first token was trained to be (0 of 40 exact on a trained copy task, 40 of 40
    without it). An mBART-style config without ``decoder_start_token_id`` trained from pad and generated from
    BOS. After training the model generates as it trained, and its saved folder keeps that."""
    from transformers import AutoModelForSeq2SeqLM

    from fastlm.engine.evaluate.generation import generate_continuations

    model = _tiny("bart", init_std=0.2)
    if checkpoint == "forced_bos":
        model.generation_config.forced_bos_token_id = 0  # as the checkpoint's generation_config.json holds it
    else:
        model.config.decoder_start_token_id = model.generation_config.decoder_start_token_id = None
    data = copy_samples(40, 0)
    params = parse_train_params(
        {
            "batching": {"mode": "length_grouped", "micro_batch_size": 8},
            "max_steps": 1, "eval_every": None, "save_every": None, "quiet": True,
            "checkpoint_dir": str(tmp_path / "checkpoints"), "runtime": {"device": "cpu", "num_threads": 1},
        }
    )  # fmt: skip
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    caplog.set_level("INFO", logger="fastlm")
    trained = train(
        model, data, None, params=params, runtime=runtime, pad_id=PAD, max_length=32, attn="sdpa"
    ).model
    start = seq2seq_batching(trained, data).decoder_start_id
    assert start == (EOS if checkpoint == "forced_bos" else PAD)
    prompts = [list(data[i][: int(data.prompt_lengths[i])]) for i in range(8)]

    def greedy(model, prompt):  # the decoder from the prefix training used
        decoded = [start]
        with torch.no_grad():
            for _ in range(5):
                logits = model(
                    input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([decoded])
                ).logits
                decoded.append(int(logits[0, -1].argmax()))
        return decoded[1:]

    trained.eval()
    expected = [greedy(trained, prompt) for prompt in prompts]
    made = generate_continuations(trained, prompts, pad_id=PAD, eos_id=EOS, runtime=runtime, max_new_tokens=5)
    assert made.continuations == [
        ids[: len(got)] for ids, got in zip(expected, made.continuations, strict=True)
    ]
    trained.save_pretrained(tmp_path / "saved")
    again = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "saved")
    assert again.generation_config.forced_bos_token_id is None
    assert again.generation_config.decoder_start_token_id == start == again.config.decoder_start_token_id
    if checkpoint == "forced_bos":
        assert any("forced_bos_token_id" in message for message in caplog.messages)


def test_a_chats_earlier_answers_are_encoder_input_and_an_encoder_decoder_run_says_so_once(tmp_path, caplog):
    """Chat data with its earlier answers trained (``split.train_turns: all``): an encoder-decoder model feeds
    the whole prompt to its encoder, so only the last answer is its target; the run says so once (not at
    every evaluation), and trains the last answers as without the spans."""
    samples = copy_samples(40, 0)
    spans = np.zeros(2 * len(samples), dtype=np.int32)
    spans[::2], spans[1::2] = 1, np.minimum(samples.prompt_lengths, 2)
    offsets = np.arange(0, 2 * len(samples) + 1, 2)
    chats = TokenSequences(
        samples.values, samples.offsets, samples.prompt_lengths, answer_spans=(spans, offsets)
    )
    folder = tmp_path / "bart"
    _tiny("bart").save_pretrained(folder)
    params = _params(tmp_path, folder).model_copy(update={"max_steps": 4, "eval_every": 2})
    model = build_model(params.model, _Tokenizer(), max_length=64, attn_implementation="sdpa")
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
    with caplog.at_level("WARNING", logger="fastlm.engine"):
        result = train(
            model, chats, chats, params=params, runtime=runtime, pad_id=PAD, max_length=64, attn="sdpa"
        )
    said = [r for r in caplog.records if "only each chat's last answer is trained" in r.getMessage()]
    assert len(said) == 1 and len(result.eval_history) == 2
    assert result.eval_history[-1]["val_target_tokens"] == int(
        (samples.lengths - samples.prompt_lengths).sum()
    )


@pytest.mark.parametrize("mode", ["length_grouped", "packed"])
def test_a_bart_sample_reaches_the_model_as_hugging_faces_summarization_recipe_feeds_it(mode):
    """HF's run_summarization with BART: encoder ``tokenizer(source)`` = ``<s> source </s>``, labels
    ``tokenizer(text_target=target)`` = ``<s> target </s>``, decoder input ``shift_tokens_right(labels)`` =
    ``</s> <s> target``. fastlm's split tokenizes prompt and response without the tokenizer's ends
    (decoder-only data needs them so); an encoder-decoder batch puts them back, padded and packed alike.
    fastlm's decoder row also holds the EOS input (never scored) and its labels are the causal ones
    (position t predicts ``labels[t + 1]``)."""
    from transformers.models.bart.modeling_bart import shift_tokens_right

    from fastlm.corpus.prompts import tokenize_pairs
    from fastlm.engine.data.collators import TextEnds
    from tests.support.tiny_seq2seq import bart_style_tokenizer

    tokenizer = bart_style_tokenizer()
    source, target = "summarize the dialogue", "a short summary"
    tokens = tokenize_pairs([source], [target], tokenizer, max_length=64, num_proc=1)
    dataset = TokenSequences.from_arrow(tokens.to_arrow(), text_ends=TextEnds.of(tokenizer))
    model = _tiny("bart")
    model.resize_token_embeddings(len(tokenizer))
    params = _params(Path("unused"), "unused", mode=mode)
    _, collator = make_batching(
        params,
        dataset.lengths,
        pad_id=1,
        max_length=64,
        seed=0,
        sides=seq2seq_batching(model, dataset, "sdpa"),
    )
    assert isinstance(collator, PackedSeq2SeqCollator if mode == "packed" else Seq2SeqCollator)
    batch = collator(dataset.__getitems__([0]))
    labels = torch.tensor([tokenizer(text_target=target)["input_ids"]])
    assert batch["input_ids"][0].tolist() == tokenizer(source)["input_ids"]  # <s> source </s>
    assert batch["decoder_input_ids"][:, :-1].tolist() == shift_tokens_right(labels, 1, 2).tolist()
    assert batch["labels"][:, 1:].tolist() == labels.tolist()  # <s> target </s>, <s> a target
    assert batch["labels"][0, 0].item() == IGNORE_INDEX


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_a_checkpoint_of_rows_without_the_tokenizers_ends_is_not_continued_with_them(tmp_path, kind, caplog):
    """A checkpoint written before encoder-decoder rows got the tokenizer's ends back (BART: encoder
    ``</s>``, decoder ``<s>``; T5: encoder ``</s>``) trained on other rows than the same split gives now:
    ``resume: auto`` starts fresh and says why, instead of continuing its data position on rows framed
    otherwise (packed: other rows, some samples twice, others never)."""
    from fastlm.engine.data.collators import TextEnds

    folder = tmp_path / kind
    _tiny(kind).save_pretrained(folder)
    plain = copy_samples(60, 1)  # the rows as an earlier fastlm framed them: no ends
    ends = TextEnds((0,), (EOS,)) if kind == "bart" else TextEnds((), (EOS,))
    framed = TokenSequences(plain.values, plain.offsets, plain.prompt_lengths, text_ends=ends)

    def run(data, **overrides):
        params = _params(tmp_path, folder, mode="packed").model_copy(
            update={"max_steps": 4, "save_every": 2, "eval_every": None, "log_every": 1, **overrides}
        )
        runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
        model = build_model(params.model, _Tokenizer(), max_length=64, attn_implementation="sdpa")
        return train(
            model, data, None, params=params, runtime=runtime, pad_id=PAD, max_length=64, attn="sdpa"
        )

    run(plain, max_steps=2)
    with caplog.at_level("WARNING", logger="fastlm"):
        again = run(framed, resume="auto")
    assert not again.summary.get("resumed_from_step")
    assert again.summary["steps_trained"] == 4
    assert any("not resuming" in message and "data.ends" in message for message in caplog.messages)
    # the same framing continues
    resumed = run(framed, resume="auto", max_steps=6)
    assert resumed.summary["resumed_from_step"] == 4


@pytest.mark.parametrize("mode", ["packed", "length_grouped"])
def test_an_encoder_decoder_runs_epoch_tokens_count_the_ends_its_rows_get(tmp_path, mode):
    """An encoder-decoder row gets the decoder start and the tokenizer's ends around the split's ids (BART:
    ``</s>`` after the prompt, ``</s> <s>`` before the response), which every step's real tokens (the rate's)
    count. The epoch's tokens (``train_tokens``, the epoch time's numerator) and ``tokens_per_step`` counted
    the split's ids alone: 3 tokens a sample short, so the epoch time read short. One epoch of 8 samples:
    the tokens it saw are the epoch's tokens."""
    from fastlm.engine.data.collators import TextEnds

    folder = tmp_path / "bart"
    _tiny("bart").save_pretrained(folder)
    plain = copy_samples(8, 3)
    samples = TokenSequences(
        plain.values, plain.offsets, plain.prompt_lengths, text_ends=TextEnds((0,), (EOS,))
    )
    params = _params(tmp_path, folder, mode=mode, micro_batch_size=4).model_copy(
        update={"max_steps": None, "epochs": 1.0, "log_every": 1, "eval_every": None}
    )
    model = build_model(params.model, _Tokenizer(), max_length=64, attn_implementation="sdpa")
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
    result = train(
        model, samples, None, params=params, runtime=runtime, pad_id=PAD, max_length=64, attn="sdpa"
    )
    summary = result.summary
    assert summary["epochs"] == 1.0 and summary["tokens_seen"] == int(plain.lengths.sum()) + 3 * 8
    assert summary["train_tokens"] == summary["tokens_seen"]
    assert summary["tokens_per_step"] * summary["steps"] == pytest.approx(
        summary["tokens_seen"], abs=0.05 * 8
    )


def test_an_encoder_decoder_runs_flops_per_token_count_each_side_through_its_own_stack(tmp_path):
    """An encoder token runs through the encoder, a decoder token through the decoder (its self- and
    cross-attention) and the LM head: the FLOPs per real token (what MFU divides by the GPU's peak) are the
    two sides' 6 N + 12 L d S, weighted by the tokens each side gets. Was: 6 N of the whole model for every
    encoder and decoder token (BART-base: about twice the work done, so MFU twice too high)."""
    from fastlm.engine.data.collators import TextEnds

    folder = tmp_path / "bart"
    _tiny("bart").save_pretrained(folder)
    plain = copy_samples(8, 3)
    samples = TokenSequences(
        plain.values, plain.offsets, plain.prompt_lengths, text_ends=TextEnds((0,), (EOS,))
    )
    params = _params(tmp_path, folder, micro_batch_size=4).model_copy(
        update={"max_steps": 2, "log_every": 1, "eval_every": None}
    )
    model = build_model(params.model, _Tokenizer(), max_length=64, attn_implementation="sdpa")
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
    result = train(
        model, samples, None, params=params, runtime=runtime, pad_id=PAD, max_length=64, attn="sdpa"
    )
    total = sum(p.numel() for p in model.parameters())
    encoder = sum(
        p.numel() for name, p in model.model.encoder.named_parameters() if not name.startswith("embed_tokens")
    )
    decoder = total - encoder  # its stack, the shared token table (the LM head) and the logits' bias
    width, layers, length = SMALL_BART_LAYERS["d_model"], 1, 64
    per_encoder_token = 6 * encoder + 12 * layers * width * length
    per_decoder_token = 6 * decoder + 2 * 12 * layers * width * length  # self- and cross-attention
    encoder_tokens = int(plain.prompt_lengths.sum()) + 8  # each prompt and the tokenizer's </s>
    decoder_tokens = int((plain.lengths - plain.prompt_lengths).sum()) + 2 * 8  # </s> <s> and each response
    expected = (encoder_tokens * per_encoder_token + decoder_tokens * per_decoder_token) / (
        encoder_tokens + decoder_tokens
    )
    assert result.summary["flops_per_token"] == pytest.approx(expected, rel=1e-9)
    assert result.summary["encoder_decoder"] is True  # the report says what such a model trained
    assert result.summary["flops_per_token"] < 0.75 * (6 * total + 12 * layers * width * length)
