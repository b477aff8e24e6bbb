"""evaluate (loss only and with the analysis) against brute-force per-sample runs; generate_samples'
padding/seeds."""

import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.corpus.tokenizer_source import train_bpe_tokenizer
from fastlm.engine.config import parse_train_params
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.distributed.parallel import SingleProcess
from fastlm.engine.evaluate import evaluation
from fastlm.engine.evaluate.evaluation import EvalOptions, evaluate
from fastlm.engine.evaluate.generation import generate_samples
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from tests.support.allocations import vocab_wide_rows
from tests.support.project import catalog_dataset
from tests.support.tiny_llama import LINE_END_VOCAB, line_end_llama
from tests.support.tolerances import OTHER_FP32_KERNEL, OTHER_FP32_MODEL, reordered_sum_rtol

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

MAX_LENGTH = 64
WORDS = (
    "the cat dog bird sat ran on a mat log tree red blue small big quickly and then it saw"
    " one two three fish swam in sea"
).split()


def _texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 12)))) for _ in range(n)]


@pytest.fixture(scope="module")
def setup():
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=2))
    tokenizer = train_bpe_tokenizer(
        _texts(200, 0), vocab_size=300, min_frequency=1, model_max_length=MAX_LENGTH
    )
    rows = [tokenizer(text)["input_ids"] + [tokenizer.eos_token_id] for text in _texts(120, 1)]
    rows += [[tokenizer.eos_token_id]]  # a one-token sample: no target, never among the worst
    lengths = np.array([len(row) for row in rows])
    data = TokenSequences(np.concatenate(rows), np.concatenate([[0], np.cumsum(lengths)]))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_LENGTH,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
        use_cache=False,
    )
    model = LlamaForCausalLM(config)
    _fit(model, rows)  # a little training: non-trivial accuracy and mistakes
    return model.train(), tokenizer, data, runtime


def _fit(model, rows, steps: int = 12):
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
    for step in range(steps):
        batch = [torch.tensor(r) for r in rows[(step * 16) % 96 : (step * 16) % 96 + 16]]
        ids = torch.nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=0)
        mask = (torch.arange(ids.shape[1])[None] < torch.tensor([len(b) for b in batch])[:, None]).long()
        labels = ids.masked_fill(mask == 0, -100)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _params(mode: str):
    rows_or_samples = 4 if mode == "packed" else 16  # packed: rows of MAX_LENGTH tokens
    return parse_train_params(
        {"batching": {"mode": mode, "micro_batch_size": rows_or_samples}, "runtime": {"device": "cpu"}}
    )


# evaluate() computes the logits in packed or padded batches, another kernel layout than one sample alone, so
# they differ by up to OTHER_FP32_MODEL's atol: a top-1/top-5 decision closer than that may go either way.
TIE = OTHER_FP32_MODEL["atol"]


def _brute_force(model, data: TokenSequences):
    """Each sample alone, unpadded: per-sample mean loss, correct / top-5 counts and wrong pairs."""
    losses, correct, top5, pairs, targets, misses = {}, 0, 0, Counter(), 0, {}
    top1_margins, undecided = [], {}  # near-ties: where evaluate()'s batched logits may decide otherwise
    model.eval()
    with torch.no_grad():
        for index in range(len(data)):
            ids = torch.as_tensor(data[index], dtype=torch.int64)
            if ids.numel() < 2:
                continue
            logits = model(input_ids=ids[None]).logits[0, :-1].float()
            target = ids[1:]
            losses[index] = F.cross_entropy(logits, target).item()
            predicted = logits.argmax(-1)
            correct += int((predicted == target).sum())
            in_top5 = (logits.topk(5, dim=-1).indices == target[:, None]).any(-1)
            top6 = logits.topk(6, dim=-1).values
            top1_margins.append((top6[:, 0] - top6[:, 1]).min().item())
            rank = (logits > logits.gather(-1, target[:, None])).sum(-1)  # the target's rank, from 0
            near_tie = (top6[:, 4] - top6[:, 5] < TIE) & ((rank == 4) | (rank == 5))  # 5th or 6th: undecided
            undecided[index] = int(near_tie.sum())
            top5 += int(in_top5.sum())
            misses[index] = 1 - in_top5.float().mean().item()
            targets += target.numel()
            pairs.update((t, p) for t, p in zip(target.tolist(), predicted.tolist(), strict=True) if t != p)
    model.train()
    assert min(top1_margins) > TIE, "a top-1 near-tie in the fixture: the exact argmax counts need none"
    return losses, correct, top5, pairs, targets, misses, undecided


@pytest.fixture(scope="module")
def brute(setup):
    model, _, data, _ = setup
    return _brute_force(model, data)


@pytest.mark.parametrize(
    ("mode", "attn"),
    [("packed", "sdpa"), ("dynamic", "sdpa"), ("packed", "sdpa_varlen"), ("dynamic", "sdpa_varlen")],
)
def test_metrics_match_loop_evaluate_and_brute_force(setup, brute, mode, attn):
    """A varlen path gets one row of the batch's real tokens (``attention.inputs.without_padding``): the
    per-sample analysis reads that row's segments, not the collator's rows."""
    model, tokenizer, data, runtime = setup
    params = _params(mode)
    report = evaluate(
        model,
        data,
        params=params,
        runtime=runtime,
        max_length=MAX_LENGTH,
        attn=attn,
        tokenizer=tokenizer,
        options=EvalOptions(analysis=True, worst=7, pairs=15),
    )
    reference = _loss_only(model, data, tokenizer, runtime, params, attn=attn)
    assert (
        reference.wrong_pairs is None
        and reference.worst_samples is None
        and "accuracy" not in reference.metrics
    )
    metrics, reference = report.metrics, reference.metrics
    # the same batches, the loss summed by the analysis path or the plain one: a reordered sum over the tokens
    assert math.isclose(
        metrics["loss"], reference["loss"], rel_tol=reordered_sum_rtol(reference["target_tokens"])
    )
    assert math.isclose(
        metrics["perplexity"],
        reference["perplexity"],  # exp: the loss's error, relative
        rel_tol=2 * reordered_sum_rtol(reference["target_tokens"]),
    )
    assert metrics["target_tokens"] == reference["target_tokens"]
    assert model.training  # the mode is restored

    losses, correct, top5, pairs, targets, misses, undecided = brute
    assert metrics["target_tokens"] == targets and metrics["samples"] == len(data)
    assert round(metrics["accuracy"] * targets) == correct  # no top-1 near-tie (checked in the fixture)
    assert abs(round(metrics["top5_accuracy"] * targets) - top5) <= sum(undecided.values())
    assert 0 < correct < top5 < targets
    # the rate is every real token of the data over the measured time (each token counted once)
    assert (
        metrics["seconds"] > 0
        and round(metrics["real_tokens_per_s"] * metrics["seconds"]) == data.lengths.sum()
    )

    # Worst samples: the brute-force top losses, in the same order.
    expected = sorted(losses.items(), key=lambda item: -item[1])[:7]
    worst = report.worst_samples
    assert list(worst.columns[:4]) == ["sample", "loss", "length", "text"] and len(worst) == 7
    # a sample's mean loss in a packed/padded batch vs alone: another kernel layout, per sample (no averaging)
    np.testing.assert_allclose(worst["loss"].to_numpy(), [loss for _, loss in expected], **OTHER_FP32_KERNEL)
    for row in worst.itertuples():
        assert math.isclose(losses[row.sample], row.loss, rel_tol=OTHER_FP32_KERNEL["rtol"])
        # share of targets outside the top 5, near-ties aside
        slack = undecided[row.sample] / (row.length - 1)
        assert abs(misses[row.sample] - row.anomaly_score) < slack + 1e-6
        assert row.length == len(data[row.sample])
        assert row.text == tokenizer.decode(data[row.sample].tolist())

    # Wrong pairs: the brute-force Counter's most common pairs and counts.
    frame = report.wrong_pairs
    assert len(frame) == 15
    got = {
        (t, p): c for t, p, c in zip(frame["target_id"], frame["predicted_id"], frame["count"], strict=True)
    }
    assert all(pairs[key] == count for key, count in got.items())
    assert sorted(got.values(), reverse=True) == [count for _, count in pairs.most_common(15)]
    assert frame["count"].is_monotonic_decreasing
    np.testing.assert_allclose(frame["share_of_errors"], frame["count"] / sum(pairs.values()))
    first = frame.iloc[0]
    assert first["target"] == tokenizer.convert_ids_to_tokens(int(first["target_id"]))
    assert first["predicted_text"] == tokenizer.decode([int(first["predicted_id"])])


def test_the_top_k_metric_is_named_by_its_k(setup):
    """``report.top_k`` other than 5: the metric says which k it is (a ``top5_accuracy`` holding a top-2
    figure was compared with real top-5 figures); top-1 is the accuracy (no top-1 near-tie in the fixture)."""
    model, tokenizer, data, runtime = setup
    params = _params("packed")
    figures = {}
    for k in (1, 2, 5):
        metrics = evaluate(
            model,
            data,
            params=params,
            runtime=runtime,
            max_length=MAX_LENGTH,
            attn="sdpa",
            tokenizer=tokenizer,
            options=EvalOptions(analysis=True, top_k=k),
        ).metrics
        named = {key for key in metrics if key.startswith("top")}
        assert named == {f"top{k}_accuracy"}, named
        figures[k] = metrics[f"top{k}_accuracy"]
    assert figures[1] == metrics["accuracy"]  # the same logits: argmax and the top-1 agree without ties
    assert figures[1] < figures[2] < figures[5]


def test_unique_path_for_large_vocabularies_and_max_batches(setup, brute, monkeypatch):
    model, tokenizer, data, runtime = setup
    monkeypatch.setattr(evaluation, "DENSE_PAIR_TABLE_MAX", 10)  # force the torch.unique path
    monkeypatch.setattr(evaluation, "_COMPACT_EVERY", 100)  # and several merges
    report = _analysed(model, data, tokenizer, runtime, "packed", pairs=10)
    pairs = brute[3]
    got = dict(
        zip(
            zip(report.wrong_pairs["target_id"], report.wrong_pairs["predicted_id"], strict=True),
            report.wrong_pairs["count"],
            strict=True,
        )
    )
    assert all(pairs[key] == count for key, count in got.items())
    assert sorted(got.values(), reverse=True) == [count for _, count in pairs.most_common(10)]

    partial = _analysed(model, data, tokenizer, runtime, "dynamic", max_batches=2, worst=100)
    assert partial.metrics["samples"] == 32 and len(partial.worst_samples) <= 32
    assert math.isfinite(partial.metrics["loss"])


def test_error_pairs_and_worst_samples_write_line_ends_as_lf_and_read_back_row_for_row(tmp_path):
    """Tokens and texts with bare carriage returns and CRLFs (a model's own vocabulary): the report's tables
    get the split's line-end rule, so their CSVs (pandas quotes only the fields that hold a line feed) read
    back one row per row."""
    model, tokenizer = line_end_llama()
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=2))
    words = [LINE_END_VOCAB.index(word) for word in ("a", "b", "\r", "\r\n")]
    rows = [np.random.default_rng(row).choice(words, size=8) for row in range(6)]  # against its bigrams
    data = TokenSequences(np.concatenate(rows), np.arange(0, 8 * len(rows) + 1, 8))
    report = _analysed(model, data, tokenizer, runtime, "dynamic", worst=6, pairs=12)
    tables = {
        "error_pairs": (report.wrong_pairs, ["target", "predicted", "target_text", "predicted_text"]),
        "worst_samples": (report.worst_samples, ["text"]),
    }
    assert set(report.wrong_pairs["target_id"]) >= {words[2], words[3]}  # both line ends are among them
    for name, (table, columns) in tables.items():
        texts = [text for column in columns for text in table[column]]
        assert not any("\r" in text for text in texts), name
        catalog_dataset(name, tmp_path / f"{name}.csv").save(table)
        back = pd.read_csv(tmp_path / f"{name}.csv", keep_default_na=False)
        assert len(back) == len(table) and [text for column in columns for text in back[column]] == texts
    assert report.worst_samples["text"].str.contains("\n").all()


GREEDY = {"name": "greedy", "do_sample": False, "min_new_tokens": 8}  # no immediate EOS
SAMPLED = {"name": "sampled", "do_sample": True, "temperature": 0.8, "top_p": 0.95, "seed": 0}


def test_generation_left_pads_restores_state_and_is_reproducible(setup):
    model, tokenizer, _, runtime = setup
    prompts = ["", "the cat", "a big red dog ran on the mat and then"]
    kwargs = {"max_new_tokens": 8, "runtime": runtime}
    frame = generate_samples(model, tokenizer, prompts, settings=[GREEDY, SAMPLED], **kwargs)
    assert tokenizer.padding_side == "right" and model.training and not model.config.use_cache
    assert list(frame.columns) == ["prompt", "setting", "settings", "output"] and len(frame) == 6
    assert frame["setting"].tolist() == ["greedy"] * 3 + ["sampled"] * 3
    assert frame["settings"].tolist()[3] == "temperature=0.8, top_p=0.95"
    again = generate_samples(model, tokenizer, prompts, settings=[GREEDY, SAMPLED], **kwargs)
    assert again["output"].tolist() == frame["output"].tolist()  # greedy deterministic, sampling seeded
    alone = [
        generate_samples(model, tokenizer, [p], settings=[GREEDY], **kwargs)["output"][0] for p in prompts
    ]
    assert frame["output"].tolist()[:3] == alone  # left padding: batching changes nothing
    assert any(text for text in alone)
    reseeded = generate_samples(model, tokenizer, prompts, settings=[{**SAMPLED, "seed": 1}], **kwargs)
    assert reseeded["output"].tolist() != frame["output"].tolist()[3:]


def test_topk_anomaly_score_ranks_planted_logkey_anomalies_first():
    """Issue 18: after a short training on log-key sessions, the sessions with planted anomalies have the
    highest anomaly scores (share of next keys outside the top 5) among held-out sessions."""
    from demo_data.logkeys import VOCAB_SIZE, logkey_sessions

    from fastlm.corpus.pretokenized import id_tokenizer
    from fastlm.corpus.tokenization import encode_id_lists

    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=2))
    sessions = logkey_sessions(400, seed=3, anomaly_rate=0.05)
    eos = VOCAB_SIZE - 1
    tokenizer = id_tokenizer(VOCAB_SIZE, eos_id=eos, pad_id=eos, model_max_length=MAX_LENGTH)
    rows = [session["ids"] + [eos] for session in sessions]
    train, held_out = rows[:300], sessions[300:]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        max_position_embeddings=MAX_LENGTH,
        eos_token_id=eos,
        pad_token_id=eos,
        attn_implementation="sdpa",
        use_cache=False,
    )
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(25):
        batch = [torch.tensor(row) for row in train[(step * 16) % 288 : (step * 16) % 288 + 16]]
        ids = torch.nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=eos)
        mask = (torch.arange(ids.shape[1])[None] < torch.tensor([len(b) for b in batch])[:, None]).long()
        model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    tokens = encode_id_lists([session["ids"] for session in held_out], eos=eos, max_length=MAX_LENGTH)
    report = _analysed(
        model,
        TokenSequences(tokens.values, tokens.offsets),
        tokenizer,
        runtime,
        "dynamic",
        worst=len(held_out),
    )
    ranked = report.worst_samples.sort_values("anomaly_score", ascending=False, kind="stable")
    planted = {index for index, session in enumerate(held_out) if session["anomaly"]}
    assert len(planted) >= 3 and len(ranked) == len(held_out)
    assert set(ranked["sample"].head(len(planted))) == planted
    assert ranked["anomaly_score"].iloc[len(planted) - 1] > ranked["anomaly_score"].iloc[len(planted)]


def _analysed(model, data, tokenizer, runtime, mode: str, **options):
    """``evaluate`` with the error analysis, on the sdpa path, micro-batches of ``mode``."""
    return evaluate(
        model,
        data,
        tokenizer=tokenizer,
        params=_params(mode),
        runtime=runtime,
        max_length=MAX_LENGTH,
        attn="sdpa",
        options=EvalOptions(analysis=True, **options),
    )


def test_worst_samples_of_prompt_data_show_what_the_loss_scored(setup):
    """On prompt/response data a sample's loss covers its response and earlier answers only: the worst samples
    say which text that is (``scored_text``, the trained pieces in order) and how many tokens
    (``scored_tokens``), beside the whole sample's ``text``."""
    model, tokenizer, _, runtime = setup
    rows = [tokenizer(text)["input_ids"] + [tokenizer.eos_token_id] for text in _texts(40, 7)]
    rows = [row for row in rows if len(row) >= 6][:16]
    lengths = np.array([len(row) for row in rows])
    prompts = np.full(len(rows), 4)
    spans = [[1, 3] if i % 2 else [] for i in range(len(rows))]  # every other sample: an earlier answer
    data = TokenSequences(
        np.concatenate(rows),
        np.concatenate([[0], np.cumsum(lengths)]),
        prompts,
        answer_spans=(np.array(sum(spans, []), dtype=np.int64), np.cumsum([0] + [len(s) for s in spans])),
    )
    report = _analysed(model, data, tokenizer, runtime, "dynamic", worst=len(rows))
    worst = report.worst_samples
    assert len(worst) == len(rows)
    for row in worst.itertuples():
        ids = rows[row.sample]
        answer = [ids[1:3]] if row.sample % 2 else []
        assert row.scored_tokens == len(ids) - 4 + 2 * len(answer)
        pieces = [tokenizer.decode(piece) for piece in [*answer, ids[4:]]]
        assert row.scored_text == " ⋯ ".join(pieces) and row.text == tokenizer.decode(ids)


@pytest.mark.parametrize("mode", ["length_grouped", "packed"])
def test_worst_samples_of_an_encoder_decoder_say_what_its_loss_scored(mode):
    """An encoder-decoder model's loss covers its decoder row's targets: the tokenizer's head (BART: ``<s>``,
    put back at batch time), the response and its EOS; a chat's earlier answers are encoder input only. The
    worst samples' ``scored_tokens`` / ``scored_text`` say so, and over all samples they add up to the
    evaluation's ``target_tokens``."""
    from fastlm.corpus.prompts import tokenize_pairs
    from fastlm.engine.data.collators import TextEnds
    from tests.support.tiny_seq2seq import bart_style_tokenizer, tiny_seq2seq

    tokenizer = bart_style_tokenizer()
    texts = _texts(24, 9)
    tokens = tokenize_pairs(texts[:12], texts[12:], tokenizer, max_length=MAX_LENGTH, num_proc=1)
    plain = TokenSequences.from_arrow(tokens.to_arrow(), text_ends=TextEnds.of(tokenizer))
    # every other sample of 3 prompt tokens or more: an earlier answer
    spans = [[1, 3] if i % 2 and n >= 3 else [] for i, n in enumerate(plain.prompt_lengths)]
    assert any(spans)
    data = TokenSequences(
        plain.values,
        plain.offsets,
        plain.prompt_lengths,
        answer_spans=(np.array(sum(spans, []), dtype=np.int64), np.cumsum([0] + [len(s) for s in spans])),
        text_ends=plain.text_ends,
    )
    model = tiny_seq2seq("bart")
    model.resize_token_embeddings(len(tokenizer))
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    params = parse_train_params(
        {"batching": {"mode": mode, "micro_batch_size": 4}, "runtime": {"device": "cpu"}}
    )
    report = evaluate(
        model,
        data,
        params=params,
        runtime=runtime,
        tokenizer=tokenizer,
        max_length=MAX_LENGTH,
        attn="sdpa",
        options=EvalOptions(analysis=True, worst=len(data)),
    )
    worst = report.worst_samples
    assert len(worst) == len(data)
    for row in worst.itertuples():
        ids = data[row.sample].tolist()
        response = [0, *ids[int(data.prompt_lengths[row.sample]) :]]  # <s>, the response, </s>
        assert row.scored_tokens == len(response)
        assert row.scored_text == tokenizer.decode(response)
    assert worst["scored_tokens"].sum() == report.metrics["target_tokens"]


@pytest.mark.parametrize("mode", ["length_grouped", "packed"])
def test_an_encoder_decoders_one_token_sample_is_scored_and_every_worst_sample_is_named_right(mode):
    """An encoder-decoder sample of one token (an empty prompt, the response its EOS alone) still has
    targets: its decoder row is the tokenizer's head and that EOS. The worst samples resolved the i-th
    scored segment to the i-th sample of at least 2 tokens, a causal LM's rule: that sample was left out
    and every later one named as its neighbour (sample 0 twice, sample 3 missing, their losses swapped)."""
    from fastlm.corpus.prompts import tokenize_pairs
    from fastlm.engine.data.collators import TextEnds
    from tests.support.tiny_seq2seq import bart_style_tokenizer, tiny_seq2seq

    tokenizer = bart_style_tokenizer()
    texts = _texts(24, 9)
    tokens = tokenize_pairs(texts[:12], texts[12:], tokenizer, max_length=MAX_LENGTH, num_proc=1)
    plain = TokenSequences.from_arrow(tokens.to_arrow(), text_ends=TextEnds.of(tokenizer))
    rows = [plain[i].tolist() for i in range(len(plain))]
    prompts = list(plain.prompt_lengths)
    rows.insert(3, [tokenizer.eos_token_id])  # no prompt token, the response its EOS
    prompts.insert(3, 0)
    lengths = np.array([len(row) for row in rows])
    data = TokenSequences(
        np.concatenate(rows), np.concatenate([[0], np.cumsum(lengths)]), np.array(prompts),
        text_ends=plain.text_ends,
    )  # fmt: skip
    model = tiny_seq2seq("bart")
    model.resize_token_embeddings(len(tokenizer))
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    params = parse_train_params(
        {"batching": {"mode": mode, "micro_batch_size": 4}, "runtime": {"device": "cpu"}}
    )
    report = evaluate(
        model, data, params=params, runtime=runtime, tokenizer=tokenizer, max_length=MAX_LENGTH,
        attn="sdpa", options=EvalOptions(analysis=True, worst=len(data)),
    )  # fmt: skip
    worst = report.worst_samples
    assert sorted(worst["sample"]) == list(range(len(data)))  # each sample once, the one-token one too
    assert worst["scored_tokens"].sum() == report.metrics["target_tokens"]
    for row in worst.itertuples():  # each row's loss is its own sample's, evaluated alone
        alone = TokenSequences(np.asarray(rows[row.sample]), np.array([0, len(rows[row.sample])]),
                               np.array([prompts[row.sample]]), text_ends=plain.text_ends)  # fmt: skip
        own = evaluate(
            model, alone, params=params, runtime=runtime, tokenizer=tokenizer, max_length=MAX_LENGTH,
            attn="sdpa",
        )  # fmt: skip
        # fp32 sums of a few dozen per-token losses in another batch shape: agree to float rounding
        assert row.loss == pytest.approx(own.metrics["loss"], rel=1e-4), row.sample


def _out_of_memory_above(monkeypatch, rows: int) -> list[int]:
    """evaluate's forward fails like a CUDA out-of-memory error on a batch of more than ``rows`` rows; the
    rows of every batch it was given, in order."""
    real, seen = evaluation.forward_logits, []

    def limited(model, batch):
        seen.append(int(batch["input_ids"].shape[0]))
        if seen[-1] > rows:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, batch)

    monkeypatch.setattr(evaluation, "forward_logits", limited)
    return seen


def _loss_only(model, data, tokenizer, runtime, params, attn: str = "sdpa", **options):
    """``evaluate`` without the error analysis (the pad id given, no tokenizer)."""
    return evaluate(
        model,
        data,
        params=params,
        runtime=runtime,
        pad_id=tokenizer.pad_token_id,
        max_length=MAX_LENGTH,
        attn=attn,
        options=EvalOptions(**options),
    )


@pytest.mark.parametrize("max_batches", [None, 3], ids=["all", "max_batches"])
@pytest.mark.parametrize(("mode", "fits"), [("packed", 1), ("dynamic", 4)])
def test_an_evaluation_out_of_memory_halves_its_own_micro_batch_and_keeps_the_loss(
    setup, monkeypatch, caplog, mode, fits, max_batches
):
    """With train.batching.oom_backoff an evaluation that runs out of memory evaluates again with half the
    micro-batch (the configured batches cut in pieces: the same samples, also under max_batches), says so
    once per halving and reports the size it finished with, which a later evaluation starts from."""
    model, tokenizer, data, runtime = setup
    raw = _params(mode).model_dump()
    raw["batching"]["oom_backoff"] = True
    params = parse_train_params(raw)
    reference = _loss_only(model, data, tokenizer, runtime, params, max_batches=max_batches)
    assert reference.micro_batch_size == params.batching.micro_batch_size
    seen = _out_of_memory_above(monkeypatch, fits)
    with caplog.at_level("WARNING"):
        report = _loss_only(model, data, tokenizer, runtime, params, max_batches=max_batches)
    assert report.micro_batch_size == fits
    warnings = [r.getMessage() for r in caplog.records if "evaluating again" in r.getMessage()]
    assert len(warnings) == 2 and all("\n" not in line for line in warnings)
    # the same samples and targets; the loss is the same token-weighted mean, summed in other batches
    assert report.metrics["target_tokens"] == reference.metrics["target_tokens"]
    assert report.metrics["samples"] == reference.metrics["samples"]
    assert report.metrics["loss"] == pytest.approx(reference.metrics["loss"], rel=OTHER_FP32_MODEL["rtol"])
    seen.clear()
    later = _loss_only(
        model,
        data,
        tokenizer,
        runtime,
        params,
        max_batches=max_batches,
        micro_batch_size=report.micro_batch_size,
    )
    assert seen and max(seen) <= fits  # no failed attempt at the configured size again
    assert later.metrics["target_tokens"] == reference.metrics["target_tokens"]
    assert later.metrics["loss"] == pytest.approx(reference.metrics["loss"], rel=OTHER_FP32_MODEL["rtol"])


@pytest.mark.parametrize("micro", [3, 6])
@pytest.mark.parametrize("mode", ["packed", "dynamic"])
def test_an_evaluation_out_of_memory_reaches_micro_batch_one_from_a_size_of_fewer_rows_than_pieces(
    setup, monkeypatch, mode, micro
):
    """Micro-batch 3 (6; packed: rows of MAX_LENGTH tokens, as many rows) out of memory above 1 row: halved
    to 2 then 1 (3, 2, 1), each configured batch cut in 4 (8) pieces of one, the last empty and skipped.
    Was: refused at the last halving (`cannot cut a packed micro-batch of 3 row(s) ... in 4`, `... of 3
    samples in 4`) though micro-batch 1 was never tried. The same samples, targets and loss."""
    model, tokenizer, data, runtime = setup
    batching = {"mode": mode, "micro_batch_size": micro, "oom_backoff": True}
    if mode == "packed":
        batching["row_length"] = MAX_LENGTH
    params = parse_train_params({"batching": batching, "runtime": {"device": "cpu"}})
    reference = _loss_only(model, data, tokenizer, runtime, params)
    seen = _out_of_memory_above(monkeypatch, 1)
    report = _loss_only(model, data, tokenizer, runtime, params)
    assert report.micro_batch_size == 1 and seen[-1] == 1
    assert report.metrics["target_tokens"] == reference.metrics["target_tokens"]
    assert report.metrics["samples"] == reference.metrics["samples"] == len(data)
    assert report.metrics["loss"] == pytest.approx(reference.metrics["loss"], rel=OTHER_FP32_MODEL["rtol"])


def test_an_evaluation_out_of_memory_without_the_back_off_is_one_line(setup, monkeypatch):
    from fastlm.engine.train.backoff import OutOfMemory

    model, tokenizer, data, runtime = setup
    _out_of_memory_above(monkeypatch, 1)
    with pytest.raises(
        OutOfMemory, match=r"ran out of memory evaluating .* with micro_batch_size 4 .*oom_backoff: true"
    ) as caught:
        _loss_only(model, data, tokenizer, runtime, _params("packed"))
    assert "\n" not in str(caught.value)


class _RankOfTwo(SingleProcess):
    """Rank ``rank`` of a two-process evaluation, run here alone: its sums are its own (the test adds)."""

    world_size = 2

    def __init__(self, rank: int) -> None:
        self.rank = rank


@pytest.mark.parametrize("max_batches", [None, 3], ids=["all", "max_batches_3"])
@pytest.mark.parametrize("collective", [False, True], ids=["ddp", "fsdp"])
@pytest.mark.parametrize(("mode", "micro"), [("packed", 5), ("dynamic", 11), ("dynamic", 200)])
def test_two_ranks_evaluate_the_samples_one_process_does_in_the_same_number_of_forwards(
    setup, mode, micro, collective, max_batches
):
    """A validation split of an odd number of batches, evaluated by two ranks: their summed targets and loss
    are one process's (the same batches, summed in another order), also under ``train.eval_max_batches``
    (the first 3 batches of the split, as one process takes them), and under FSDP, whose forward is a
    collective, each rank runs as many forwards as the other. Was: FSDP's even shards left the last batch out
    (1540 of a split's 1587 targets in a 2-process run) and ``eval_max_batches`` 3 gave each rank 2 batches
    (4 in all: 321 targets where one process evaluated 227); a split of one batch (micro-batch 200) had a
    validation loss of NaN under FSDP."""
    model, tokenizer, data, runtime = setup
    batching = {"mode": mode, "micro_batch_size": micro}
    params = parse_train_params({"batching": batching, "runtime": {"device": "cpu"}})
    sampler, _ = evaluation.make_batching(params, data.lengths, pad_id=0, max_length=MAX_LENGTH, seed=0)
    batches = len(sampler.epoch_batches())
    assert batches % 2 == 1  # the split does not divide between the ranks

    def run(comm):
        forwards = []
        hook = model.register_forward_pre_hook(lambda module, args: forwards.append(1))
        try:
            options = EvalOptions(max_batches=max_batches, comm=comm, collective_forward=collective)
            report = evaluate(
                model,
                data,
                params=params,
                runtime=runtime,
                pad_id=tokenizer.pad_token_id,
                max_length=MAX_LENGTH,
                attn="sdpa",
                options=options,
            )
        finally:
            hook.remove()
        return report.metrics, len(forwards)

    (one, _), ranks = run(SingleProcess()), [run(_RankOfTwo(rank)) for rank in range(2)]
    targets = sum(metrics["target_tokens"] for metrics, _ in ranks)
    assert targets == one["target_tokens"]
    assert sum(metrics["samples"] for metrics, _ in ranks) == one["samples"]
    loss_sum = sum(
        metrics["loss"] * metrics["target_tokens"] for metrics, _ in ranks if metrics["target_tokens"]
    )
    evaluated = min(batches, max_batches or batches)
    assert loss_sum / targets == pytest.approx(one["loss"], rel=reordered_sum_rtol(evaluated))
    if collective:  # FSDP: every forward all-gathers the weights, so every rank runs the same number
        assert ranks[0][1] == ranks[1][1] == -(-evaluated // 2)


def test_the_perplexity_of_a_loss_above_50_is_its_exp_and_inf_past_the_float_range(setup):
    """Perplexity is exp(loss) as the Trainer's examples and the report's summaries compute it: a loss of
    ~60 gives ~1e26, one past ~709.78 inf. Was: capped at exp(50) = 5.18e21 whatever the loss, unsaid."""
    import copy

    model, tokenizer, data, runtime = setup
    params = _params("packed")
    losses = []
    for scale in (80.0, 2000.0):
        broken = copy.deepcopy(model)
        with torch.no_grad():
            broken.lm_head.weight.mul_(scale)
        metrics = _loss_only(broken, data, tokenizer, runtime, params, max_batches=2).metrics
        losses.append(metrics["loss"])
        if metrics["loss"] < 709.0:
            assert metrics["loss"] > 50.0 and math.isclose(metrics["perplexity"], math.exp(metrics["loss"]))
        else:
            assert metrics["perplexity"] == math.inf
    assert losses[0] < 709.0 < losses[1]


@pytest.mark.parametrize("mode", ["packed", "dynamic"])
def test_a_validation_with_the_fused_head_makes_no_tokens_by_vocab_logits(setup, mode, monkeypatch):
    """Training with ``train.loss.fused_linear`` holds no ``[tokens x vocab]`` logits; its validation (the
    loss only) computed them all, with their fp32 copy, in micro-batches of the training's size: 4 GB and
    more for 8k tokens of a 128k vocabulary, at every ``eval_every``. With the run's fused head
    (``EvalOptions.fused_head``) the validation's loss runs through it too: the plain loss (no label
    smoothing), no logits, no gradient buffer."""
    from fastlm.engine.model import linear_loss
    from fastlm.engine.model.accumulation import FusedHead

    model, tokenizer, data, runtime = setup
    params = _params(mode)
    vocab = model.config.vocab_size
    monkeypatch.setattr(linear_loss, "LINEAR_CE_CHUNK_ELEMENTS", 4 * vocab)  # chunks of 4 tokens
    plain = _loss_only(model, data, tokenizer, runtime, params).metrics
    reports = []

    def fused_pass():
        reports.append(
            _loss_only(model, data, tokenizer, runtime, params, fused_head=FusedHead(model.lm_head))
        )

    assert vocab_wide_rows(fused_pass, vocab) == 4  # the chunks' logits, never more rows
    fused = reports[0].metrics
    assert fused["target_tokens"] == plain["target_tokens"] and fused["samples"] == plain["samples"]
    # the head's matmul chunk by chunk vs whole, the sums reordered over the tokens
    assert math.isclose(fused["loss"], plain["loss"], rel_tol=reordered_sum_rtol(plain["target_tokens"]))
    assert vocab_wide_rows(lambda: _loss_only(model, data, tokenizer, runtime, params), vocab) > 4 * 16
    assert all(p.grad is None for p in model.parameters())
    assert model.lm_head.forward.__func__ is torch.nn.Linear.forward


def test_a_collective_forward_beyond_a_ranks_batches_makes_no_logits_with_the_fused_head(setup, monkeypatch):
    """Under FSDP a rank with one batch fewer runs one forward more (its result not counted, the weights'
    all-gather is a collective). With the run's fused head that forward returns the hidden states, as the
    counted ones do: no ``[tokens x vocab]`` logits in it either, and the rank's sums are its own batches'."""
    from fastlm.engine.model import linear_loss
    from fastlm.engine.model.accumulation import FusedHead

    model, tokenizer, data, runtime = setup
    params = parse_train_params({"batching": {"mode": "packed", "micro_batch_size": 5}})
    vocab = model.config.vocab_size
    monkeypatch.setattr(linear_loss, "LINEAR_CE_CHUNK_ELEMENTS", 4 * vocab)  # chunks of 4 tokens
    sampler, _ = evaluation.make_batching(params, data.lengths, pad_id=0, max_length=MAX_LENGTH, seed=0)
    assert len(sampler.epoch_batches()) % 2 == 1  # rank 1 has one batch fewer: one forward more

    def rank_one(fused: bool):
        forwards, reports = [], []
        hook = model.register_forward_pre_hook(lambda module, args: forwards.append(1))
        fused_head = FusedHead(model.lm_head) if fused else None

        def run():
            reports.append(
                _loss_only(
                    model,
                    data,
                    tokenizer,
                    runtime,
                    params,
                    comm=_RankOfTwo(1),
                    collective_forward=True,
                    fused_head=fused_head,
                )
            )

        try:
            rows = vocab_wide_rows(run, vocab)
        finally:
            hook.remove()
        return reports[0].metrics, len(forwards), rows

    plain, plain_forwards, plain_rows = rank_one(fused=False)
    fused, fused_forwards, fused_rows = rank_one(fused=True)
    assert fused_forwards == plain_forwards == -(-len(sampler.epoch_batches()) // 2)
    assert plain_rows > 4 * 16 and fused_rows == 4  # the chunks' logits only, the extra forward's none
    assert fused["target_tokens"] == plain["target_tokens"]
    assert math.isclose(fused["loss"], plain["loss"], rel_tol=reordered_sum_rtol(plain["target_tokens"]))
    assert model.lm_head.forward.__func__ is torch.nn.Linear.forward
