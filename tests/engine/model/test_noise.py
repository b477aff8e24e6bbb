"""engine/model/noise.py, NEFTune (``train.model.neftune_noise_alpha``): uniform noise on the input
embeddings while training, as the Trainer and TRL add it (transformers' own hook), none in evaluation, and the
model handed back without it."""

from __future__ import annotations

import pytest
import torch

from fastlm.engine.config import parse_train_params
from fastlm.errors import ConfigError
from tests.support.tiny_seq2seq import tiny_seq2seq
from tests.support.toy_training import run_toy, toy_model, toy_params

STEPS = {"max_steps": 4, "log_every": 1, "eval_every": 4}


def test_a_run_with_neftune_trains_on_noisy_embeddings_and_evaluates_and_returns_a_plain_model(tmp_path):
    plain = run_toy(toy_params(tmp_path / "plain", **STEPS))
    noisy = run_toy(toy_params(tmp_path / "noisy", model={"neftune_noise_alpha": 5.0}, **STEPS))
    # the same weights and batches: the first step's loss differs only by the embeddings' noise
    assert noisy.history[0]["loss"] != plain.history[0]["loss"]
    assert noisy.summary["neftune_noise_alpha"] == 5.0 and plain.summary["neftune_noise_alpha"] == 0.0
    # the hook is gone from the model handed back (saved, evaluated, served): its embeddings are the table's
    embeddings = noisy.model.get_input_embeddings()
    assert not embeddings._forward_hooks and not hasattr(embeddings, "neftune_noise_alpha")
    ids = torch.arange(16).view(2, 8)
    noisy.model.train()
    assert torch.equal(embeddings(ids), embeddings.weight[ids])


@pytest.mark.parametrize("adapters", [False, True], ids=["model", "lora"])
def test_the_noise_is_transformers_own_bounded_by_alpha_over_the_root_of_length_times_width(adapters):
    """In training mode each embedding entry moves by at most alpha / sqrt(row length x hidden size)
    (transformers' ``neftune_post_forward_hook``, which fastlm registers: on a LoRA model, the base model's
    embeddings), the same draws from the same generator state; in evaluation mode nothing is added."""
    from fastlm.engine.config import LoraParams
    from fastlm.engine.model.lora import apply_lora
    from fastlm.engine.model.noise import add_neftune

    model = toy_model()
    if adapters:
        model = apply_lora(model, LoraParams(enabled=True, r=4), gradient_checkpointing=False)
    embeddings = model.get_input_embeddings()
    ids = torch.randint(0, embeddings.num_embeddings, (3, 40), generator=torch.Generator().manual_seed(0))
    clean = embeddings(ids).detach()
    remove = add_neftune(model, 5.0)
    torch.manual_seed(1)
    noisy = embeddings(ids).detach()
    bound = 5.0 / (40 * embeddings.embedding_dim) ** 0.5
    moved = (noisy - clean).abs()
    assert 0.9 * bound < moved.max() <= bound * (1 + 1e-6) and moved.mean() > 0.4 * bound
    torch.manual_seed(1)
    assert torch.equal(embeddings(ids), noisy)  # the same draws again: the same computation run twice
    model.eval()
    assert torch.equal(embeddings(ids), clean)
    remove()
    model.train()
    assert torch.equal(embeddings(ids), clean)


def _noise_by_sample(model, inputs: dict, clean: torch.Tensor, samples: list[tuple[int, int, int]]):
    """The largest noise on each sample's embeddings (row, start, length) in one training forward."""
    seen = {}
    embeddings = model.get_input_embeddings()
    handle = embeddings.register_forward_hook(lambda module, args, output: seen.update(out=output.detach()))
    try:
        model(**inputs)
    finally:
        handle.remove()
    moved = (seen["out"] - clean).abs()
    return [moved[row, start : start + length].max().item() for row, start, length in samples]


def test_the_noise_scale_is_each_samples_own_length_whatever_the_rows_or_the_attention_path():
    """The varlen paths (the GPU's auto choice) hand the model a micro-batch as one row of all its tokens:
    transformers' hook, reading the tensor's length, scaled the noise by 1 / sqrt(every token of the
    micro-batch) there (0.0418 where the packed rows' dense path gave 0.0781, the same data), so the
    attention kernel and the micro-batch size changed the training's noise. Each token's noise is now
    bounded by alpha / sqrt(its sample's length x hidden size) on every path, as the NEFTune authors' code
    does (the sample's unpadded length)."""
    from fastlm.engine.model.noise import add_neftune

    model = toy_model()
    width = model.config.hidden_size
    lengths = [5, 27, 19, 13]
    generator = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, model.config.vocab_size, (n,), generator=generator) for n in lengths]
    positions = [torch.arange(n) for n in lengths]
    add_neftune(model, 5.0)
    model.train()
    torch.manual_seed(0)
    clean = model.get_input_embeddings().weight.detach()
    bounds = [5.0 / (n * width) ** 0.5 for n in lengths]
    # one row of every token (the varlen paths), two packed rows of 32 (the dense and flex paths)
    flat = {"input_ids": torch.cat(ids)[None], "position_ids": torch.cat(positions)[None]}
    rows = {"input_ids": torch.stack([torch.cat(ids[:2]), torch.cat(ids[2:])])}
    rows["position_ids"] = torch.stack([torch.cat(positions[:2]), torch.cat(positions[2:])])
    starts = [0, 5, 32, 51]
    for inputs, samples in (
        (flat, [(0, start, n) for start, n in zip(starts, lengths, strict=True)]),
        (rows, [(0, 0, 5), (0, 5, 27), (1, 0, 19), (1, 19, 13)]),
    ):
        largest = _noise_by_sample(model, inputs, clean[inputs["input_ids"]], samples)
        for moved, bound in zip(largest, bounds, strict=True):
            assert 0.9 * bound < moved <= bound * (1 + 1e-6)
    # padded rows (length_grouped, dynamic): each row's real tokens
    padded = torch.full((2, 27), model.config.pad_token_id)
    padded[0, :5], padded[1] = ids[0], ids[1]
    mask = (torch.arange(27) < torch.tensor([[5], [27]])).long()
    largest = _noise_by_sample(
        model, {"input_ids": padded, "attention_mask": mask}, clean[padded], [(0, 0, 5), (1, 0, 27)]
    )
    for moved, bound in zip(largest, bounds[:2], strict=True):
        assert 0.9 * bound < moved <= bound * (1 + 1e-6)


def test_a_negative_alpha_is_refused_in_one_line():
    refused = r"train\.model\.neftune_noise_alpha = -1 .*greater than or equal to 0"
    with pytest.raises(ConfigError, match=refused):
        parse_train_params({"model": {"neftune_noise_alpha": -1}})


def _side_outputs(model, inputs: dict) -> list[torch.Tensor]:
    """The encoder's and the decoder's token-embedding outputs of one forward of ``model``."""
    seen: list[torch.Tensor] = []
    tables = [model.get_encoder().embed_tokens, model.get_decoder().embed_tokens]
    handles = [t.register_forward_hook(lambda m, a, out: seen.append(out.detach())) for t in tables]
    try:
        model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


@pytest.mark.parametrize("kind", ["bart", "t5"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_an_encoder_decoder_trains_on_noise_of_each_samples_own_length_on_both_sides(kind, packed):
    """BART and T5 embed their tokens through the encoder's and the decoder's own ``embed_tokens``, not the
    shared table ``get_input_embeddings`` returns: a hook there (transformers' place for it) never ran, and
    an encoder-decoder trained with neftune_noise_alpha 5 trained on clean embeddings (noise 0.0). Now each
    side's token embeddings move by at most alpha / sqrt(the sample's length on that side x width), close to
    it, packed rows (several samples a row) and padded rows alike; nothing in evaluation."""
    from fastlm.engine.data import Seq2SeqCollator
    from fastlm.engine.data.schema import MODEL_INPUTS
    from fastlm.engine.model.attention.inputs import to_device
    from fastlm.engine.model.encoder_decoder import enable_packed_seq2seq
    from fastlm.engine.model.noise import add_neftune
    from tests.support.tiny_seq2seq import PAD, packed_batch, samples

    model = tiny_seq2seq(kind)
    start = model.config.decoder_start_token_id
    enable_packed_seq2seq(model)
    if packed:
        batch = packed_batch(samples(10), start)
        segments = [batch["encoder_segment_ids"], batch["decoder_segment_ids"]]
    else:
        batch = Seq2SeqCollator(pad_id=PAD, decoder_start_id=start)(samples(4))
        segments = [batch["attention_mask"] - 1, batch["decoder_attention_mask"] - 1]  # 0 real, -1 padding
    inputs = to_device(batch, torch.device("cpu"), "sdpa")[MODEL_INPUTS]
    model.eval()
    clean = _side_outputs(model, inputs)
    add_neftune(model, 5.0)
    torch.manual_seed(0)
    model.train()
    noisy = _side_outputs(model, inputs)
    model.eval()
    assert all(torch.equal(a, b) for a, b in zip(_side_outputs(model, inputs), clean, strict=True))
    width = clean[0].size(-1)
    checked = 0
    for before, after, segment in zip(clean, noisy, segments, strict=True):
        moved = (after - before).abs().amax(-1)
        for row in range(segment.size(0)):
            for sample in set(segment[row].tolist()) - {-1}:
                tokens = segment[row] == sample
                bound = 5.0 / (int(tokens.sum()) * width) ** 0.5
                largest = moved[row, tokens].max().item()
                assert 0.7 * bound < largest <= bound * (1 + 1e-5), (row, sample, largest, bound)
                checked += 1
    assert checked > 4
