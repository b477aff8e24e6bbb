"""Test-split generation against references: sample choice, prompt cut, scores, comparison and report
sections."""

import pandas as pd
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.corpus.prompts import prompt_token_ids
from fastlm.engine.evaluate.generation import generate_continuations
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.reporting.comparison import compare_runs
from fastlm.reporting.params import ReferenceParams
from fastlm.reporting.references import (
    PREDICTION_COLUMNS,
    describe_decoding,
    has_references,
    reference_pairs,
    score_test_generations,
)
from fastlm.reporting.report_document import ReportInputs, build_sections
from fastlm.reporting.rouge import rouge_scores
from tests.support.project import catalog_dataset
from tests.support.reporting import pair_frame, text_rows
from tests.support.tiny_llama import line_end_llama

GREEDY = {
    "num_beams": 1,
    "do_sample": False,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": None,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
}


@pytest.fixture(scope="module")
def model(bpe_tokenizer):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(bpe_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        pad_token_id=bpe_tokenizer.pad_token_id,
        eos_token_id=bpe_tokenizer.eos_token_id,
        attn_implementation="sdpa",
        use_cache=False,
    )
    return LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def runtime():
    return setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))


def test_reference_pairs_are_the_test_rows_capped_by_hash_whatever_the_row_order():
    frame = pair_frame()
    pairs = reference_pairs(frame, None)
    assert len(pairs) == 20 and list(pairs.columns) == ["sample", "prompt", "response"]
    assert pairs["sample"].tolist() == list(range(20))
    capped = reference_pairs(frame, 7)
    shuffled = reference_pairs(frame.sample(frac=1, random_state=1), 7)
    assert len(capped) == 7 and capped["sample"].is_monotonic_increasing
    assert set(capped["prompt"]) == set(shuffled["prompt"])  # the same samples, any row order
    assert has_references(frame) and not has_references(pd.DataFrame({"text": ["a"], "split": ["test"]}))


def test_describe_decoding_names_the_mode_and_what_is_on():
    assert describe_decoding(GREEDY, 64) == "greedy, max_new_tokens=64"
    beams = {**GREEDY, "num_beams": 4, "no_repeat_ngram_size": 3}
    assert describe_decoding(beams, 8) == "beam search, num_beams=4, no_repeat_ngram_size=3, max_new_tokens=8"
    sampled = {**GREEDY, "do_sample": True, "temperature": 0.7, "top_p": 0.9}
    assert describe_decoding(sampled, 8) == "sampling, temperature=0.7, top_p=0.9, max_new_tokens=8"


def test_scores_are_rouge_of_what_the_model_generates(model, bpe_tokenizer, runtime):
    pairs = reference_pairs(pair_frame(), 6)
    table, metrics = _scored(model, bpe_tokenizer, pairs, runtime, new=6, batch=4, max_length=320)
    assert list(table.columns) == PREDICTION_COLUMNS and len(table) == 6
    expected = []
    for prompt in pairs["prompt"]:
        ids = generate_continuations(
            model,
            [prompt_token_ids(bpe_tokenizer, prompt)],
            pad_id=0,
            eos_id=0,
            runtime=runtime,
            max_new_tokens=6,
        ).continuations[0]
        expected.append(bpe_tokenizer.decode(ids, skip_special_tokens=True).strip())
    assert table["prediction"].tolist() == expected
    assert table["reference"].tolist() == pairs["response"].tolist()
    per_sample, aggregate, kind = rouge_scores(expected, pairs["response"].tolist(), "auto")
    assert kind == metrics["rouge_tokenizer"] == "unicode"  # Hangul references
    assert table["rougeL_f1"].tolist() == per_sample["rougeL_f1"].tolist()
    assert {key: metrics[key] for key in aggregate} == aggregate
    assert metrics["rouge_samples"] == 6 and metrics["rouge_decoding"] == "greedy, max_new_tokens=6"
    assert (table["new_tokens"] <= 6).all() and metrics["generated_tokens_per_s"] > 0


def test_rouge_on_part_of_the_test_split_says_of_how_many_test_samples(model, bpe_tokenizer, runtime):
    """``report.references.max_samples`` below the test split's pairs: ROUGE is over a hash-selected part,
    recorded (``rouge_test_samples``) and said in the ROUGE section as the test evaluation says its
    ``report.eval_max_batches`` share. Was: "6 test samples generated ...", read as the test split's."""
    pairs = reference_pairs(pair_frame(), 6)
    _, metrics = _scored(model, bpe_tokenizer, pairs, runtime, new=2, batch=4, max_length=320)
    assert metrics["rouge_samples"] == 6 and metrics["rouge_test_samples"] == 20
    whole = pd.DataFrame({"sample": [0], "prompt": ["대화"], "response": ["배송"]})  # every test pair
    _, every = _scored(model, bpe_tokenizer, whole, runtime, new=2, batch=4, max_length=320)
    assert "rouge_test_samples" not in every
    predictions = pd.DataFrame(
        {"sample": [0], "prompt": ["p"], "reference": ["r"], "prediction": ["r"], "rouge1_f1": [1.0]}
    ).assign(rougeL_f1=1.0)
    sections = {s.heading: s for s in _sections({"loss": 2.0, **metrics}, predictions)}
    assert sections["ROUGE on the test split"].text.startswith(
        "6 of the 20 test samples (report.references.max_samples: hash-selected, the same for every run on "
        "this data) generated"
    )


def test_predictions_of_a_model_writing_carriage_returns_read_back_row_for_row(runtime, tmp_path):
    """A model that writes a bare carriage return and a CRLF: its predictions get the split's line-end rule,
    so reference_predictions.csv (pandas quotes only the fields that hold a line feed) reads back one row per
    sample."""
    model, tokenizer = line_end_llama()
    pairs = pd.DataFrame({"sample": [0, 1], "prompt": ["c", "b"], "response": ["a b", "c a"]})
    table, metrics = _scored(model, tokenizer, pairs, runtime, new=4, batch=4, max_length=32)
    assert table["prediction"].tolist() == ["a\nb", "c\na"]
    csv = tmp_path / "reference_predictions.csv"
    catalog_dataset("reference_predictions", csv).save(table)
    back = catalog_dataset("reference_predictions", csv).load()
    assert (
        back["prediction"].tolist() == table["prediction"].tolist() and len(back) == metrics["rouge_samples"]
    )


def test_long_prompts_are_cut_like_training_cuts_them(model, bpe_tokenizer, runtime):
    pairs = pd.DataFrame(
        {"sample": [0, 1], "prompt": ["가격 대비 " * 40 + "배송", "짧은 질문"], "response": ["좋아요", "네"]}
    )
    full = [len(prompt_token_ids(bpe_tokenizer, p)) for p in pairs["prompt"]]
    table, _ = _scored(model, bpe_tokenizer, pairs, runtime, new=10, batch=2, max_length=48)
    assert full[0] > 47 and table["prompt_tokens"].tolist() == [47 - 10, full[1]]


def test_comparison_shows_test_loss_and_rouge_only_when_logged():
    runs = pd.DataFrame(
        {
            "run_id": ["a" * 32, "b" * 32],
            "start_time": pd.to_datetime(["2025-01-02", "2025-01-01"]),
            "end_time": pd.to_datetime(["2025-01-02 00:01", "2025-01-01 00:02"]),
            "metrics.train/real_tokens_per_s": [100.0, 90.0],
            "params.train.lr": ["1e-3", "1e-3"],
        }
    )
    assert not any(column.startswith("test_") for column in compare_runs(runs).columns)
    runs["metrics.test_rouge1"] = [0.4, None]
    runs["metrics.test_loss"] = [2.0, 2.5]
    table = compare_runs(runs)
    assert table["test_rouge1"].tolist()[0] == 0.4 and pd.isna(table["test_rouge1"].tolist()[1])
    assert table["test_loss"].tolist() == [2.0, 2.5] and "test_rouge2" not in table


def test_the_models_forced_and_banned_tokens_are_recorded_with_the_decoding(model, bpe_tokenizer, runtime):
    """A model folder's token rules kept at generation (``generation.KEPT_FROM_MODEL``: a banned token) are
    recorded beside the decoding the references were generated with, as the model's generation_config holds
    them, and the generations are those rules' (the banned token never appears). Was: said in the log only;
    the record named plain greedy."""
    import copy

    from fastlm.engine.evaluate.generation import KEPT_FROM_MODEL

    pairs = reference_pairs(pair_frame(), 6)
    table, plain = _scored(model, bpe_tokenizer, pairs, runtime, new=6, batch=4, max_length=320)
    assert "rouge_model_token_rules" not in plain
    first = prompt_token_ids(bpe_tokenizer, pairs["prompt"].iloc[0])
    often = generate_continuations(model, [first], pad_id=0, eos_id=0, runtime=runtime, max_new_tokens=6)
    banned = copy.deepcopy(model)
    banned.generation_config.update(bad_words_ids=[[often.continuations[0][0]]], suppress_tokens=[7])
    _, metrics = _scored(banned, bpe_tokenizer, pairs, runtime, new=6, batch=4, max_length=320)
    config = banned.generation_config
    recorded = {key: getattr(config, key) for key in KEPT_FROM_MODEL if getattr(config, key) is not None}
    assert metrics["rouge_model_token_rules"] == recorded and len(recorded) == 2
    sections = {s.heading: s for s in _sections(metrics, table)}
    assert all(
        f"{key}={value}" in sections["ROUGE on the test split"].text for key, value in recorded.items()
    )


def _sections(test_metrics, predictions):
    history = pd.DataFrame(
        {
            "step": [1, 2],
            "loss": [3.0, 2.0],
            "real_tokens_per_s": [10.0, 11.0],
            "lr": 1e-3,
            "tokens_per_s": 12.0,
            "peak_memory_mb": 100.0,
        }
    )
    efficiency = pd.DataFrame({"real_tokens_per_s": [10.5]})
    return build_sections(
        ReportInputs(
            summary={},
            history=history,
            eval_history=pd.DataFrame(),
            training=pd.DataFrame(),
            efficiency=efficiency,
            diagnosis={},
            test_metrics=test_metrics,
            error_pairs=pd.DataFrame(),
            worst=pd.DataFrame(),
            generations=pd.DataFrame(),
            runs=pd.DataFrame(),
            predictions=predictions,
        )
    )


def test_report_has_rouge_sections_only_with_predictions():
    plain = [s.heading for s in _sections({"loss": 2.0}, pd.DataFrame(columns=PREDICTION_COLUMNS))]
    assert not any("ROUGE" in heading or "references" in heading for heading in plain)
    predictions = pd.DataFrame(
        {
            "sample": [0],
            "prompt": ["x" * 300],
            "reference": ["배송 빨라요"],
            "prediction": ["배송 느려요"],
            "prompt_tokens": [5],
            "new_tokens": [3],
            "rouge1_f1": [0.5],
            "rougeL_f1": [0.5],
        }
    )
    metrics = {
        "loss": 2.0,
        "rouge1": 0.5,
        "rouge2": 0.0,
        "rougeL": 0.5,
        "rouge_samples": 1,
        "rouge_decoding": "greedy, max_new_tokens=8",
        "rouge_tokenizer": "unicode",
        "generated_tokens_per_s": 50.0,
    }
    metrics.update({f"{r}_{m}": 0.5 for r in ("rouge1", "rouge2", "rougeL") for m in ("precision", "recall")})
    sections = {s.heading: s for s in _sections(metrics, predictions)}
    scores = sections["ROUGE on the test split"]
    assert scores.table["F1"].tolist() == [0.5, 0.0, 0.5] and "'unicode'" in scores.text
    samples = sections["Generations against references"].table
    assert (
        samples["prediction"].tolist() == ["배송 느려요"]
        and samples["prompt (end)"].iloc[0] == "…" + "x" * 160
    )


def _scored(model, tokenizer, pairs, runtime, *, new: int, batch: int, max_length: int, chat=None):
    """The reference generations greedy, ``new`` tokens each, and their ROUGE (the Unicode rule: auto);
    ``chat``: the chat template variables of chat data."""
    references = ReferenceParams(
        **GREEDY, max_new_tokens=new, batch_size=batch, seed=0, rouge_tokenizer="auto"
    )
    return score_test_generations(
        model,
        tokenizer,
        pairs,
        references=references,
        max_length=max_length,
        runtime=runtime,
        chat_variables=chat,
    )


def test_prompts_leave_the_new_tokens_room_in_the_models_positions_as_predict_leaves_them(
    bpe_tokenizer, runtime
):
    """A model trained at its whole length (GPT-2, learnt positions, ``n_positions`` = ``split.max_length``)
    with ``references.max_new_tokens`` over half of it: the references kept ``prompt_budget``'s half row of
    prompt, so prompt and generation ran past the model's positions (an IndexError deep in ``generate``) where
    predict gives the same row ``input_limit``'s tokens; they now give it the same ids."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from fastlm.reporting.predict_inputs import input_limit

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(bpe_tokenizer),
        n_positions=48,
        n_embd=32,
        n_layer=2,
        n_head=4,
        eos_token_id=bpe_tokenizer.eos_token_id,
        bos_token_id=bpe_tokenizer.eos_token_id,
    )
    model = GPT2LMHeadModel(config).eval()
    prompts = ["가격 대비 " * 40 + "배송", "짧은 질문"]
    pairs = pd.DataFrame({"sample": [0, 1], "prompt": prompts, "response": ["좋아요", "네"]})
    table, _ = _scored(model, bpe_tokenizer, pairs, runtime, new=30, batch=2, max_length=48)
    limit = input_limit(model, max_new_tokens=30, max_input_tokens=None, trained_length=48)
    rows = text_rows(prompts, bpe_tokenizer, limit=limit)
    assert limit == 48 - 30 and table["prompt_tokens"].tolist() == [len(ids) for ids in rows["ids"]]
    assert (table["prompt_tokens"] + table["new_tokens"] <= 48).all()


def test_test_samples_answered_by_a_call_are_scored_by_their_calls(runtime):
    """Chat data whose test answers call tools: ROUGE alone scored a call's JSON as text, and a tokenizer
    marking the call markup special lost it from the prediction (never matching the reference's). The
    prediction keeps the markup; each sample's calls are compared with the reference's, in the template's
    call format: the same functions (names), the same calls (arguments compared as JSON), and a call where
    the reference answers in text (spurious)."""
    from tests.support.tiny_llama import calling_llama

    model, tokenizer = calling_llama()
    call = '<tool_call>{{"name": "get_weather", "arguments": {{"city": "{}"}}}}</tool_call>'
    pairs = pd.DataFrame(
        {
            "sample": [0, 1, 2, 3],
            "prompt": ["ask", "ask", "hi", "ask"],
            "response": [call.format("서울"), call.format("부산"), "sunny", "맑아요"],
        }
    )
    table, metrics = _scored(model, tokenizer, pairs, runtime, new=12, batch=4, max_length=32, chat={})
    assert (
        table["prediction"][0] == '<tool_call>{"name":"get_weather","arguments":{"city":"서울"}}</tool_call>'
    )
    assert table["call_match"].tolist() == ["exact", "name", "", "spurious"]
    assert (metrics["tool_call_samples"], metrics["tool_call_name_accuracy"]) == (2, 1.0)
    assert (metrics["tool_call_exact_match"], metrics["tool_call_spurious"]) == (0.5, 0.5)
    plain, plain_metrics = _scored(model, tokenizer, pairs.iloc[2:3], runtime, new=12, batch=4, max_length=32)
    assert "call_match" not in plain and "tool_call_samples" not in plain_metrics  # not chat data: as before
    sections = {section.heading: section for section in _sections(metrics, table)}
    said = sections["ROUGE on the test split"].text
    assert "2 of them answer with a tool call: the same functions in 100.0%, the same calls in 50.0%" in said
    assert "50.0% of the 2 answered in text were predicted as calls" in said
    assert sections["Generations against references"].table["call"].tolist() == table["call_match"].tolist()


def test_answers_whose_calls_stopped_at_max_new_tokens_are_counted_and_said_with_the_fix(runtime):
    """Test answers that call a tool, generated with fewer new tokens than a call takes (quick mode's 32 for
    a 33-token call): every prediction is call markup cut before its JSON ends, scored as no match. The
    scores count those answers (``tool_call_unread``, ``tool_call_unread_at_limit``), and the report's
    ROUGE section says the scores miss them with the fix. (The section said "the same functions in 0.0%"
    of a model whose every answer began the right call, and nothing else.)"""
    from tests.support.tiny_llama import calling_llama

    model, tokenizer = calling_llama()
    call = '<tool_call>{{"name": "get_weather", "arguments": {{"city": "{}"}}}}</tool_call>'
    pairs = pd.DataFrame(
        {
            "sample": [0, 1, 2],
            "prompt": ["ask", "ask", "hi"],
            "response": [call.format("서울"), call.format("부산"), "sunny"],
        }
    )
    whole, whole_metrics = _scored(model, tokenizer, pairs, runtime, new=12, batch=4, max_length=32, chat={})
    cut, metrics = _scored(model, tokenizer, pairs, runtime, new=4, batch=4, max_length=32, chat={})
    unread = cut["call_match"] == "unread"
    assert unread.sum() == metrics["tool_call_samples"] and (cut["new_tokens"][unread] == 4).all()
    assert (metrics["tool_call_unread"], metrics["tool_call_unread_at_limit"]) == (unread.sum(), unread.sum())
    assert (whole_metrics["tool_call_unread"], whole_metrics["tool_call_unread_at_limit"]) == (0, 0)
    said = {section.heading: section for section in _sections(metrics, cut)}["ROUGE on the test split"].text
    assert f"{unread.sum()} of them do not read as calls" in said, said
    assert "report.references.max_new_tokens" in said and "max_new_tokens=4" in said, said
    said_whole = {s.heading: s for s in _sections(whole_metrics, whole)}["ROUGE on the test split"].text
    assert "do not read as calls" not in said_whole


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_an_encoder_decoders_long_prompt_keeps_the_end_training_kept(kind):
    """An encoder-decoder's prompt longer than its budget: the split cut its start (the end kept, a leading
    BOS kept, as for a decoder-only model; not the start as Hugging Face's summarization recipe keeps), so
    the report's reference generations and predict give the model the same ids its training rows' encoder
    saw: the split's own tokenization and the encoder rows training builds from it are the reference."""
    from fastlm.corpus.prompts import tokenize_pairs
    from fastlm.engine.data.collators import TextEnds, seq2seq_sides
    from fastlm.engine.evaluate.generation import encoder_inputs
    from fastlm.reporting.predict_inputs import input_limit
    from fastlm.reporting.references import generation_prompts
    from tests.support.tiny_seq2seq import bart_style_tokenizer, tiny_seq2seq

    tokenizer = bart_style_tokenizer(bos_before_text=kind == "bart")
    model = tiny_seq2seq(kind)
    prompt = "summarize please " * 3 + "the dialogue " * 25 + "a short summary of it"
    response = "a short summary"
    max_length = 40
    tokens = tokenize_pairs([prompt], [response], tokenizer, max_length=max_length, num_proc=1)
    kept = int(tokens.prompt_lengths[0])
    sample = {"input_ids": tokens.values[: tokens.offsets[1]], "prompt_length": kept}
    trained = seq2seq_sides([sample], 2, TextEnds.of(tokenizer))[0][0].tolist()
    full = prompt_token_ids(tokenizer, prompt)
    assert tokens.truncated[0] and kept < len(full) and trained[kept - 3 : kept] == full[-3:]
    new = max_length - 1 - kept  # what the training row left beside the prompt: the same prompt budget
    asked = generation_prompts(tokenizer, [prompt], model=model, max_length=max_length, max_new_tokens=new)
    limit = input_limit(model, max_new_tokens=new, max_input_tokens=None, trained_length=max_length)
    rows = text_rows([prompt], tokenizer, limit=limit)
    assert encoder_inputs(model, asked, tokenizer) == [trained]
    assert encoder_inputs(model, list(rows["ids"]), tokenizer) == [trained]
    assert trained[:kept] != full[:kept]  # the start-kept cut is another prompt: the test tells them apart


def test_the_report_says_how_many_references_have_no_rouge_tokens_and_that_the_means_count_them():
    """A punctuation-only reference scores 0 whatever the model writes: the ROUGE section says how many
    there are, that the means count them as 0 (as rouge-score's aggregator does) and the F1 over the
    others."""
    predictions = pd.DataFrame(
        {
            "sample": [0, 1],
            "prompt": ["a", "b"],
            "reference": ["the cat", "!!!"],
            "prediction": ["the cat", "!!!"],
            "prompt_tokens": [1, 1],
            "new_tokens": [2, 1],
            "rouge1_f1": [1.0, 0.0],
            "rougeL_f1": [1.0, 0.0],
        }
    )
    metrics = {
        "loss": 2.0,
        "rouge_samples": 2,
        "rouge_decoding": "greedy, max_new_tokens=8",
        "rouge_tokenizer": "default",
        "generated_tokens_per_s": 50.0,
        "rouge_tokenless_references": 1,
    }
    _, aggregate, _ = rouge_scores(predictions["prediction"].tolist(), predictions["reference"].tolist())
    metrics.update(aggregate)
    assert metrics["rouge1"] == pytest.approx(0.5) and metrics["rouge1_scorable"] == pytest.approx(1.0)
    text = {s.heading: s for s in _sections(metrics, predictions)}["ROUGE on the test split"].text
    assert "1 of the 2 reference responses has no tokens under tokenizer 'default'" in text
    assert "counted in the means as 0" in text
    assert "ROUGE-1 / ROUGE-2 / ROUGE-L F1 over the other 1: 1 / 1 / 1" in text


@pytest.mark.parametrize("forced_bos", [False, True])
def test_an_encoder_decoder_is_asked_every_new_token_its_decoder_positions_hold(bpe_tokenizer, forced_bos):
    """A BART of 32 positions generates 32 new tokens (31 after a forced BOS): the decoder is fed its start
    token, the forced BOS and every new token but the last, which is never fed back. One more runs past the
    last position (IndexError from the position embedding) and is refused in one line. Was: 32 refused as
    needing 33 positions (31 with a forced BOS as needing 33), an off-by-one that refused what generates."""

    from fastlm.errors import ConfigError
    from fastlm.reporting.predict_inputs import input_limit

    eos = bpe_tokenizer.eos_token_id
    model = _bart_of_32_positions(bpe_tokenizer, forced_eos=False)
    model.generation_config.forced_bos_token_id = (eos + 1) % len(bpe_tokenizer) if forced_bos else None
    most = 32 - forced_bos
    prompt = torch.tensor([[5, 6, 7]])

    def generate(new: int) -> torch.Tensor:  # every row runs its whole length: no EOS ends it sooner
        return model.generate(prompt, max_new_tokens=new + forced_bos, min_new_tokens=new + forced_bos)

    assert generate(most).shape[1] == 1 + forced_bos + most  # the start, a forced BOS, the new tokens
    assert input_limit(model, max_new_tokens=most, max_input_tokens=None) == 31
    with pytest.raises(IndexError):
        generate(most + 1)
    with pytest.raises(ConfigError, match=f"predict.max_new_tokens = {most + 1} and") as raised:
        input_limit(model, max_new_tokens=most + 1, max_input_tokens=None)
    assert f"need {most + 1 + forced_bos} decoder positions (all but the last new token" in str(raised.value)
    assert f"lower predict.max_new_tokens to at most {most}." in str(raised.value)


@pytest.mark.parametrize("forced_bos", [False, True])
def test_an_encoder_decoder_forcing_its_eos_is_asked_what_its_decoder_positions_hold_beside_it(
    bpe_tokenizer, forced_bos
):
    """A BART of 32 positions that forces its EOS at the last position (``forced_eos_token_id``, BartConfig's
    default) generates that EOS after the new tokens asked for, every one of them fed back: 31 new tokens
    fit (30 beside a forced BOS), and one more is refused in one line, not an IndexError from the position
    embedding part way through the rows."""

    from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
    from fastlm.errors import ConfigError
    from fastlm.reporting.predict_inputs import input_limit

    eos = bpe_tokenizer.eos_token_id
    model = _bart_of_32_positions(bpe_tokenizer, forced_eos=True)
    with torch.no_grad():
        model.final_logits_bias[0, eos] = -1e4  # no row ends before the limit
    assert model.generation_config.forced_eos_token_id == eos
    model.generation_config.forced_bos_token_id = (eos + 1) % len(bpe_tokenizer) if forced_bos else None
    most = 31 - forced_bos
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    made = generate_continuations(
        model, [[5, 6, 7, eos]], pad_id=bpe_tokenizer.pad_token_id, eos_id=eos, runtime=runtime,
        max_new_tokens=most,
    )  # fmt: skip
    assert made.new_tokens == most
    assert input_limit(model, max_new_tokens=most, max_input_tokens=None) == 31
    with pytest.raises(IndexError):
        generate_continuations(
            model, [[5, 6, 7, eos]], pad_id=bpe_tokenizer.pad_token_id, eos_id=eos, runtime=runtime,
            max_new_tokens=most + 1,
        )  # fmt: skip
    with pytest.raises(ConfigError, match=f"predict.max_new_tokens = {most + 1} and") as raised:
        input_limit(model, max_new_tokens=most + 1, max_input_tokens=None)
    assert f"need {most + 2 + forced_bos} decoder positions" in str(raised.value)
    assert "the forced EOS after them" in str(raised.value)
    assert f"lower predict.max_new_tokens to at most {most}." in str(raised.value)


def _bart_of_32_positions(tokenizer, *, forced_eos: bool):
    """A small BART of 32 positions starting its decoder at the EOS, no forced BOS, forcing its EOS at the
    last position where ``forced_eos`` (BartConfig's default)."""
    from transformers import BartConfig, BartForConditionalGeneration

    from tests.support.tiny_seq2seq import SMALL_BART_LAYERS

    eos = tokenizer.eos_token_id
    torch.manual_seed(0)
    return BartForConditionalGeneration(
        BartConfig(
            vocab_size=len(tokenizer),
            **{**SMALL_BART_LAYERS, "max_position_embeddings": 32},
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos,
            bos_token_id=eos,
            decoder_start_token_id=eos,
            forced_bos_token_id=None,
            forced_eos_token_id=eos if forced_eos else None,
        )
    ).eval()
