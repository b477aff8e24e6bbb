"""generate_continuations: batched left-padded generation equals one prompt at a time; order, EOS, cache,
modes."""

import copy

import pandas as pd
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.engine.evaluate.generation import decoding_kwargs, generate_continuations, generate_samples
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from tests.support.project import catalog_dataset
from tests.support.tiny_llama import line_end_llama, scripted_llama

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

VOCAB, PAD, EOS, BOS = 64, 0, 2, 1


@pytest.fixture(scope="module")
def runtime():
    return setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=BOS,
        attn_implementation="sdpa",
        use_cache=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # larger logits than at initialisation: greedy choices are far from ties
        model.lm_head.weight.mul_(20)
    return model.train()


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 14, (n,), generator=generator).tolist()
    return [torch.randint(3, VOCAB, (length,), generator=generator).tolist() for length in lengths]


def _generate(model, prompts, runtime, **kwargs):
    return generate_continuations(model, prompts, pad_id=PAD, eos_id=EOS, runtime=runtime, **kwargs)


def generated_alone(model, prompts, *, pad: int, end: int, max_new_tokens: int, **options) -> list[list[int]]:
    """Plain ``generate`` on each prompt alone (no padding), each continuation cut at its first ``end``."""
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            generated = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), pad_token_id=pad,
                max_new_tokens=max_new_tokens, **options,
            )[0, len(prompt) :].tolist()  # fmt: skip
        out.append(generated[: generated.index(end)] if end in generated else generated)
    return out


def test_batched_left_padded_greedy_equals_one_prompt_at_a_time(model, runtime):
    prompts = _prompts(11)
    assert len({len(p) for p in prompts}) > 3  # real padding inside batches
    batched = _generate(model, prompts, runtime, batch_size=4, max_new_tokens=12)
    alone = [
        _generate(model, [prompt], runtime, batch_size=1, max_new_tokens=12).continuations[0]
        for prompt in prompts
    ]
    assert batched.continuations == alone
    assert batched.new_tokens == sum(len(ids) for ids in alone) > 0 and batched.seconds > 0


def test_continuations_come_back_in_prompt_order_whatever_the_batching(model, runtime):
    prompts = _prompts(9, seed=1)
    reference = _generate(model, prompts, runtime, batch_size=9, max_new_tokens=6).continuations
    for batch_size in (1, 2, 5):
        assert (
            _generate(model, prompts, runtime, batch_size=batch_size, max_new_tokens=6).continuations
            == reference
        )
    reversed_out = _generate(model, prompts[::-1], runtime, batch_size=3, max_new_tokens=6).continuations
    assert reversed_out == reference[::-1]


def test_generation_stops_at_eos_and_excludes_it(model, runtime):
    prompts = _prompts(6, seed=2)
    free = _generate(model, prompts, runtime, batch_size=3, max_new_tokens=8).continuations
    # Make the token the model picks first for the first prompt the EOS: that prompt then yields nothing.
    first = free[0][0]
    stopped = generate_continuations(
        model, prompts, pad_id=PAD, eos_id=[EOS, first], runtime=runtime, batch_size=3, max_new_tokens=8
    ).continuations
    assert stopped[0] == []
    for ids, full in zip(stopped, free, strict=True):
        assert first not in ids and EOS not in ids
        assert ids == full[: len(ids)]  # identical up to the stop
        assert len(ids) <= 8


def test_generation_stops_at_every_end_id_of_the_models_generation_config_as_plain_generate_does(
    model, runtime
):
    """A model whose generation config lists several end ids (Llama-3 instruct: <|eot_id|> and
    <|end_of_text|>; Qwen3: <|im_end|> and <|endoftext|>) stops at each of them, given the tokenizer's EOS
    alone: batched greedy generation equals ``model.generate`` on each prompt alone."""
    prompts = _prompts(6, seed=5)
    free = _generate(model, prompts, runtime, batch_size=3, max_new_tokens=8).continuations
    other = free[0][2]  # the third token the model picks for the first prompt: an end of turn from now on
    assert other != EOS and other not in free[0][:2]
    listed = copy.deepcopy(model).eval()
    listed.generation_config.eos_token_id = [EOS, other]
    got = _generate(listed, prompts, runtime, batch_size=3, max_new_tokens=8).continuations
    alone = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            output = listed.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False
            )[0, len(prompt) :].tolist()
        alone.append(output[: min([output.index(end) for end in (EOS, other) if end in output], default=8)])
    assert got == alone and got[0] == free[0][:2]


def test_cache_is_on_for_generation_and_modes_are_restored(model, runtime):
    fed = []  # tokens fed to the model at each step: the whole prompt, then one token each (the KV cache)
    hook = model.model.register_forward_pre_hook(
        lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        _generate(model, [[5, 6, 7], [8, 9]], runtime, max_new_tokens=4)
    finally:
        hook.remove()
    assert fed == [3, 1, 1, 1]
    assert model.training and model.config.use_cache is False


def test_sampling_is_seeded_and_leaves_the_global_rng_alone(model, runtime):
    prompts = _prompts(5, seed=3)
    options = decoding_kwargs(do_sample=True, temperature=1.5, top_p=0.9)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    one = _generate(model, prompts, runtime, max_new_tokens=6, seed=7, **options).continuations
    after = torch.rand(1)
    two = _generate(model, prompts, runtime, max_new_tokens=6, seed=7, **options).continuations
    other = _generate(model, prompts, runtime, max_new_tokens=6, seed=8, **options).continuations
    assert one == two and one != other and torch.equal(before, after)


def test_beam_search_and_repetition_controls_run_batched(model, runtime):
    prompts = _prompts(4, seed=4)
    options = decoding_kwargs(num_beams=3, repetition_penalty=1.3, no_repeat_ngram_size=2)
    out = _generate(model, prompts, runtime, batch_size=2, max_new_tokens=10, **options).continuations
    for ids in out:
        bigrams = list(zip(ids, ids[1:], strict=False))
        assert len(bigrams) == len(set(bigrams))  # no bigram repeated inside a continuation


def test_settings_left_out_are_off_not_the_ones_of_the_models_generation_config(model, runtime):
    """A model folder's generation_config.json may set decoding controls of its own (a repetition penalty, a
    no-repeat size, a length penalty, sampling with a top-k; transformers' default top-k is 50): the settings
    a generation is given are the ones it runs with, the controls left out (or at their "off" value, which
    ``decoding_kwargs`` leaves out) off, as the summary records them. The reference: each prompt alone
    through ``model.generate`` of the same weights with every control given explicitly."""
    prompts = _prompts(6, seed=6)
    configured = copy.deepcopy(model).eval()
    configured.generation_config.update(
        do_sample=True, top_k=2, repetition_penalty=1.8, no_repeat_ngram_size=1, length_penalty=-3.0
    )
    plain = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0}
    cases = [
        (decoding_kwargs(), {"do_sample": False, **plain}),
        ({}, {"do_sample": False, **plain}),
        (decoding_kwargs(num_beams=3), {"do_sample": False, "num_beams": 3, "length_penalty": 1.0, **plain}),
    ]
    for kwargs, explicit in cases:
        got = _generate(configured, prompts, runtime, batch_size=3, max_new_tokens=8, **kwargs).continuations
        alone = []
        for prompt in prompts:
            ids = torch.tensor([prompt])
            with torch.no_grad():
                output = configured.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, **explicit
                )[0, len(prompt) :].tolist()
            alone.append(output[: output.index(EOS)] if EOS in output else output)
        assert got == alone, kwargs
    sampled = decoding_kwargs(do_sample=True, temperature=1.5)
    options = {"batch_size": 6, "max_new_tokens": 8, "seed": 3}
    reference = _generate(model, prompts, runtime, **options, **sampled, top_k=0, **plain).continuations
    assert _generate(configured, prompts, runtime, **options, **sampled).continuations == reference


# A scripted model (``scripted_llama``): "a" is answered "b" then its end, "c" by "d a b" then its end.
_ENDING = (("<pad>", "<s>", "</s>", "<unk>", "a", "b", "c", "d"), {"a": "b", "b": "</s>", "c": "d", "d": "a"})


@pytest.mark.parametrize(
    "folder_sets",
    [
        {"min_new_tokens": 3},
        {"min_length": 6},
        {"max_time": 0.0},
        {"epsilon_cutoff": 0.1},
        {"typical_p": 0.2},
        {"min_p": 0.3},
        {"top_h": 0.3},
        {"watermarking_config": {"greenlist_ratio": 0.25}},
        {"num_return_sequences": 2, "num_beams": 4},
    ],
    ids=lambda fields: next(iter(fields)),
)
def test_length_floors_and_sampling_cuts_of_the_models_generation_config_are_off_too(folder_sets, runtime):
    """A model folder's generation_config.json setting a length floor (min_new_tokens, min_length: its end
    token barred until then), a time limit, a sampling cut (epsilon, typical, min-p, top-h), a watermark or
    several sequences per prompt: outputs the recorded settings do not describe (or a crash). They are off
    as the settings left out are. The reference: the same weights without those fields, each prompt alone
    through ``model.generate`` (greedy), or the same seeded call (sampling)."""
    model, _ = scripted_llama(*_ENDING)
    sampling = next(iter(folder_sets)) not in (
        "min_new_tokens",
        "min_length",
        "max_time",
        "num_return_sequences",
    )
    if sampling:  # a flatter next-token distribution: the cuts remove tokens sampling picks
        with torch.no_grad():
            model.lm_head.weight.mul_(0.1)
    configured = copy.deepcopy(model)
    configured.generation_config.update(**folder_sets)
    prompts = [[4], [6], [5, 6], [7], [6, 7, 4]] * (4 if sampling else 1)
    pad, end = 0, 2

    def alone(chosen, **explicit):
        return generated_alone(chosen, prompts, pad=pad, end=end, max_new_tokens=8, **explicit)

    def ours(chosen, **settings):
        return generate_continuations(
            chosen,
            prompts,
            pad_id=pad,
            eos_id=end,
            runtime=runtime,
            batch_size=3,
            max_new_tokens=8,
            **settings,
        ).continuations

    if sampling:
        settings = decoding_kwargs(do_sample=True)
        assert ours(configured, **settings) == ours(model, **settings)
        torch.manual_seed(0)
        plain = alone(model, do_sample=True, top_k=0)
        torch.manual_seed(0)
        assert alone(configured, do_sample=True, top_k=0) != plain  # the field changes what is sampled
        return
    reference = alone(model, do_sample=False)
    assert ours(configured, **decoding_kwargs()) == reference
    beams = decoding_kwargs(num_beams=3)
    assert ours(configured, **beams) == alone(model, num_beams=3, do_sample=False, length_penalty=1.0)
    if "num_return_sequences" not in folder_sets:
        assert alone(configured, do_sample=False) != reference  # the field changes what greedy gives


def test_decoding_kwargs_leave_out_what_does_nothing():
    assert decoding_kwargs() == {"num_beams": 1, "do_sample": False}
    assert decoding_kwargs(temperature=0.5, top_p=0.8) == {"num_beams": 1, "do_sample": False}
    assert decoding_kwargs(do_sample=True, temperature=0.5, top_p=0.8, no_repeat_ngram_size=3) == {
        "num_beams": 1,
        "do_sample": True,
        "temperature": 0.5,
        "top_p": 0.8,
        "no_repeat_ngram_size": 3,
    }


def test_empty_prompt_starts_from_the_start_id(model, runtime):
    out = _generate(model, [[], [BOS]], runtime, max_new_tokens=5, start_id=BOS).continuations
    assert out[0] == out[1]
    with pytest.raises(ValueError, match="start_id"):
        _generate(model, [[]], runtime)


def test_sample_generations_write_line_ends_as_lf_and_read_back_row_for_row(runtime, tmp_path):
    """A model that writes a bare carriage return and a CRLF: its continuations get the split's line-end rule,
    so the CSV (pandas quotes only the fields that hold a line feed) reads back one row per generation."""
    model, tokenizer = line_end_llama()
    frame = generate_samples(
        model, tokenizer, ["a", "c"], settings=[{"name": "greedy"}], max_new_tokens=2, runtime=runtime
    )
    assert frame["output"].tolist() == ["\nb", "\na"]
    dataset = catalog_dataset("sample_generations", tmp_path / "sample_generations.csv")
    dataset.save(frame)
    back = pd.read_csv(tmp_path / "sample_generations.csv", keep_default_na=False)
    assert back["output"].tolist() == frame["output"].tolist() and len(back) == len(frame)


def test_a_sample_continuation_keeps_its_leading_space_with_a_sentencepiece_style_tokenizer(runtime):
    """A SentencePiece-style tokenizer (Llama-2, Mistral, Gemma) takes the space off the first token it
    decodes: the report's sample continuation of "The battery" read "died again" (decoded alone), where
    the whole text decoded is "The battery died again"; ``continuation_text`` gives " died again"."""
    from fastlm.engine.evaluate.generation import continuation_text

    tokens = ("<pad>", "<s>", "</s>", "<unk>", "▁The", "▁battery", "▁died", "▁again")
    chain = {"▁The": "▁battery", "▁battery": "▁died", "▁died": "▁again", "▁again": "</s>"}
    model, tokenizer = scripted_llama(tokens, chain, metaspace=True)
    frame = generate_samples(
        model,
        tokenizer,
        ["The battery"],
        settings=[{"name": "greedy"}],
        max_new_tokens=4,
        runtime=runtime,
        prompt_ids=[[4, 5]],  # as the report gives a plain-text model's prompts (``sample_prompts``)
        continuation=True,
    )
    out = model.generate(torch.tensor([[4, 5]]), max_new_tokens=4, do_sample=False, pad_token_id=PAD)
    assert "The battery" + frame["output"].iloc[0] == tokenizer.decode(out[0], skip_special_tokens=True)
    assert (
        frame["output"].tolist() == [" died again"]
        and continuation_text(None, [6, 7], tokenizer) == "died again"
    )


def test_a_response_loses_a_leading_empty_think_block_and_keeps_reasoning():
    """Qwen3's template writes an empty <think></think> block before each answer in non-thinking mode, and a
    Qwen3 fine-tune may still open its answers with one (`<think>` and `</think>` are not special tokens, so
    decoding keeps them): predictions and the report's ROUGE read "<think></think>안녕하세요". An empty block
    at the start goes; a model's reasoning stays, and so does anything else."""
    from types import SimpleNamespace

    from fastlm.engine.evaluate.generation import response_text

    def decoding(text):
        return SimpleNamespace(decode=lambda ids, skip_special_tokens: text)

    cases = {
        "<think>\n\n</think>\n\n안녕하세요": "안녕하세요",
        "<think></think>안녕하세요": "안녕하세요",
        "<think>배송 문의다</think>\n답: 내일": "<think>배송 문의다</think>\n답: 내일",
        " 답변 \r\n": "답변",
        "답 <think></think>": "답 <think></think>",
    }
    for decoded, expected in cases.items():
        assert response_text([1, 2], decoding(decoded)) == expected


def test_an_encoder_decoder_model_is_asked_its_prompts_as_its_encoder_rows_were_trained():
    """A BART-style tokenizer puts ``</s>`` after a text: the encoder input of a generation ends with it, as
    training's encoder rows do; a decoder-only model's prompt stays as given; a forced BOS is no
    continuation."""
    from fastlm.engine.evaluate.generation import continuation_start, encoder_inputs
    from fastlm.engine.model.encoder_decoder import generate_as_trained
    from tests.support.tiny_seq2seq import bart_style_tokenizer, tiny_seq2seq

    tokenizer, model = bart_style_tokenizer(), tiny_seq2seq("bart")
    assert encoder_inputs(model, [[0, 5, 6], [0, 7, 2]], tokenizer) == [[0, 5, 6, 2], [0, 7, 2]]
    assert encoder_inputs(torch.nn.Linear(1, 1), [[0, 5, 6]], tokenizer) == [[0, 5, 6]]
    generate_as_trained(model, 2, (0,))
    assert model.generation_config.forced_bos_token_id == 0
    assert continuation_start(model, torch.zeros(1, 4)) == 2
    generate_as_trained(model, 2)
    assert model.generation_config.forced_bos_token_id is None
    assert continuation_start(model, torch.zeros(1, 4)) == 1


@pytest.mark.parametrize("max_new_tokens", [1, 4])
def test_a_forced_bos_is_not_one_of_the_new_tokens_asked_for(runtime, max_new_tokens):
    """A BART-style model trained with the tokenizer's ``<s>`` before each response generates it first
    (``forced_bos_token_id``), and it is no part of the continuation: the continuation still gets
    ``max_new_tokens`` tokens of its own (was: one fewer; none for 1), the ones greedy decoding from
    ``[start, <s>]`` gives."""
    from fastlm.engine.model.encoder_decoder import generate_as_trained
    from tests.support.tiny_seq2seq import EOS as END
    from tests.support.tiny_seq2seq import PAD as PADDING
    from tests.support.tiny_seq2seq import tiny_seq2seq

    model = tiny_seq2seq("bart").eval()
    with torch.no_grad():
        model.final_logits_bias[0, END] = -1e4  # never ends early: every asked token is generated
    generate_as_trained(model, END, (0,))
    model.generation_config.forced_eos_token_id = None  # BART's EOS forced at the last token: not this test's
    prompt = [0, 5, 6, 7, END]
    decoded = [END, 0]
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([decoded])).logits
            decoded.append(int(logits[0, -1].argmax()))
    made = generate_continuations(
        model, [prompt], pad_id=PADDING, eos_id=END, runtime=runtime, max_new_tokens=max_new_tokens
    )
    assert made.continuations == [decoded[2:]] and made.new_tokens == max_new_tokens


@pytest.mark.parametrize("forced_bos", [False, True], ids=["no_forced_bos", "forced_bos"])
@pytest.mark.parametrize("max_new_tokens", [1, 4])
def test_a_forced_eos_is_not_one_of_the_new_tokens_asked_for(runtime, max_new_tokens, forced_bos):
    """A BART checkpoint forces its EOS at the last position (``forced_eos_token_id``: BartConfig's default,
    facebook/bart-*'s): it is generated on top of the ``max_new_tokens`` asked for, as a forced BOS is, so a
    row the limit cuts holds ``max_new_tokens`` tokens of its own, the ones greedy decoding gives, and reads
    as cut (``finish_reason`` length). Was: the forced EOS took the last of them: one fewer token (none for
    1), and the row read as ended by the model (``stop``)."""
    from fastlm.engine.model.encoder_decoder import generate_as_trained
    from fastlm.reporting.predictions import finish_reason
    from tests.support.tiny_seq2seq import EOS as END
    from tests.support.tiny_seq2seq import PAD as PADDING
    from tests.support.tiny_seq2seq import tiny_seq2seq

    model = tiny_seq2seq("bart").eval()
    with torch.no_grad():
        model.final_logits_bias[0, END] = -1e4  # the model never ends a row: the limit cuts every one
    generate_as_trained(model, END, (0,) if forced_bos else ())
    assert model.generation_config.forced_eos_token_id == END  # BART's own rule, kept
    prompt = [0, 5, 6, 7, END]
    decoded = [END, 0] if forced_bos else [END]
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([decoded])).logits
            decoded.append(int(logits[0, -1].argmax()))
    made = generate_continuations(
        model, [prompt], pad_id=PADDING, eos_id=END, runtime=runtime, max_new_tokens=max_new_tokens
    )
    assert made.continuations == [decoded[1 + forced_bos :]] and made.new_tokens == max_new_tokens
    assert finish_reason(made.continuations[0], max_new_tokens) == "length"


def test_the_models_forced_and_banned_tokens_are_kept_and_said_once(runtime, monkeypatch):
    """A folder's token rules (a token never emitted: ``bad_words_ids``) are part of the model: kept, and
    the log says so once, however many generations run. The reference: ``model.generate`` alone, whose
    folder rule applies, against the same weights without it."""
    import logging

    from fastlm.engine.evaluate import generation

    model, _ = scripted_llama(*_ENDING)
    banned = copy.deepcopy(model)
    banned.generation_config.update(bad_words_ids=[[5]])
    assert generation.kept_model_rules(banned) == {"bad_words_ids": [[5]]}
    assert generation.kept_model_rules(model) == {}
    logger, lines = logging.Logger("generation"), []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    monkeypatch.setattr(generation, "log", logger)
    monkeypatch.setattr(generation, "_said_kept", set())
    prompts = [[4], [6]]
    runs = [
        generate_continuations(
            banned, prompts, pad_id=0, eos_id=2, runtime=runtime, max_new_tokens=4
        ).continuations
        for _ in range(2)
    ]
    plain = generate_continuations(model, prompts, pad_id=0, eos_id=2, runtime=runtime, max_new_tokens=4)
    assert runs[0] == runs[1] != plain.continuations and all(5 not in ids for ids in runs[0])
    assert len(lines) == 1 and "bad_words_ids=[[5]]" in lines[0]


# A model folder's generation_config.json controls that generation turns off (``_OFF``, and beam search's
# early stop), each with the fastlm setting it is tried under: a value that changes plain ``model.generate``'s
# output on these tiny models (asserted), then ignored by generation.
_FOLDER_CONTROLS = [
    ("sequence_bias", {}),  # the value: a bias against each prompt's first greedy token (set in the test)
    ("exponential_decay_length_penalty", {}),
    ("encoder_repetition_penalty", {}),
    ("renormalize_logits", {"num_beams": 3, "repetition_penalty": 1.5}),
    ("early_stopping", {"num_beams": 4}),
]
_FOLDER_VALUES = {
    "exponential_decay_length_penalty": (2, 3.0),  # the end token's score grows 3x a step after 2 tokens
    "encoder_repetition_penalty": 0.3,  # the prompt's tokens made likelier
    "renormalize_logits": True,  # beam scores renormalized after the repetition penalty
    "early_stopping": True,  # beam search stops at num_beams finished hypotheses
}


@pytest.mark.parametrize(
    ("field", "settings"), _FOLDER_CONTROLS, ids=[field for field, _ in _FOLDER_CONTROLS]
)
def test_the_models_sequence_bias_length_decay_encoder_penalty_renormalization_and_early_stop_are_off(
    model, runtime, tmp_path, field, settings
):
    """A model folder's generation_config.json may carry a sequence bias, a length decay, an encoder-side
    repetition penalty, logit renormalization or beam search's early stop: each changes what plain
    ``model.generate`` gives these weights (checked first, on the folder as loaded), and generation runs
    without it: its output is plain ``model.generate``'s of the same weights with the control off, each
    prompt alone."""
    from transformers import AutoModelForCausalLM

    weights = copy.deepcopy(model).eval()
    generator = torch.Generator().manual_seed(7)
    lengths = torch.randint(1, 14, (20,), generator=generator).tolist()
    prompts = [torch.randint(3, VOCAB, (length,), generator=generator).tolist() for length in lengths]
    if field == "early_stopping":  # an end token likely enough that beams finish at different steps
        with torch.no_grad():
            hidden = torch.cat(
                [weights.model(input_ids=torch.tensor([p])).last_hidden_state[0] for p in prompts]
            )
            direction = hidden.mean(0)
            weights.lm_head.weight[EOS] = 10 * direction / direction.norm()
    options = decoding_kwargs(**settings)
    off = {"length_penalty": 1.0, "early_stopping": False} if options["num_beams"] > 1 else {}

    def alone(chosen, **explicit):
        return generated_alone(chosen, prompts, pad=PAD, end=EOS, max_new_tokens=12, **options, **explicit)

    reference = alone(weights, **off)
    value = _FOLDER_VALUES.get(field)
    if field == "sequence_bias":
        value = [[[first[0]], -100.0] for first in reference if first]
    configured = copy.deepcopy(weights)
    configured.generation_config.update(
        **{field: value}, **({"num_beams": 4} if field == "early_stopping" else {})
    )
    configured.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert getattr(loaded.generation_config, field) is not None  # the folder's json carries it
    kept = {key: value for key, value in off.items() if key != field}
    assert alone(loaded, **kept) != reference  # applied, the control changes the output
    made = generate_continuations(
        loaded, prompts, pad_id=PAD, eos_id=EOS, runtime=runtime, batch_size=4, max_new_tokens=12, **options
    )
    assert made.continuations == reference


def test_an_encoder_decoder_models_encoder_no_repeat_ngram_size_is_off(runtime, tmp_path):
    """``encoder_no_repeat_ngram_size`` in an encoder-decoder folder's generation_config.json bars the
    encoder input's n-grams from the output (a decoder-only model's ``generate`` refuses it): it changes
    plain ``model.generate``'s output (checked first, on the folder as loaded), and generation runs
    without it, as on the same weights without the field."""
    from transformers import AutoModelForSeq2SeqLM

    from tests.support.tiny_seq2seq import EOS as END
    from tests.support.tiny_seq2seq import PAD as PADDING
    from tests.support.tiny_seq2seq import VOCAB as WORDS
    from tests.support.tiny_seq2seq import tiny_seq2seq

    weights = tiny_seq2seq("bart").eval()
    generator = torch.Generator().manual_seed(7)
    lengths = torch.randint(2, 10, (10,), generator=generator).tolist()
    prompts = [[*torch.randint(3, WORDS, (length,), generator=generator).tolist(), END] for length in lengths]

    def alone(chosen, **explicit):
        with torch.no_grad():
            return [
                chosen.generate(input_ids=torch.tensor([p]), max_new_tokens=8, do_sample=False, **explicit)[
                    0
                ].tolist()
                for p in prompts
            ]

    configured = copy.deepcopy(weights)
    configured.generation_config.update(encoder_no_repeat_ngram_size=1)
    configured.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert loaded.generation_config.encoder_no_repeat_ngram_size == 1  # the folder's json carries it
    assert alone(loaded) != alone(weights)  # applied, it changes the output

    def ours(chosen):
        return generate_continuations(
            chosen, prompts, pad_id=PADDING, eos_id=END, runtime=runtime, batch_size=4, max_new_tokens=8
        ).continuations

    assert ours(loaded) == ours(weights)


# A scripted model (greedy next token of the last one) and prompts of other lengths than the one it shares a
# batch with: "a" walks a -> b -> </s> (c second after b); "c y" walks y -> <pad> -> c -> </s>; "x x x x"
# ends at once.
SCRIPTED_VOCAB = ("<pad>", "<s>", "</s>", "<unk>", "a", "b", "c", "x", "y")
SCRIPTED_NEXT = {"a": "b", "b": "</s>", "x": "</s>", "y": "<pad>", "<pad>": "c", "c": "</s>"}


@pytest.fixture
def padding_blind_penalty(monkeypatch):
    """The repetition penalty of transformers 5.0 (``pyproject.toml``'s lower bound), which reads every id of
    a row, its padding included (later 5.x skip a left padding)."""
    from transformers.generation import utils

    class PaddingBlind(utils.RepetitionPenaltyLogitsProcessor):
        def __init__(self, penalty, prompt_ignore_length=None):
            super().__init__(penalty)

    monkeypatch.setattr(utils, "RepetitionPenaltyLogitsProcessor", PaddingBlind)


@pytest.mark.parametrize(
    ("pad", "options", "prompts"),
    [
        # a model without a pad token pads with its EOS: a one-gram ban of the padded rows' EOS kept them from
        # ending where they end alone
        ("</s>", {"no_repeat_ngram_size": 1}, [["a"], ["x", "x", "x", "x"]]),
        ("</s>", {"no_repeat_ngram_size": 1, "num_beams": 2}, [["a"], ["x", "x", "x", "x"]]),
        # a padded row whose model writes its pad token: the padding's bigram (<pad>, c) banned the c after it
        ("<pad>", {"no_repeat_ngram_size": 2}, [["c", "y"], ["x", "x", "x", "x"]]),
        # a repetition penalty (of the padding's EOS: see the next test) beside the n-gram ban
        ("</s>", {"no_repeat_ngram_size": 2, "repetition_penalty": 1.5}, [["a"], ["x", "x", "x", "x"]]),
    ],
)
def test_controls_reading_the_prompt_see_no_padding(runtime, pad, options, prompts, padding_blind_penalty):
    """The repetition penalty and the n-gram ban read a row's ids: a left-padded row's padding is no part of
    them, so it generates what plain ``generate`` gives the prompt alone, whatever shares its batch."""
    model, tokenizer = scripted_llama(SCRIPTED_VOCAB, SCRIPTED_NEXT)
    vocab = tokenizer.get_vocab()
    with torch.no_grad():  # a second choice after "b": "c", which a penalised EOS would give way to
        model.lm_head.weight[vocab["c"], vocab["b"]] = 4.0
    ids = [[vocab[token] for token in prompt] for prompt in prompts]
    options = decoding_kwargs(**options)
    batched = generate_continuations(
        model, ids, pad_id=vocab[pad], eos_id=vocab["</s>"], runtime=runtime, max_new_tokens=6, **options
    ).continuations
    alone = generated_alone(
        model, ids, pad=vocab[pad], end=vocab["</s>"], max_new_tokens=6, eos_token_id=vocab["</s>"], **options
    )
    assert batched == alone and alone[0]


def test_a_repetition_penalty_does_not_penalise_the_padding(runtime, padding_blind_penalty):
    """A row padded with the EOS (a model without a pad token) under a repetition penalty: its EOS keeps its
    score, as the prompt alone gives it, whatever transformers' penalty makes of padding."""
    model, tokenizer = scripted_llama(SCRIPTED_VOCAB, SCRIPTED_NEXT)
    vocab = tokenizer.get_vocab()
    with torch.no_grad():
        model.lm_head.weight[vocab["c"], vocab["b"]] = 4.0
    ids = [[vocab["a"]], [vocab["x"]] * 4]
    options = decoding_kwargs(repetition_penalty=1.5)
    eos = vocab["</s>"]
    batched = generate_continuations(
        model, ids, pad_id=eos, eos_id=eos, runtime=runtime, max_new_tokens=6, **options
    ).continuations
    alone = generated_alone(model, ids, pad=eos, end=eos, max_new_tokens=6, eos_token_id=eos, **options)
    assert batched == alone == [[vocab["b"]], []]
