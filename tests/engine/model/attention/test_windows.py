"""Sliding-window (local) attention layers on packed rows (``attention.windows``): a packed sample longer than
its model's window sees the keys it sees alone (its window), on every path, whatever the layer mix.

Mistral, Gemma2/3, EXAONE 4, Qwen2 with ``use_sliding_window`` and GPT-OSS attend to the last
``sliding_window`` keys only, in all or some layers. The packed masks kept samples apart but not to their
windows: a packed sample longer than the window attended to all its earlier keys, a model the trained
weights were never run as (relative logit error 0.25-0.73 here against the sample alone, a window of 4
tokens)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fastlm.engine.data.collators import PackedCollator
from fastlm.engine.data.packing import TokenBudget
from fastlm.engine.model.attention.inputs import to_device
from fastlm.engine.model.attention.windows import FULL, SLIDING, enable_packed_windows, sliding_window
from fastlm.engine.model.loss import forward_logits
from tests.support.tiny_models import multimodal_gemma3
from tests.support.tolerances import OTHER_FP32_MODEL

VOCAB, PAD, EOS, WINDOW = 128, 0, 2, 4
LENGTHS = (12, 9, 15, 7, 3, 10)
SMALL = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "pad_token_id": PAD,
    "eos_token_id": EOS,
}


def _family(name: str, window: int | None = WINDOW):
    import transformers as t

    families = {
        "mistral": (t.MistralConfig, t.MistralForCausalLM, {}),  # every layer local, no layer types
        "gemma2": (t.Gemma2Config, t.Gemma2ForCausalLM, {"head_dim": 16}),  # local / global, softcapping
        "gemma3": (
            t.Gemma3TextConfig,
            t.Gemma3ForCausalLM,
            {"head_dim": 16, "layer_types": ["sliding_attention", "full_attention"]},
        ),
        "exaone4": (
            t.Exaone4Config,
            t.Exaone4ForCausalLM,
            {"layer_types": ["sliding_attention", "full_attention"]},
        ),
        "qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM, {"use_sliding_window": True, "max_window_layers": 0}),
    }
    torch.manual_seed(0)
    if name == "gemma3_multimodal":  # google/gemma-3-4b and larger: the class model_type gemma3 trains as
        text = {**SMALL, "head_dim": 16, "sliding_window": window, "layer_types": [SLIDING, FULL]}
        model = multimodal_gemma3(text).eval()
        model.config.use_cache = False
        return model
    config_class, model_class, extra = families[name]
    model = model_class(config_class(**SMALL, **extra, sliding_window=window)).eval()
    model.config.use_cache = False
    return model


def _samples() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [np.r_[rng.integers(3, VOCAB, size=n - 1), EOS] for n in LENGTHS]


def _path(model, attn: str) -> None:
    model.config._attn_implementation = attn
    model.config.get_text_config()._attn_implementation = attn  # a multimodal model's language model


def _alone(model, samples) -> torch.Tensor:
    """Each sample by itself (one row, no mask, no padding) on the eager path: transformers' own window."""
    _path(model, "eager")
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.as_tensor(ids)[None]).logits[0] for ids in samples])


def _packed(model, samples, attn: str) -> torch.Tensor:
    """The samples packed into rows by the engine's collator and run on ``attn`` with to_device's inputs."""
    collator = PackedCollator(
        pad_id=PAD, budget=TokenBudget(row_length=24, rows_per_batch=4), attention_mask_format="none"
    )
    host = collator([{"input_ids": ids} for ids in samples])
    _path(model, attn)
    batch = to_device(host, torch.device("cpu"), attn)
    with torch.no_grad():
        logits = forward_logits(model, batch)
    if logits.shape[0] == 1:  # varlen: one flattened row of the real tokens (and a padding tail)
        return logits[0, : sum(LENGTHS)]
    return logits[host["input_ids"] != PAD]


def _mean_loss_alone(model, samples) -> float:
    """The mean loss over every target token of the samples, each run alone (transformers' own loss)."""
    with torch.no_grad():
        losses = [
            model(input_ids=torch.as_tensor(ids)[None], labels=torch.as_tensor(ids)[None]).loss
            for ids in samples
        ]
    return sum(float(loss) * (len(ids) - 1) for loss, ids in zip(losses, samples, strict=True)) / sum(
        len(ids) - 1 for ids in samples
    )


# flex_attention's windowed BlockMask is compared with the dense one below, not run: on a CPU its kernel is
# inductor's, which the vector-less kernel set refuses and whose AVX2 build gave NaN rows for Gemma 3 with the
# windows and without them (torch 2.13); fastlm never trains flex on a CPU (no backward there), and the GPU
# kernel is checked by benchmarks/gpu_attention_check.py --family gemma3
PATHS = {
    "mistral": ["eager", "sdpa", "sdpa_varlen"],
    "gemma2": ["eager"],  # no SDPA path (softcapping); no varlen kernel either (below)
    "gemma3": ["eager", "sdpa", "sdpa_varlen"],
    "exaone4": ["eager", "sdpa", "sdpa_varlen"],
    "qwen2": ["eager", "sdpa", "sdpa_varlen"],
    "gemma3_multimodal": ["eager", "sdpa"],
}


@pytest.mark.kernels  # packed rows against each sample alone: another layout, compared with a tolerance
@pytest.mark.parametrize(("family", "attn"), [(f, a) for f, paths in PATHS.items() for a in paths])
def test_a_packed_sample_longer_than_the_window_sees_its_window_alone(family, attn):
    model = _family(family)
    samples = _samples()
    assert max(LENGTHS) > sliding_window(model.config) == WINDOW  # a multimodal one: its text config's
    alone = _alone(model, samples)
    enable_packed_windows(model, max_length=max(LENGTHS))
    packed = _packed(model, samples, attn)
    torch.testing.assert_close(packed, alone, **OTHER_FP32_MODEL)


@pytest.mark.kernels
def test_the_check_sees_a_window_that_is_not_kept():
    """The negative control: without the windows, the packed samples longer than the window differ."""
    model = _family("mistral")
    samples = _samples()
    alone, packed = _alone(model, samples), _packed(model, samples, "sdpa")
    assert not torch.allclose(packed, alone, **OTHER_FP32_MODEL)


def test_no_window_or_none_shorter_than_the_samples_changes_nothing():
    """No sample can be longer than the window (``max_length`` at most the window), or no window at all:
    nothing is installed, the packed masks stay the document-causal ones."""
    model = _family("mistral", window=16)
    assert not enable_packed_windows(model, max_length=16)
    assert not enable_packed_windows(_family("mistral", window=None), max_length=64)
    assert enable_packed_windows(model, max_length=17)


def _windowed_varlen_attn(calls):
    """A stand-in for torch 2.13's ``varlen_attn`` (CUDA only): causal attention per segment, limited to
    ``window_size[0] + 1`` keys as flash attention's left window is."""

    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1), enable_gqa=False):  # fmt: skip
        calls.append(window_size)
        left, right = window_size
        assert right == 0, "causal attention was not asked for"
        bounds, out = cu_seq_q.tolist(), []
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            q, k, v = (x[a:b].transpose(0, 1) for x in (query, key, value))  # [H, n, D]
            distance = torch.arange(b - a)[:, None] - torch.arange(b - a)[None, :]
            allowed = (distance >= 0) & ((distance <= left) if left >= 0 else True)
            out.append(
                torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=allowed, scale=scale, enable_gqa=enable_gqa
                ).transpose(0, 1)
            )
        return torch.cat(out)

    return varlen_attn


@pytest.mark.kernels
def test_torch_varlen_hands_each_local_layer_its_window(monkeypatch):
    """torch_varlen passes a local layer's window to the kernel (``window_size=(window - 1, 0)``) and the
    global layers' none; a torch whose varlen_attn has no ``window_size`` is refused, not run unwindowed."""
    from fastlm.engine.model.attention import kernels

    calls = []
    monkeypatch.setattr(kernels, "varlen_attn", _windowed_varlen_attn(calls))
    model = _family("gemma3")
    samples = _samples()
    alone = _alone(model, samples)
    enable_packed_windows(model, max_length=max(LENGTHS))
    torch.testing.assert_close(_packed(model, samples, "torch_varlen"), alone, **OTHER_FP32_MODEL)
    assert sorted(set(calls)) == [(-1, 0), (WINDOW - 1, 0)]

    def older(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        raise AssertionError("called without the window")

    monkeypatch.setattr(kernels, "varlen_attn", older)
    with pytest.raises(RuntimeError, match="no window_size for the model's sliding-window layers"):
        _packed(model, samples, "torch_varlen")


@pytest.mark.parametrize("attn", ["sdpa_varlen", "torch_varlen"])
def test_the_varlen_kernels_refuse_softcapping_rather_than_drop_it(attn, monkeypatch):
    """Gemma2 caps its attention logits (``attn_logit_softcapping``); the varlen kernels have no such term:
    they refuse, where they computed plain attention."""
    from fastlm.engine.model.attention import kernels

    monkeypatch.setattr(kernels, "varlen_attn", _windowed_varlen_attn([]))
    model = _family("gemma2", window=None)
    with pytest.raises(ValueError, match="no attention logit softcapping"):
        _packed(model, _samples(), attn)


@pytest.mark.kernels
def test_a_saved_local_attention_model_trains_and_is_evaluated_in_its_windows(tmp_path, sample_texts):
    """The build (training, tune, sweeps) and the evaluation (the report's model, loaded by the catalog, not
    built here) install the windows themselves: the packed evaluation's loss is the samples' loss alone."""
    import math

    from transformers import MistralConfig, MistralForCausalLM

    from fastlm.engine.config import parse_train_params
    from fastlm.engine.data.token_dataset import TokenSequences
    from fastlm.engine.evaluate.evaluation import evaluate
    from fastlm.engine.model.build import build_model
    from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
    from tests.support.tiny_llama import llama_style_tokenizer

    tokenizer = llama_style_tokenizer(sample_texts)
    config = {key: value for key, value in SMALL.items() if key != "vocab_size"}
    torch.manual_seed(0)
    MistralForCausalLM(
        MistralConfig(**config, vocab_size=len(tokenizer), sliding_window=WINDOW, initializer_range=0.5)
    ).save_pretrained(tmp_path / "mistral")
    tokenizer.save_pretrained(tmp_path / "mistral")
    params = parse_train_params(
        {
            "model": {"name_or_path": str(tmp_path / "mistral"), "attn_implementation": "sdpa"},
            "batching": {"mode": "packed", "micro_batch_size": 2, "row_length": 24},
            "runtime": {"device": "cpu", "precision": "fp32"},
            "checkpoint_dir": str(tmp_path / "checkpoints"),
        }
    )
    samples = _samples()
    built = build_model(params.model, tokenizer, max_length=max(LENGTHS), attn_implementation="sdpa").eval()
    alone = _alone(built, samples)
    torch.testing.assert_close(_packed(built, samples, "sdpa"), alone, **OTHER_FP32_MODEL)

    loaded = MistralForCausalLM.from_pretrained(tmp_path / "mistral", attn_implementation="sdpa")
    expected = _mean_loss_alone(loaded, samples)
    offsets = np.concatenate([[0], np.cumsum(LENGTHS)])
    result = evaluate(
        loaded,
        TokenSequences(np.concatenate(samples), offsets),
        params=params,
        runtime=setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1)),
        max_length=max(LENGTHS),
        attn="sdpa",
        pad_id=PAD,
    )
    assert math.isclose(result.metrics["loss"], expected, rel_tol=OTHER_FP32_MODEL["rtol"])


def _recurrent(name: str):
    """Models with layers that carry a state along the row (a convolution, linear attention, an SSM): a
    packed row runs them across its samples whatever the attention mask."""
    import transformers as t

    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "vocab_size": VOCAB}
    made = {
        "lfm2": lambda: t.Lfm2Config(
            **small, num_attention_heads=2, num_key_value_heads=1, layer_types=["conv", "full_attention"]
        ),
        "qwen3_next": lambda: t.Qwen3NextConfig(
            **small,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            layer_types=["linear_attention", "full_attention"],
            linear_num_value_heads=2,
            linear_num_key_heads=1,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_experts=2,
            num_experts_per_tok=1,
        ),  # fmt: skip
        "mamba": lambda: t.MambaConfig(hidden_size=32, num_hidden_layers=2, state_size=4, vocab_size=VOCAB),
        "xlstm": lambda: t.xLSTMConfig(hidden_size=32, num_blocks=2, num_heads=2, vocab_size=VOCAB),
        "bloom": lambda: t.BloomConfig(hidden_size=32, n_layer=2, n_head=2, vocab_size=VOCAB),
        "falcon_alibi": lambda: t.FalconConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, alibi=True, vocab_size=VOCAB
        ),
    }
    return made[name]()


@pytest.mark.parametrize("family", ["lfm2", "qwen3_next", "mamba", "xlstm", "bloom", "falcon_alibi"])
def test_layers_that_run_along_the_row_make_packed_rows_unavailable(family):
    """LFM2's convolutions and Qwen3-Next's linear attention ran across the samples of a packed row on every
    dense path (relative logit error 0.34 and 0.56 against each sample alone, exit 0); Mamba's state and
    BLOOM's ALiBi biases on the varlen path (0.15 and 0.0095); BLOOM and ALiBi Falcon failed with a traceback
    on the dense ones. xLSTM's cells (no layer types, no state-size attribute) went unrecognised."""
    import transformers as t

    from fastlm.engine.model.attention.windows import packing_leak

    reason = packing_leak(_recurrent(family))
    assert reason is not None and "across the samples" in reason
    for safe in ("mistral", "gemma2", "exaone4"):
        assert packing_leak(_family(safe).config) is None
    assert packing_leak(t.FalconConfig(alibi=False)) is None and packing_leak(t.OPTConfig()) is None
    if family == "lfm2":  # tune's ladder leaves packed rows out for it
        from transformers import Lfm2ForCausalLM

        from fastlm.engine.data.token_dataset import TokenSequences
        from fastlm.engine.train.tune import unavailable_modes

        data = TokenSequences(np.concatenate(_samples()), np.concatenate([[0], np.cumsum(LENGTHS)]))
        unavailable = unavailable_modes(Lfm2ForCausalLM(_recurrent(family)), data, "sdpa")
        assert unavailable("packed") == reason and unavailable("length_grouped") is None


@pytest.mark.kernels
def test_a_model_that_cannot_pack_trains_and_evaluates_on_padded_rows(tmp_path, caplog):
    """Asked for packed batches (the default), such a model trains length_grouped, said once, and its
    evaluation (the report's too) runs its samples on padded rows: the loss each sample has alone."""
    import math

    from transformers import Lfm2ForCausalLM

    from fastlm.engine.config import parse_train_params
    from fastlm.engine.data.token_dataset import TokenSequences
    from fastlm.engine.evaluate.evaluation import evaluate
    from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
    from fastlm.engine.train.loop import train

    config = _recurrent("lfm2")
    config.pad_token_id, config.eos_token_id, config.initializer_range = PAD, EOS, 0.5
    torch.manual_seed(0)
    model = Lfm2ForCausalLM(config)
    samples = _samples()
    offsets = np.concatenate([[0], np.cumsum(LENGTHS)])
    data = TokenSequences(np.concatenate(samples), offsets)
    params = parse_train_params(
        {
            "batching": {"mode": "packed", "micro_batch_size": 2, "row_length": 24},
            "runtime": {"device": "cpu", "precision": "fp32", "num_threads": 1},
            "max_steps": 1, "eval_every": None, "save_every": None, "quiet": True,
            "dataloader": {"num_workers": 0}, "checkpoint_dir": str(tmp_path / "checkpoints"),
        }
    )  # fmt: skip
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    model.eval()
    expected = _mean_loss_alone(model, samples)
    metrics = evaluate(
        model, data, params=params, runtime=runtime, max_length=15, attn="sdpa", pad_id=PAD
    ).metrics
    assert math.isclose(metrics["loss"], expected, rel_tol=OTHER_FP32_MODEL["rtol"])
    caplog.set_level("WARNING", logger="fastlm")
    result = train(
        model.train(), data, None, params=params, runtime=runtime, pad_id=PAD, max_length=15, attn="sdpa"
    )
    assert result.summary["batching"] == "length_grouped"
    said = [r.getMessage() for r in caplog.records if "packed is not available" in r.getMessage()]
    assert len(said) == 1 and "conv" in said[0]


@pytest.mark.kernels
def test_an_older_torch_runs_a_local_layer_whose_window_no_sample_reaches(monkeypatch):
    """torch 2.9-2.10's varlen_attn has no window_size: a run of Mistral (window 4096) whose samples are all
    shorter than its window trained there before; it still does (the window changes nothing), and only a
    sample longer than the window is refused."""
    from fastlm.engine.model.attention import kernels
    from tests.support.packed_attention import causal_attention

    def older(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        bounds = cu_seq_q.tolist()
        if key.shape[1] != query.shape[1]:  # no GQA in this torch: fastlm repeats the KV heads
            raise AssertionError("KV heads not expanded")
        return torch.cat(
            [
                causal_attention(query[a:b], key[a:b], value[a:b], None, True)
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)
            ]
        )

    monkeypatch.setattr(kernels, "varlen_attn", older)
    model = _family("mistral", window=64)
    samples = _samples()
    alone = _alone(model, samples)
    enable_packed_windows(model, max_length=max(LENGTHS))
    torch.testing.assert_close(_packed(model, samples, "torch_varlen"), alone, **OTHER_FP32_MODEL)


@pytest.mark.kernels
def test_a_multimodal_gemma3_trains_on_text(tmp_path):
    """google/gemma-3-4b and larger are Gemma3ForConditionalGeneration (model_type gemma3): their language
    model's sizes are in the text config, where the step's FLOPs are read from (the run stopped with an
    AttributeError traceback on the top-level config)."""
    from fastlm.engine.config import parse_train_params
    from fastlm.engine.data.token_dataset import TokenSequences
    from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
    from fastlm.engine.train.loop import train

    model = _family("gemma3_multimodal").train()
    enable_packed_windows(model, max_length=max(LENGTHS))
    samples = _samples()
    data = TokenSequences(np.concatenate(samples), np.concatenate([[0], np.cumsum(LENGTHS)]))
    params = parse_train_params(
        {
            "batching": {"mode": "packed", "micro_batch_size": 2, "row_length": 24},
            "runtime": {"device": "cpu", "precision": "fp32", "num_threads": 1},
            "max_steps": 2, "eval_every": 2, "save_every": None, "quiet": True,
            "dataloader": {"num_workers": 0}, "checkpoint_dir": str(tmp_path / "checkpoints"),
        }
    )  # fmt: skip
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    result = train(model, data, data, params=params, runtime=runtime, pad_id=PAD, max_length=15, attn="sdpa")
    assert result.summary["steps"] == 2 and math.isfinite(result.summary["final_val_loss"])
    assert result.summary["batching"] == "packed"


@pytest.mark.parametrize("family", ["gemma3_multimodal", "mistral"])
def test_generation_is_left_to_transformers_masks(family):
    """The windows' hook changes only the packed rows' masks: generation (a KV cache, left padding, one new
    query a step) gets transformers' own, so its tokens are those of the model without the hook (a multimodal
    Gemma 3, whose outer model hands its language model a mapping of masks, failed with a size mismatch)."""
    from fastlm.engine.evaluate.generation import generate_continuations
    from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime

    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    prompts = [list(ids[:-1]) for ids in _samples()[:3]]
    made = []
    for hooked in (False, True):
        model = _family(family)
        _path(model, "sdpa")
        if hooked:
            enable_packed_windows(model, max_length=max(LENGTHS))
        generated = generate_continuations(
            model, prompts, pad_id=PAD, eos_id=EOS, runtime=runtime, max_new_tokens=6
        )
        made.append(generated.continuations)
    assert made[0] == made[1]


def test_the_windowed_block_mask_keeps_the_pairs_the_windowed_dense_mask_keeps():
    """flex_attention's windowed BlockMask (its mask function, evaluated at every query and key) keeps exactly
    the pairs the dense windowed mask keeps: same document, causal, less than the window behind."""
    from fastlm.engine.model.attention.inputs import dense_mask, document_block_mask
    from fastlm.engine.model.attention.windows import limit_to_window

    sequence_ids = torch.tensor([[0] * 12 + [1] * 9 + [2] * 3, [0] * 15 + [1] * 7 + [2] * 2])
    dense = limit_to_window(dense_mask(sequence_ids, "bool"), WINDOW)
    block = limit_to_window(document_block_mask(sequence_ids), WINDOW)
    rows, length = sequence_ids.shape
    query, key = torch.arange(length)[:, None], torch.arange(length)[None, :]
    kept = torch.stack(
        [block.mask_mod(torch.tensor(row), torch.tensor(0), query, key) for row in range(rows)]
    )
    assert torch.equal(kept, dense[:, 0])
    assert block.seq_lengths == (length, length) and int(dense.sum()) < int(
        dense_mask(sequence_ids, "bool").sum()
    )
