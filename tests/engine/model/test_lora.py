"""LoRA on a local tiny Llama checkpoint (saved with save_pretrained, no hub): adapters only train, the
completion-only packed path is kept, checkpoints resume, the adapter saves and merges to the same logits."""

import io
import json
import logging
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from demo_data.texts import make_texts

from fastlm.corpus.prompts import tokenize_pairs
from fastlm.engine.checkpoint.discovery import latest_checkpoint
from fastlm.engine.config import parse_train_params
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.model import lora
from fastlm.engine.model import loss as loss_fns
from fastlm.engine.model.build import build_model
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.train.loop import train
from fastlm.engine.train.optim import make_adamw
from fastlm.errors import ConfigError, find_user_error
from tests.support import background
from tests.support.packages import hide_package
from tests.support.tiny_llama import llama_style_tokenizer, save_tiny_llama
from tests.support.tolerances import (
    BF16_VS_FP32,
    MERGED_ADAPTER_ATOL,
    OTHER_FP32_MODEL,
    TRAINED_FP32_LOSS_REL,
    reordered_sum_rtol,
)

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

MAX_LENGTH = 48
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def texts():
    return make_texts(240, seed=5, profile="demo")


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, texts):
    return save_tiny_llama(tmp_path_factory.mktemp("base"), llama_style_tokenizer(texts))


@pytest.fixture(scope="module")
def tokenizer(base_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_dir, local_files_only=True)


@pytest.fixture(scope="module")
def pairs(texts, tokenizer) -> TokenSequences:
    prompts = [f"{a}\n\nSummary:" for a in texts[:120]]
    tokens = tokenize_pairs(prompts, texts[120:240], tokenizer, max_length=MAX_LENGTH)
    return TokenSequences(tokens.values, tokens.offsets, tokens.prompt_lengths)


def model_params(base_dir, **lora_overrides):
    return {
        "name_or_path": str(base_dir),
        "lora": {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0, **lora_overrides},
    }


def train_params(tmp_path, base_dir, **overrides):
    raw = {
        "model": model_params(base_dir),
        "batching": {"mode": "packed", "micro_batch_size": 4},
        "optimizer": {"lr": 2e-2, "warmup_steps": 1},
        "max_steps": 8,
        "log_every": 2,
        "eval_every": None,
        "save_every": 4,
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "quiet": True,
        "runtime": {"device": "cpu", "precision": "fp32"},
        **overrides,
    }
    return parse_train_params(raw)


def run_train(params, tokenizer, pairs, eval_pairs=None, model=None):
    """``train`` with ``params`` on ``pairs``: ``model``, else a fresh one built from ``params.model``."""
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=0))
    if model is None:
        model = build_model(params.model, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    return train(
        model,
        pairs,
        eval_pairs,
        params=params,
        runtime=runtime,
        pad_id=tokenizer.eos_token_id,
        max_length=MAX_LENGTH,
        attn="sdpa",
    )


def assert_merges_to_the_unmerged_logits(adapter_folder, pairs) -> None:
    """The saved adapter merged into its base gives the unmerged model's logits (the merge rounds once per
    weight)."""
    merged = lora.merge_adapter(adapter_folder).eval()
    unmerged = lora.load_adapter_model(adapter_folder, merge=False).eval()
    ids = torch.as_tensor(np.asarray(pairs[0], dtype=np.int64))[None]
    with torch.no_grad():
        expected = unmerged(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=0, atol=MERGED_ADAPTER_ATOL)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma2", "olmo2", "phi3"])
def test_auto_targets_cover_every_projection_of_a_decoder_layer(family):
    """``target_modules: auto`` adapts every Linear of a decoder layer (attention and MLP) of each dense
    family it names: Phi-3 fuses q/k/v (``qkv_proj``) and gate/up (``gate_up_proj``), and the Llama names
    left those without an adapter, silently."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family)
    sizes = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4}
    sizes |= {"num_key_value_heads": 2, "head_dim": 8, "vocab_size": 128, "pad_token_id": 0}
    for key, value in sizes.items():
        setattr(config, key, value)
    model = AutoModelForCausalLM.from_config(config)
    linear = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and ".layers." in name
    }
    assert set(lora.target_modules(model, "auto")) >= linear and linear


@pytest.mark.parametrize("tied", [True, False], ids=["tied-head", "own-head"])
def test_lora_on_the_embedding_and_the_head_trains_fused_as_with_peft_forward(
    tmp_path_factory, texts, tokenizer, pairs, tied
):
    """peft adapts embeddings and the LM head too: with them in target_modules the build read the wrapped
    embedding's ``num_embeddings`` (peft's wrapper has none: AttributeError), and the fused head's logits
    were a view made inside its autograd function, which the loss's in-place gradient may not overwrite
    (RuntimeError in backward). Fused or through peft's forward, the same losses (a reordered sum)."""
    base = save_tiny_llama(tmp_path_factory.mktemp("base"), llama_style_tokenizer(texts), tied=tied)
    targets = ["embed_tokens", "lm_head", "q_proj"]
    losses = {}
    for fused in (True, False):
        lora_settings = {"target_modules": targets, "fused_forward": fused}
        params = train_params(
            tmp_path_factory.mktemp(f"fused-{fused}"),
            base,
            model=model_params(base, **lora_settings),
            save_every=None,
            max_steps=4,
            log_every=1,
        )
        result = run_train(params, tokenizer, pairs)
        adapted = {
            name.split(".lora_")[0].rsplit(".", 1)[-1]
            for name, _ in result.model.named_parameters()
            if "lora_" in name
        }
        assert adapted == set(targets), adapted
        losses[fused] = [record["loss"] for record in result.history]
    np.testing.assert_allclose(losses[True], losses[False], rtol=TRAINED_FP32_LOSS_REL)


def test_an_init_that_cannot_decompose_the_models_layers_is_one_line():
    """OLoRA on GPT-2 (its Conv1D layers hold the weight transposed): peft's decomposition multiplies
    mismatched shapes. One line naming train.model.lora.init, not a RuntimeError traceback."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from fastlm.engine.config import LoraParams

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=32))
    with pytest.raises(ConfigError) as refused:
        lora.apply_lora(model, LoraParams(enabled=True, r=4, init="olora"), gradient_checkpointing=False)
    message = str(refused.value)
    assert message.startswith("train.model.lora.init = 'olora'") and "\n" not in message, message
    assert "init: pissa or default" in message


def test_auto_targets_are_the_projections_and_only_adapters_train(base_dir, tokenizer):
    params = parse_train_params({"model": model_params(base_dir)}).model
    model = build_model(params, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    adapted = {name.split(".")[-4] for name in trainable}  # ...q_proj.lora_A.default.weight
    assert adapted == set(lora.DEFAULT_TARGETS["llama"])
    counts = lora.parameter_counts(model)
    assert counts["trainable_parameters"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert 0 < counts["trainable_share"] < 0.5 and counts["total_parameters"] > counts["trainable_parameters"]
    optimizer = make_adamw(model, lr=1e-3)
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in model.parameters() if p.requires_grad}
    assert (
        lora.target_modules(type("M", (), {"config": type("C", (), {"model_type": "bert"})})(), "auto")
        == "all-linear"
    )


def test_lora_is_refused_without_a_pretrained_base_and_4bit_without_bitsandbytes(
    base_dir, tokenizer, monkeypatch
):
    scratch = parse_train_params({"model": {"lora": {"enabled": True}}}).model
    with pytest.raises(ConfigError, match="train.model.name_or_path is null"):
        build_model(scratch, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    quantized = parse_train_params({"model": model_params(base_dir, load_in_4bit=True)}).model
    with monkeypatch.context() as patch:  # a machine without bitsandbytes
        hide_package(patch, "bitsandbytes")
        with pytest.raises(
            ConfigError, match="train.model.lora.load_in_4bit is true but the bitsandbytes package"
        ) as error:
            build_model(quantized, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    assert "\n" not in str(error.value) and "pip install 'bitsandbytes>=0.50'" in str(error.value)
    wrong = parse_train_params({"model": model_params(base_dir, target_modules=["no_such_layer"])}).model
    with pytest.raises(ConfigError, match="target_modules"):
        build_model(wrong, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")


def test_lora_training_with_completion_only_packed_data_learns_resumes_and_merges(
    tmp_path, base_dir, tokenizer, pairs
):
    params = train_params(
        tmp_path, base_dir, model={**model_params(base_dir), "gradient_checkpointing": True}
    )
    model = build_model(params.model, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    frozen_before = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    result = run_train(params, tokenizer, pairs, pairs, model=model)
    losses = [record["loss"] for record in result.history]
    assert result.summary["batching"] == "packed" and losses[-1] < losses[0]
    assert all(
        torch.equal(p, frozen_before[name])
        for name, p in result.model.named_parameters()
        if not p.requires_grad
    )
    assert latest_checkpoint(tmp_path / "ckpt").name.endswith("8")
    import safetensors.torch

    saved = safetensors.torch.load_file(str(latest_checkpoint(tmp_path / "ckpt") / "model.safetensors"))
    trainable = {name for name, p in result.model.named_parameters() if p.requires_grad}
    assert set(saved) == trainable and all("lora_" in name for name in saved)  # no copy of the frozen base

    # Resume: a fresh run with max_steps 8 continues from the step-8 checkpoint and changes nothing.
    resumed = run_train(params, tokenizer, pairs)
    for (name, p), (_, q) in zip(
        result.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert torch.equal(p, q), name

    # Save as the catalog does (adapter + tokenizer), merge, and compare logits with the adapter model.
    out = tmp_path / "adapter"
    result.model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base_dir.resolve()) and not (out / "config.json").exists()
    merged = lora.merge_adapter(out)
    merged.save_pretrained(tmp_path / "merged")
    from transformers import AutoModelForCausalLM

    full = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", local_files_only=True).eval()
    result.model.eval()
    ids = torch.as_tensor(np.asarray(pairs[0], dtype=np.int64))[None]
    with torch.no_grad():
        expected = result.model(input_ids=ids).logits
        torch.testing.assert_close(full(input_ids=ids).logits, expected, rtol=0, atol=MERGED_ADAPTER_ATOL)
        base = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True).eval()
        # it did something
        assert not torch.allclose(base(input_ids=ids).logits, expected, atol=MERGED_ADAPTER_ATOL)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_qlora_trains_on_cpu_resumes_and_merges(tmp_path, base_dir, tokenizer, pairs, precision):
    """QLoRA on CPU (bitsandbytes' CPU backend): the base loads in NF4, only the adapters train (the 4-bit
    weights unchanged), the run resumes to the same adapters, and the saved adapter merges into the base
    folder's weights with the unmerged logits (the adapter trained over NF4 weights, as on a GPU)."""
    pytest.importorskip("bitsandbytes", reason="the dev install brings it: pip install -e .[dev]")
    import bitsandbytes

    params = train_params(
        tmp_path,
        base_dir,
        model=model_params(base_dir, load_in_4bit=True, base_dtype=precision),  # fp32: mixed precision off
        runtime={"device": "cpu", "precision": precision},
    )
    model = build_model(params.model, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    four_bit = [m for m in model.modules() if isinstance(m, bitsandbytes.nn.Linear4bit)]
    assert len(four_bit) == 2 * 7
    packed_before = [m.weight.detach().clone() for m in four_bit]
    result = run_train(params, tokenizer, pairs, pairs, model=model)
    losses = [record["loss"] for record in result.history]
    assert losses[-1] < losses[0], losses
    assert all(torch.equal(m.weight, before) for m, before in zip(four_bit, packed_before, strict=True))
    trainable = {name: p.detach().clone() for name, p in result.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)

    resumed = run_train(params, tokenizer, pairs)
    for name, p in resumed.model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p, trainable[name]), name

    out = tmp_path / "adapter"
    result.model.save_pretrained(out)
    assert_merges_to_the_unmerged_logits(out, pairs)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_qlora_adapter_loads_and_merges_into_the_4bit_weights_it_trained_on(
    tmp_path, base_dir, tokenizer, pairs, precision
):
    """A QLoRA adapter's model is its base's NF4 weights plus the adapter: loaded (the report, predict) or
    merged (``merge-adapter``), the base weights are those 4-bit weights dequantized, bit for bit, and the
    merged model gives the trained 4-bit model's logits; the base folder's own weights plus the adapter are
    a model that never trained (its test loss is not the trained model's)."""
    pytest.importorskip("bitsandbytes", reason="the dev install brings it: pip install -e .[dev]")
    import bitsandbytes
    from bitsandbytes.functional import dequantize_4bit

    from fastlm.datasets import PretrainedModelDataset

    params = train_params(
        tmp_path,
        base_dir,
        model=model_params(base_dir, load_in_4bit=True, base_dtype=precision),
        runtime={"device": "cpu", "precision": precision},
        save_every=None,
    )
    trained = run_train(params, tokenizer, pairs).model.eval()
    out = tmp_path / "adapter"
    PretrainedModelDataset(str(out)).save({"model": trained, "tokenizer": tokenizer})
    four_bit = {
        name.removeprefix("base_model.model."): module
        for name, module in trained.named_modules()
        if isinstance(module, bitsandbytes.nn.Linear4bit)
    }
    assert len(four_bit) == 2 * 7
    unmerged = lora.load_adapter_model(out, merge=False)
    weights = dict(unmerged.base_model.model.named_parameters())
    for name, module in four_bit.items():
        expected = dequantize_4bit(module.weight.data, module.weight.quant_state).float()
        assert torch.equal(weights[f"{name}.weight"], expected), name
    frozen = {n: p for n, p in trained.base_model.model.named_parameters() if p.dtype.is_floating_point}
    for name, param in frozen.items():  # embedding, norms, head: as the 4-bit run held them
        if "lora_" not in name:
            assert torch.equal(weights[name], param.detach().float()), name
    merged = PretrainedModelDataset(str(out)).load()["model"].eval()
    assert torch.equal(merged.model.norm.weight, unmerged.base_model.model.model.norm.weight)
    if precision == "fp32":  # the 4-bit model computes in fp32: the same function, up to the merge's rounding
        ids = torch.as_tensor(np.asarray(pairs[0], dtype=np.int64))[None]
        with torch.no_grad():
            expected = trained(input_ids=ids).logits
            for model in (merged, lora.merge_adapter(out).eval()):
                torch.testing.assert_close(
                    model(input_ids=ids).logits, expected, rtol=0, atol=MERGED_ADAPTER_ATOL
                )


@pytest.mark.parametrize("saved", ["lm_head", "embed_tokens"])
def test_a_module_to_save_trains_over_a_4bit_base_computing_in_its_own_fp32(
    tmp_path, base_dir, tokenizer, pairs, saved
):
    """QLoRA with mixed precision off (``runtime.precision: fp32``, what ``auto`` measures on CPU): the 4-bit
    layers compute in bf16 and a ``modules_to_save`` copy trains in fp32. The copy computes in its fp32 (the
    head from the bf16 hidden states: fp32 logits) and hands the layers after it the dtype they compute in
    (the embedding: bf16, as the frozen one did). Was: ``expected m1 and m2 to have the same dtype`` at the
    first forward. The loss is that computation's: the copy applied by hand in fp32."""
    pytest.importorskip("bitsandbytes", reason="the dev install brings it: pip install -e .[dev]")
    import torch.nn.functional as F

    params = train_params(
        tmp_path,
        base_dir,
        model=model_params(base_dir, load_in_4bit=True, modules_to_save=[saved]),
        save_every=None,
        max_steps=3,
        log_every=1,
    )
    result = run_train(params, tokenizer, pairs)
    assert all(math.isfinite(record["loss"]) for record in result.history)
    model = result.model
    wrapper = next(
        m for name, m in model.named_modules() if name.endswith(saved) and hasattr(m, "original_module")
    )
    copy = wrapper.modules_to_save["default"]
    compute = wrapper.original_module.weight.dtype
    assert compute == torch.bfloat16 and copy.weight.dtype == torch.float32
    assert not torch.equal(copy.weight, wrapper.original_module.weight.float())  # it trained
    ids = torch.as_tensor(np.asarray(pairs[0], dtype=np.int64))[None]
    seen = {}
    head = model.get_output_embeddings()
    head.register_forward_pre_hook(lambda module, args: seen.setdefault("head_input", args[0]))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        hidden = seen["head_input"]
        if saved == "lm_head":
            assert hidden.dtype == compute
            expected = F.linear(hidden.float(), copy.weight)
        else:  # the frozen layers from the copy's fp32 rows, given in the dtype they compute in
            expected = model(inputs_embeds=copy.weight[ids].to(compute)).logits
            assert logits.dtype == compute
    assert logits.dtype == expected.dtype
    targets = ids[0, 1:]
    loss = loss_fns.cross_entropy_sum(logits[0, :-1], targets)
    trusted = F.cross_entropy(expected[0, :-1].float(), targets, reduction="sum")
    torch.testing.assert_close(loss, trusted, rtol=reordered_sum_rtol(targets.numel()), atol=0)


@pytest.mark.parametrize("four_bit", [False, True], ids=["lora", "qlora"])
def test_dora_with_rslora_and_loraplus_trains_saves_and_merges_to_the_same_logits(
    tmp_path, base_dir, tokenizer, pairs, four_bit
):
    """``use_dora``, ``use_rslora`` and ``loraplus_lr_ratio`` (peft's DoRA variant, scaling alpha / sqrt(r),
    B at 4x the rate), on a 16-bit base and on an NF4 one: the run learns, the magnitudes train with the
    adapters, the saved adapter says what it is, and merged into the base it gives the unmerged model's
    logits (the merge rounds once per weight)."""
    if four_bit:
        pytest.importorskip("bitsandbytes", reason="the dev install brings it: pip install -e .[dev]")
    lora_settings = {"use_dora": True, "use_rslora": True, "load_in_4bit": four_bit, "loraplus_lr_ratio": 4}
    params = train_params(
        tmp_path, base_dir, model=model_params(base_dir, **lora_settings), max_steps=6, save_every=None
    )
    model = build_model(params.model, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    magnitudes = {
        name: p.detach().clone()
        for name, p in model.named_parameters()
        if "lora_magnitude_vector" in name and p.requires_grad
    }
    assert len(magnitudes) == 2 * 7
    result = run_train(params, tokenizer, pairs, model=model)
    losses = [record["loss"] for record in result.history]
    assert losses[-1] < losses[0], losses
    trained = dict(result.model.named_parameters())
    assert all(not torch.equal(trained[name], before) for name, before in magnitudes.items())
    out = tmp_path / "adapter"
    result.model.save_pretrained(out)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["use_dora"] is True and config["use_rslora"] is True
    assert_merges_to_the_unmerged_logits(out, pairs)


@pytest.mark.parametrize(("init", "rslora"), [("pissa", False), ("pissa_niter_2", False), ("olora", True)])
def test_pissa_and_olora_start_at_the_bases_function_and_save_a_lora_for_the_unchanged_base(
    tmp_path, base_dir, tokenizer, pairs, init, rslora
):
    """PiSSA and OLoRA move the weight's principal part into the adapters (the base keeps the rest), so the
    model starts at the base's function with B non-zero; the saved adapter is their trained difference as a
    plain LoRA of twice the rank (peft's conversion: [A | A0], [B | -B0]) for the base folder's own weights,
    and a rebuilt model (a resume, the launcher's parent) derives the same residual base."""
    from transformers import AutoModelForCausalLM

    params = train_params(
        tmp_path,
        base_dir,
        model=model_params(base_dir, init=init, use_rslora=rslora),
        max_steps=6,
        save_every=3,
    )
    model = build_model(params.model, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    base = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True).eval()
    ids = torch.as_tensor(np.asarray(pairs[0], dtype=np.int64))[None]
    b_matrices = [p for name, p in model.named_parameters() if "lora_B" in name]
    assert len(b_matrices) == 2 * 7 and all(p.abs().sum() > 0 for p in b_matrices)
    with torch.no_grad():  # W_res + s B0 A0 against W: the subtraction and the adapters' product round
        start = model.eval()(input_ids=ids).logits
        torch.testing.assert_close(start, base(input_ids=ids).logits, **OTHER_FP32_MODEL)
    result = run_train(params, tokenizer, pairs, model=model.train())
    losses = [record["loss"] for record in result.history]
    assert losses[-1] < losses[0], losses

    out = tmp_path / "adapter"
    lora.save_adapter(result.model, out)
    config = json.loads((out / "adapter_config.json").read_text())
    # twice the rank at the same scaling: alpha / r, or alpha / sqrt(r) rank-stabilized
    alpha = 8 * math.sqrt(2) if rslora else 16
    assert (config["r"], config["init_lora_weights"]) == (8, True) and config["lora_alpha"] == pytest.approx(
        alpha
    )
    merged = lora.merge_adapter(out).eval()  # onto the base folder's weights, not the residual ones
    with torch.no_grad():
        trained = result.model.eval()(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits, trained, rtol=0, atol=MERGED_ADAPTER_ATOL)
        assert not torch.allclose(trained, start, atol=MERGED_ADAPTER_ATOL)  # it did something

    rebuilt = build_model(params.model, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    residual = {n: p for n, p in result.model.named_parameters() if "base_layer" in n}
    assert len(residual) == 2 * 7
    for name, p in rebuilt.named_parameters():
        if name in residual:  # the same computation (the decomposition of the same weight) run twice
            assert torch.equal(p, residual[name]), name


def test_pissa_and_olora_are_refused_where_the_saved_adapter_could_not_reproduce_the_run(base_dir):
    for lora_settings, reason in [
        ({"init": "pissa", "load_in_4bit": True}, "4-bit"),
        ({"init": "olora", "use_dora": True}, "DoRA"),
    ]:
        with pytest.raises(ConfigError) as caught:
            parse_train_params({"model": model_params(base_dir, **lora_settings)})
        message = str(caught.value)
        assert "train.model.lora.init" in message and reason in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"train\.model\.lora\.init.*pissa_niter_<n>"):
        parse_train_params({"model": model_params(base_dir, init="pisa")})


def test_the_adapter_is_described_as_configured():
    from fastlm.engine.config import LoraParams

    assert lora.adapter_description(LoraParams(enabled=True)) == "LoRA (r 16, alpha 32)"
    assert (
        lora.adapter_description(
            LoraParams(enabled=True, use_dora=True, use_rslora=True, loraplus_lr_ratio=16, load_in_4bit=True)
        )
        == "QDoRA (r 16, alpha 32, rank-stabilized scaling, B at 16x the rate, NF4 base)"
    )
    assert lora.adapter_description(LoraParams(enabled=True, init="pissa_niter_4")) == (
        "LoRA (r 16, alpha 32, pissa_niter_4 init)"
    )
    # the build's log names an init by its method, whatever its iterations
    assert [lora.init_name(init) for init in ("pissa_niter_4", "pissa", "olora", "gaussian")] == [
        "PiSSA",
        "PiSSA",
        "OLoRA",
        "Gaussian",
    ]


@pytest.mark.parametrize(("base_dtype", "compute"), [("auto", torch.bfloat16), ("fp32", torch.float32)])
def test_qlora_computes_its_4bit_matmuls_in_an_explicit_base_dtype(base_dir, tokenizer, base_dtype, compute):
    """``lora.base_dtype`` names the frozen base's dtype for LoRA; for QLoRA it names what the 4-bit weights
    are dequantized to and multiplied in (auto: bf16, or fp16 on a GPU without native bf16), so that an fp32
    run (the issue's user: mixed precision off) computes in fp32 rather than in bf16 unasked."""
    bitsandbytes = pytest.importorskip(
        "bitsandbytes", reason="the dev install brings it: pip install -e .[dev]"
    )
    params = parse_train_params(
        {"model": model_params(base_dir, load_in_4bit=True, base_dtype=base_dtype)}
    ).model
    model = build_model(params, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    four_bit = [m for m in model.modules() if isinstance(m, bitsandbytes.nn.Linear4bit)]
    assert four_bit and {m.compute_dtype for m in four_bit} == {compute}
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad and p.dtype.is_floating_point}
    assert frozen == {compute}  # the embedding, head and norms too


def test_after_an_evaluation_pass_qlora_still_trains_its_lower_layers_on_cpu(base_dir, tokenizer):
    """bitsandbytes repacks a 4-bit weight for its CPU inference kernel the first time the layer runs in
    eval mode without gradients on a CPU with AVX-512 bf16 (in place, for good), and that kernel has no
    backward: every later training step would back-propagate nothing through the base layers. fastlm's QLoRA
    layers keep the training layout: the gradients after an evaluation pass equal those before it."""
    pytest.importorskip("bitsandbytes", reason="the dev install brings it: pip install -e .[dev]")
    params = parse_train_params({"model": model_params(base_dir, load_in_4bit=True)}).model
    model = build_model(params, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
    ids = torch.arange(3, 3 + 2 * 24).reshape(2, 24) % len(tokenizer)

    def gradients():
        model.train().zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}

    before = gradients()
    model.eval()
    with torch.no_grad():
        model(input_ids=ids)
    after = gradients()
    for name, grad in before.items():  # the same computation twice
        assert torch.equal(after[name], grad), name


@pytest.mark.parametrize(
    ("overrides", "param", "missing", "candidate"),
    [
        ({"target_modules": ["q_proj", "nonexistent_proj"]}, "target_modules", "nonexistent_proj", "q_proj"),
        ({"modules_to_save": ["nonexist"]}, "modules_to_save", "nonexist", "lm_head"),
        (
            {"target_modules": ["q_proj"], "modules_to_save": ["lm_head", "embed"]},
            "modules_to_save",
            "embed",
            "embed_tokens",
        ),
    ],
    ids=["target_modules", "modules_to_save", "modules_to_save_one_of_two"],
)
def test_every_named_lora_module_must_exist_in_the_model(
    base_dir, tokenizer, overrides, param, missing, candidate
):
    params = parse_train_params({"model": model_params(base_dir, **overrides)}).model
    with pytest.raises(ConfigError) as error:
        build_model(params, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    message = str(error.value)
    assert f"train.model.lora.{param}" in message and missing in message and candidate in message, message
    assert "\n" not in message and "Fix:" in message


def test_lora_names_match_as_peft_matches_them_and_the_log_lists_the_adapted_modules(
    base_dir, tokenizer, caplog
):
    """A name matches a module called that or ending in ``.<name>``; the log names what was adapted."""
    lora_params = {"target_modules": ["self_attn.q_proj", "v_proj"], "modules_to_save": ["lm_head"]}
    params = parse_train_params({"model": model_params(base_dir, **lora_params)}).model
    with caplog.at_level(logging.INFO, logger="fastlm.engine.model.lora"):
        model = build_model(params, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    adapted = {name.split(".")[-4] for name, p in model.named_parameters() if "lora_" in name}
    assert adapted == {"q_proj", "v_proj"}
    line = next(message for message in caplog.messages if message.startswith("LoRA "))
    assert "adapting q_proj, v_proj (4 modules); fully training lm_head" in line, line


@pytest.mark.parametrize("bias", ["all", "lora_only"])
def test_a_lora_bias_setting_on_a_model_without_biases_says_it_trains_nothing_extra(
    tmp_path, base_dir, tokenizer, monkeypatch, bias
):
    """Llama's projections (and norms) have no bias: ``lora.bias: all`` or ``lora_only`` makes no parameter
    trainable beyond the adapters. One warning at the build names the setting, why and the fix; a Llama
    with attention biases trains them, without the warning."""
    from transformers import AutoConfig, LlamaForCausalLM

    from tests.support.logs import module_log_lines

    lines = module_log_lines(monkeypatch, lora)
    plain = build_model(
        parse_train_params({"model": model_params(base_dir, bias="none")}).model,
        tokenizer,
        max_length=MAX_LENGTH,
        attn_implementation="sdpa",
    )
    lines.clear()
    params = parse_train_params({"model": model_params(base_dir, bias=bias)}).model
    model = build_model(params, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {name for name, p in plain.named_parameters() if p.requires_grad}  # nothing extra
    warned = [line for line in lines if f"{lora.PARAM}.bias" in line]
    assert len(warned) == 1 and "\n" not in warned[0], lines
    assert f"{lora.PARAM}.bias: {bias}" in warned[0] and "no bias" in warned[0], warned
    assert f"set {lora.PARAM}.bias: none" in warned[0], warned

    config = AutoConfig.from_pretrained(base_dir)
    config.attention_bias = True
    biased = tmp_path / "biased"
    LlamaForCausalLM(config).save_pretrained(biased)
    tokenizer.save_pretrained(biased)
    lines.clear()
    params = parse_train_params({"model": model_params(biased, bias=bias)}).model
    model = build_model(params, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    assert any(name.endswith(".bias") and p.requires_grad for name, p in model.named_parameters())
    assert not [line for line in lines if f"{lora.PARAM}.bias" in line], lines


def _adapter(tmp_path, base_dir, tokenizer, **lora_overrides):
    """A LoRA model on a copy of the base, saved as the catalog saves it: (base folder, adapter folder)."""
    from fastlm.datasets import PretrainedModelDataset

    base = tmp_path / "base"
    shutil.copytree(base_dir, base)
    params = parse_train_params({"model": model_params(base, **lora_overrides)}).model
    model = build_model(params, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    with torch.no_grad():  # an adapter that changes the model (peft starts lora_B at zero)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.01)
    PretrainedModelDataset(str(tmp_path / "adapter")).save({"model": model, "tokenizer": tokenizer})
    return base, tmp_path / "adapter"


def test_an_adapter_refuses_a_base_replaced_by_another_model_of_the_same_shape(
    tmp_path, base_dir, tokenizer, capsys
):
    from fastlm.__main__ import merge_adapter_command
    from fastlm.datasets import PretrainedModelDataset

    base, adapter = _adapter(tmp_path, base_dir, tokenizer)
    PretrainedModelDataset(str(adapter)).load()  # the base it was trained on: loads
    from transformers import AutoModelForCausalLM

    moved = tmp_path / "moved"  # the same weights elsewhere, re-saved in shards: the same digest
    whole = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    whole.save_pretrained(moved, max_shard_size="40KB")
    tokenizer.save_pretrained(moved)
    assert len(list(moved.glob("*.safetensors"))) > 1
    lora.merge_adapter(adapter, base=str(moved))

    save_tiny_llama(base, tokenizer, seed=1)  # another model of the same shape in the base folder
    for load in (lambda: PretrainedModelDataset(str(adapter)).load(), lambda: lora.merge_adapter(adapter)):
        with pytest.raises(Exception) as error:  # the catalog wraps a dataset's error in its own
            load()
        assert isinstance(find_user_error(error.value), ConfigError), repr(error.value)
        message = str(find_user_error(error.value))
        assert f"the base model folder {base} of the LoRA adapter in {adapter}" in message, message
        assert "weights differ from base_digest.json" in message and "\n" not in message and "Fix:" in message
    out = tmp_path / "merged"
    assert merge_adapter_command(["--adapter", str(adapter), "--out", str(out)]) == 2
    error_lines = capsys.readouterr().err.strip().splitlines()
    assert len(error_lines) == 1 and "no longer holds the weights" in error_lines[0] and not out.exists()


def test_merge_adapter_never_writes_over_its_own_adapter_or_base(tmp_path, base_dir, tokenizer, capsys):
    """``--out`` naming the adapter folder (or the base it merges into), even with ``--overwrite``: the
    merged model replaced the run's adapter (and a base, every other adapter of it); refused, both kept."""
    from fastlm.__main__ import merge_adapter_command

    base, adapter = _adapter(tmp_path, base_dir, tokenizer)
    kept = {path: path.read_bytes() for folder in (base, adapter) for path in folder.iterdir()}
    for out in (adapter, base, tmp_path / "." / "adapter"):
        assert merge_adapter_command(["--adapter", str(adapter), "--out", str(out), "--overwrite"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "--out" in lines[0] and "would replace" in lines[0], lines
    assert {path: path.read_bytes() for folder in (base, adapter) for path in folder.iterdir()} == kept


def test_merging_an_adapter_saved_before_the_quantization_record_says_what_a_qlora_one_would_lose(
    tmp_path, base_dir, tokenizer, monkeypatch, capsys
):
    """``base_digest.json`` records whether the base trained in 4 bits (``quantized``: the record, or null);
    an adapter folder saved before it did cannot say whether it was a QLoRA one, which the merge would put
    on the base's full-precision weights: ``merge-adapter`` says so in one warning with the fix. A folder
    with the record merges without it."""
    from fastlm.__main__ import merge_adapter_command
    from tests.support.logs import module_log_lines

    _, adapter = _adapter(tmp_path, base_dir, tokenizer)
    digest = json.loads((adapter / lora.BASE_DIGEST).read_text())
    assert "quantized" in digest and digest["quantized"] is None  # a 32-bit base, recorded as such
    lines = module_log_lines(monkeypatch, lora)

    def merged_warnings(out: str) -> list[str]:
        lines.clear()
        assert merge_adapter_command(["--adapter", str(adapter), "--out", str(tmp_path / out)]) == 0
        capsys.readouterr()
        return [line for line in lines if "4-bit" in line or "load_in_4bit" in line]

    assert merged_warnings("recorded") == []
    del digest["quantized"]  # as an earlier fastlm saved it
    (adapter / lora.BASE_DIGEST).write_text(json.dumps(digest))
    said = merged_warnings("unrecorded")
    assert len(said) == 1 and "\n" not in said[0], lines
    assert str(adapter) in said[0] and f"{lora.PARAM}.load_in_4bit" in said[0], said
    assert "full-precision" in said[0] and "train it again" in said[0] and "in 4-bit" in said[0], said


@pytest.fixture(scope="module")
def bf16_base_dir(tmp_path_factory, tokenizer):
    return save_tiny_llama(tmp_path_factory.mktemp("bf16_base"), tokenizer, dtype=torch.bfloat16)


def _saved_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {name: t for path in sorted(folder.glob("*.safetensors")) for name, t in load_file(path).items()}


def _saved_dtype_names(folder: Path) -> tuple[set[str], str]:
    """The dtypes of a saved folder's floating tensors, and the dtype its config.json names."""
    floating = {str(t.dtype).removeprefix("torch.") for t in _saved_tensors(folder).values()}
    config = json.loads((folder / "config.json").read_text())
    return {d for d in floating if d.startswith(("float", "bfloat"))}, config.get(
        "dtype", config.get("torch_dtype")
    )


@pytest.mark.parametrize(
    ("saved", "four_bit", "asked", "written"),
    [
        (torch.bfloat16, False, None, torch.bfloat16),
        (torch.float32, False, None, torch.float32),
        (torch.bfloat16, False, "float32", torch.float32),
        (torch.bfloat16, True, None, torch.bfloat16),
    ],
    ids=["bf16-base", "fp32-base", "bf16-base-asked-fp32", "qlora-bf16-base"],
)
def test_merge_adapter_writes_the_bases_saved_dtype_merged_in_fp32_and_cast_once(
    tmp_path, base_dir, bf16_base_dir, tokenizer, pairs, saved, four_bit, asked, written
):
    """A base saved in bf16 (a 3B download: 6 GB) merged with its adapter was written in fp32 (12 GB, a dtype
    the user never had). The merged folder is in the base's saved dtype (``--dtype auto``; a QLoRA adapter's:
    the base folder's, its dequantized NF4 weights plus the adapter), or the one ``--dtype`` asks: each merged
    weight is ``W + scale * B @ A`` computed in fp32 and cast once, and the folder's logits are the unmerged
    model's up to that one rounding. An fp32 base still merges to fp32."""
    from peft.tuners.lora import LoraLayer
    from transformers import AutoModelForCausalLM

    from fastlm.__main__ import merge_adapter_command

    if four_bit:
        pytest.importorskip("bitsandbytes", reason="the dev install brings it: pip install -e .[dev]")
    base = bf16_base_dir if saved == torch.bfloat16 else base_dir
    _, adapter = _adapter(tmp_path, base, tokenizer, **({"load_in_4bit": True} if four_bit else {}))
    out = tmp_path / "merged"
    argv = ["--adapter", str(adapter), "--out", str(out)] + (["--dtype", asked] if asked else [])
    assert merge_adapter_command(argv) == 0
    name = str(written).removeprefix("torch.")
    assert _saved_dtype_names(out) == ({name}, name)
    tensors = _saved_tensors(out)
    unmerged = lora.load_adapter_model(adapter, merge=False).eval()  # fp32; a QLoRA one on its NF4 weights
    adapted = {n: m for n, m in unmerged.base_model.model.named_modules() if isinstance(m, LoraLayer)}
    assert len(adapted) == 2 * 7
    with torch.no_grad():
        for module_name, module in adapted.items():  # peft's own merge, in fp32, then one cast
            in_fp32 = module.base_layer.weight + module.get_delta_weight("default")
            assert torch.equal(tensors[f"{module_name}.weight"], in_fp32.to(written)), module_name
        ids = torch.as_tensor(np.asarray(pairs[0], dtype=np.int64))[None]
        merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        tolerance = {"rtol": 0, "atol": MERGED_ADAPTER_ATOL} if written == torch.float32 else BF16_VS_FP32
        torch.testing.assert_close(merged(input_ids=ids).logits, unmerged(input_ids=ids).logits, **tolerance)


def test_merge_adapter_refuses_a_dtype_its_weights_overflow(tmp_path, base_dir, tokenizer, capsys):
    """``--dtype float16`` for a base with a weight beyond fp16's range (65504): the merged folder would hold
    inf. One line naming the weight, ``--dtype`` and the fix, exit 2, no folder."""
    from safetensors.torch import load_file, save_file

    from fastlm.__main__ import merge_adapter_command

    large = tmp_path / "large"
    shutil.copytree(base_dir, large)
    weights = load_file(large / "model.safetensors")
    weights["model.norm.weight"][0] = 1e5
    save_file(weights, large / "model.safetensors", metadata={"format": "pt"})
    _, adapter = _adapter(tmp_path, large, tokenizer)
    out = tmp_path / "merged"
    assert merge_adapter_command(["--adapter", str(adapter), "--out", str(out), "--dtype", "float16"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "model.norm.weight" in lines[0] and "--dtype float16" in lines[0], lines
    assert "Fix:" in lines[0] and "bfloat16" in lines[0] and not out.exists(), lines


def test_a_bases_saved_dtype_is_that_of_most_of_its_unquantized_weights(tmp_path):
    """``saved_dtype``: a bf16 folder with a few fp32 tensors is bf16 (most of its bytes), packed 4-bit
    tensors do not count; a folder without safetensors has its config's dtype."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    save_file(
        {"norm": torch.ones(8), "proj": torch.ones(16, 8, dtype=torch.bfloat16)}, mixed / "a.safetensors"
    )
    save_file(
        {"packed": torch.zeros(4096, dtype=torch.uint8), "head": torch.ones(4)}, mixed / "b.safetensors"
    )
    assert lora.saved_dtype(mixed) == torch.bfloat16
    binary = tmp_path / "binary"
    LlamaConfig(hidden_size=8, num_attention_heads=2, dtype="float16").save_pretrained(binary)
    (binary / "pytorch_model.bin").write_bytes(b"")
    assert lora.saved_dtype(binary) == torch.float16


@pytest.mark.parametrize(
    ("family", "targets"),
    [("bart", ["q_proj", "lm_head"]), ("bart", ["q_proj"]), ("llama", ["q_proj", "embed_tokens"])],
)
def test_a_bf16_encoder_decoder_or_tied_base_merges_to_bf16_keeping_its_ties(
    tmp_path, tokenizer, family, targets
):
    """A bf16 BART (its head and both embeddings one table) or a tied bf16 Llama: the merged folder is bf16
    throughout, tied where no adapter sits on a tied weight (as in fp32), and gives the unmerged model's
    logits up to the one bf16 rounding of each merged weight."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from tests.support.tiny_seq2seq import tiny_seq2seq

    base = tmp_path / "base"
    if family == "bart":
        tiny_seq2seq("bart").to(torch.bfloat16).save_pretrained(base)
        auto, vocab = AutoModelForSeq2SeqLM, 64
    else:
        save_tiny_llama(base, tokenizer, tied=True, dtype=torch.bfloat16)
        auto, vocab = AutoModelForCausalLM, len(tokenizer)
    peft_model = get_peft_model(
        auto.from_pretrained(base, dtype=torch.float32), LoraConfig(r=4, lora_alpha=8, target_modules=targets)
    )
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name or "lora_embedding_" in name:
                param.normal_(0, 0.5)
    peft_model.save_pretrained(tmp_path / "adapter")
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, **({"decoder_input_ids": ids.flip(-1)} if family == "bart" else {})}
    lora.merge_adapter(tmp_path / "adapter", base=str(base)).save_pretrained(tmp_path / "merged")
    assert _saved_dtype_names(tmp_path / "merged") == ({"bfloat16"}, "bfloat16")
    with torch.no_grad():
        again = auto.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
        torch.testing.assert_close(again(**inputs).logits, peft_model.eval()(**inputs).logits, **BF16_VS_FP32)
    tied = again.get_output_embeddings().weight is again.get_input_embeddings().weight
    assert tied == (targets == ["q_proj"]) and again.config.tie_word_embeddings == tied


# The module's base and an adapter on it (as ``_adapter`` makes them: the base_dir and tokenizer fixtures,
# model_params) saved in the current folder by a fresh process.
ADAPTER = """
import shutil, sys
from pathlib import Path
sys.path[:0] = [{repo!r}, {scripts!r}]  # tests.support; demo_data (pytest's pythonpath)


def main():
    import torch
    from demo_data.texts import make_texts
    from transformers import AutoTokenizer

    from fastlm.datasets import PretrainedModelDataset
    from fastlm.engine.config import parse_train_params
    from fastlm.engine.model.build import build_model
    from tests.support.tiny_llama import llama_style_tokenizer, save_tiny_llama

    here = Path.cwd()
    base = save_tiny_llama(here / "base", llama_style_tokenizer(make_texts(240, seed=5, profile="demo")))
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    lora = {{"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0}}
    params = parse_train_params({{"model": {{"name_or_path": str(base), "lora": lora}}}}).model
    model = build_model(params, tokenizer, max_length={max_length}, attn_implementation="sdpa")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.01)
    PretrainedModelDataset(str(here / "adapter")).save({{"model": model, "tokenizer": tokenizer}})


if __name__ == "__main__":
    main()
"""


def merge_in_a_process_of_its_own(folder: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """A base and an adapter saved by a fresh process, then ``python -m fastlm merge-adapter`` on them in
    another (a job of tests/support/background.py)."""
    script = ADAPTER.format(repo=str(REPO), scripts=str(REPO / "scripts"), max_length=MAX_LENGTH)
    saved = background.run([sys.executable, "-c", script], cwd=folder)
    assert saved.returncode == 0, saved.stderr[-3000:]
    adapter = folder / "adapter"
    merge = [sys.executable, "-m", "fastlm", "merge-adapter", "--adapter", str(adapter), "--out", "merged"]
    return adapter, background.run(merge, cwd=folder)


@pytest.mark.background(job=merge_in_a_process_of_its_own)
def test_the_merge_command_says_only_its_own_lines():
    """``python -m fastlm merge-adapter`` in a process of its own: what it writes is its own result, not the
    lines libraries log while peft imports them (torchao's kernels it cannot load on this machine, torch's
    deprecation of a registration), which ``kedro run`` keeps out through conf/logging.yml."""
    adapter, done = background.result(merge_in_a_process_of_its_own)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"Merged {adapter} into a full float32 model at merged", done.stdout
    assert not [line for line in done.stderr.splitlines() if "torchao" in line or "_pytree" in line], (
        done.stderr
    )


def test_a_moved_base_names_the_merge_that_uses_its_new_folder(tmp_path, base_dir, tokenizer):
    """The report and predict load an adapter over the base its config names; moved, the fix named
    ``merge-adapter --base <dir>`` alone, and predict has no base parameter: the whole command, and where
    its output goes."""
    base, adapter = _adapter(tmp_path, base_dir, tokenizer)
    base.rename(tmp_path / "moved")
    with pytest.raises(ConfigError) as refused:
        lora.load_adapter_model(adapter)
    fix = str(refused.value).split("Fix:")[1]
    assert f"merge-adapter --adapter {adapter} --base <new folder> --out <merged>" in fix, fix
    assert "predict.model=<merged>" in fix


def test_a_change_to_one_small_tensor_of_the_base_is_refused(tmp_path, base_dir, tokenizer):
    import safetensors.torch

    base, adapter = _adapter(tmp_path, base_dir, tokenizer)
    weights = safetensors.torch.load_file(str(base / "model.safetensors"))
    weights["model.norm.weight"][3] += 1.0  # 32 of the model's 40k weights
    safetensors.torch.save_file(weights, str(base / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"\(1 of \d+ weights differ .*: model.norm.weight changed\)"):
        lora.merge_adapter(adapter)


def test_the_base_digest_samples_large_tensors_and_reads_little(tmp_path, monkeypatch):
    """Tensors above the whole-tensor limit are read at a few spread blocks: a multi-GB base costs MBs."""
    import safetensors.torch

    weights = {"big": torch.arange(1 << 20, dtype=torch.float32), "small": torch.ones(8)}
    safetensors.torch.save_file(weights, str(tmp_path / "model.safetensors"))
    first = lora.base_weights_digest(tmp_path)
    read = []
    real_open = Path.open

    class Counted(io.BufferedReader):
        def read(self, *size):
            read.append(len(data := super().read(*size)))
            return data

    monkeypatch.setattr(Path, "open", lambda self, *_, **__: Counted(real_open(self, "rb", buffering=0)))
    assert lora.base_weights_digest(tmp_path) == first
    assert 0 < sum(read) < 64 * 1024  # of a 4 MiB file
    monkeypatch.undo()
    weights["big"][0] = -1.0  # inside the first sampled block
    safetensors.torch.save_file(weights, str(tmp_path / "model.safetensors"))
    assert lora.base_weights_digest(tmp_path) != first


def test_a_folders_identity_is_its_files_names_and_content_not_their_metadata(tmp_path, base_dir):
    """``folder_identity`` (the predict parts' and the tune's and sweep's key of a model folder): a copy (new
    inodes) is the same; a file of other bytes written with its size and time put back, a safetensors tensor
    or a whole other file, is not; files outside ``suffixes`` do not count there."""
    import os

    folder = tmp_path / "model"
    shutil.copytree(base_dir, folder)
    (folder / "pytorch_model.bin").write_bytes(bytes(range(256)) * 4)
    weights = (".safetensors", ".bin")
    whole, only = lora.folder_identity(folder), lora.folder_identity(folder, weights)
    shutil.copytree(folder, tmp_path / "copy")
    assert (lora.folder_identity(tmp_path / "copy"), lora.folder_identity(tmp_path / "copy", weights)) == (
        whole,
        only,
    )
    (folder / "config.json").write_text((folder / "config.json").read_text() + " ")
    assert lora.folder_identity(folder) != whole and lora.folder_identity(folder, weights) == only
    stat = (folder / "pytorch_model.bin").stat()
    (folder / "pytorch_model.bin").write_bytes(bytes(range(255, -1, -1)) * 4)
    os.utime(folder / "pytorch_model.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert lora.folder_identity(folder, weights) != only


def test_an_adapter_saved_without_a_base_digest_loads_with_one_warning(tmp_path, base_dir, tokenizer, caplog):
    from fastlm.datasets import PretrainedModelDataset

    _, adapter = _adapter(tmp_path, base_dir, tokenizer)
    (adapter / lora.BASE_DIGEST).unlink()  # as an earlier fastlm saved it
    with caplog.at_level(logging.WARNING):
        PretrainedModelDataset(str(adapter)).load()
        lora.merge_adapter(adapter)
    warned = [record for record in caplog.records if lora.BASE_DIGEST in record.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0].getMessage(), caplog.messages


@pytest.mark.parametrize("adapter", [True, False], ids=["lora", "full_fine_tune"])
def test_a_checkpoint_is_not_continued_on_a_changed_base(
    adapter, tmp_path, base_dir, tokenizer, pairs, caplog
):
    """A LoRA checkpoint holds the adapters alone: on other base weights of the same shape it starts fresh.
    Round twenty: a full fine-tune's checkpoint holds all its weights, but they are a fine-tune of the base it
    started from: with other weights of the same shapes put in the base folder, a finished run entered again
    (a sweep trains a run again when its base changed) returned the old base's model as trained, and an
    interrupted one went on training it. Both start fresh, saying the base weights changed."""
    base = tmp_path / "base"
    shutil.copytree(base_dir, base)
    model = model_params(base) if adapter else {"name_or_path": str(base)}
    steps = 4 if adapter else 2
    params = train_params(tmp_path, base, model=model, max_steps=steps, save_every=2, resume="auto")
    run_train(params, tokenizer, pairs)
    save_tiny_llama(base, tokenizer, seed=1)
    caplog.set_level(logging.INFO, logger="fastlm")
    again = run_train(params, tokenizer, pairs)
    assert again.summary["steps_trained"] == steps
    (line,) = [message for message in caplog.messages if "starting fresh" in message]
    assert "model.base_weights" in line, line


def test_an_adapter_moved_with_its_base_finds_it_where_it_now_is(tmp_path, base_dir, tokenizer, monkeypatch):
    """Round six: the adapter config names its base by absolute path: after `mv` of the project the report
    and predict refused the adapter (its base "does not exist"), and a `cp -r` copy read the original
    project's base. The base is looked for where it lies relative to the adapter first (its weights still
    checked), then at the recorded path."""
    import shutil

    from fastlm.datasets import PretrainedModelDataset

    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)  # runs run in the project folder (the CLI moves there)
    base, adapter = _adapter(project, base_dir, tokenizer)
    assert base.is_relative_to(project) and adapter.is_relative_to(project)
    expected = PretrainedModelDataset(str(adapter)).load()["model"]
    # the run's copy, deeper in the project (data/06_models/runs/<run>/model beside data/06_models/model)
    copy = project / "runs" / "mine" / "model"
    shutil.copytree(adapter, copy)
    shutil.move(project, tmp_path / "moved")
    monkeypatch.chdir(tmp_path / "moved")
    for folder in (adapter, copy):
        moved = tmp_path / "moved" / folder.relative_to(project)
        assert lora.adapter_base(moved) == str((tmp_path / "moved" / base.relative_to(project)).resolve())
        loaded = PretrainedModelDataset(str(moved)).load()["model"]
        for (name, a), (_, b) in zip(expected.named_parameters(), loaded.named_parameters(), strict=True):
            assert torch.equal(a, b), name  # the same merge of the same files


def test_auto_targets_of_a_multimodal_model_are_its_language_models_projections():
    """A multimodal Gemma 3 trained on text: `target_modules: auto` knew no `gemma3` family and fell back to
    every Linear layer, the vision tower's too (adapters that text training never reaches, counted as
    trainable). auto takes its language model's family names, in its language model only."""
    from tests.support.tiny_models import multimodal_gemma3

    text = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}  # fmt: skip
    model = multimodal_gemma3(text)
    params = parse_train_params({"model": {"name_or_path": "x", "lora": {"enabled": True}}}).model
    adapted = lora.apply_lora(model, params.lora, gradient_checkpointing="off")
    names = [name for name, module in adapted.named_modules() if hasattr(module, "lora_A")]
    assert names and all(".language_model." in name for name in names), names
    kinds = {name.rsplit(".", 1)[-1] for name in names}
    assert kinds == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


@pytest.mark.parametrize(
    ("family", "targets"),
    [
        ("llama", ["q_proj", "lm_head"]),
        ("llama", ["q_proj", "embed_tokens"]),
        ("llama", ["embed_tokens", "lm_head"]),
        ("llama", ["q_proj"]),
        ("bart", ["q_proj", "lm_head"]),
        ("bart", ["q_proj", "embed_tokens"]),
        ("bart", ["q_proj"]),
    ],
)
def test_an_adapter_on_a_tied_embedding_or_head_merges_into_the_function_it_trained(
    tmp_path, tokenizer, family, targets
):
    """Llama-3.2-1B/3B and Qwen3-4B tie their head to the input embedding, BART its encoder's and decoder's
    embeddings and head to one table: an adapter on one of them (as target_modules may name them) was merged
    into the one shared tensor, so all took its change (a report's test loss 16.72 for a trained 6.16;
    merge-adapter's folder likewise), and a BART folder merged with its head untied lost its encoder's and
    decoder's embeddings on reload. The merge unties them first where an adapter sits on one; a base whose
    adapters leave them alone stays tied."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from tests.support.tiny_seq2seq import tiny_seq2seq

    if family == "bart":
        tiny_seq2seq("bart").save_pretrained(tmp_path / "base")
        base, auto, vocab = tmp_path / "base", AutoModelForSeq2SeqLM, 64
    else:
        base = save_tiny_llama(tmp_path / "base", tokenizer, tied=True)
        auto, vocab = AutoModelForCausalLM, None
    peft_model = get_peft_model(
        auto.from_pretrained(base), LoraConfig(r=4, lora_alpha=8, target_modules=targets)
    )
    with torch.no_grad():  # B (and an embedding adapter's A, which peft starts at 0) away from 0
        for name, param in peft_model.named_parameters():
            if "lora_B" in name or "lora_embedding_" in name:
                param.normal_(0, 0.5)
    peft_model.save_pretrained(tmp_path / "adapter")
    ids = torch.randint(0, vocab or len(tokenizer), (2, 12), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, **({"decoder_input_ids": ids.flip(-1)} if family == "bart" else {})}
    with torch.no_grad():
        trained = peft_model.eval()(**inputs).logits
        merged = lora.merge_adapter(tmp_path / "adapter", base=str(base)).eval()
        torch.testing.assert_close(merged(**inputs).logits, trained, atol=MERGED_ADAPTER_ATOL, rtol=0)
        merged.save_pretrained(tmp_path / "merged")
        again = auto.from_pretrained(tmp_path / "merged").eval()
        torch.testing.assert_close(again(**inputs).logits, trained, atol=MERGED_ADAPTER_ATOL, rtol=0)
    tied = again.get_output_embeddings().weight is again.get_input_embeddings().weight
    assert tied == (targets == ["q_proj"]) and again.config.tie_word_embeddings == tied


@pytest.mark.parametrize("head", ["bos", "none"])
def test_an_encoder_decoder_adapter_loads_and_merges_generating_as_it_trained(tmp_path, head):
    """An encoder-decoder trained with LoRA generates from the decoder prefix it trained on
    (``generate_as_trained``: its start token, then the ``<s>`` a BART-style tokenizer puts before a text,
    forced; a tokenizer that puts none before a text, KoBART's, has a base's forced ``<s>`` dropped); its
    adapter folder loaded (the report, predict) and merged (merge-adapter, its folder read back) generate the
    same ids. Was: the adapter folder kept no generation config, so they generated from the base's (without
    the forced ``<s>``, or with the one the base forces), where a full fine-tune's folder generates as
    trained."""
    from transformers import AutoModelForSeq2SeqLM

    from fastlm.datasets import PretrainedModelDataset
    from fastlm.engine.model.encoder_decoder import generate_as_trained
    from tests.support.tiny_seq2seq import bart_style_tokenizer

    tokenizer = bart_style_tokenizer()
    base, peft_model = _seq2seq_adapter(tmp_path, tokenizer, forced_by_base=head != "bos")
    ends = (tokenizer.bos_token_id,) if head == "bos" else ()
    generate_as_trained(peft_model, base.config.decoder_start_token_id, ends)
    PretrainedModelDataset(str(tmp_path / "adapter")).save({"model": peft_model, "tokenizer": tokenizer})
    texts = ["summarize the dialogue", "a short summary please"]
    prompts = tokenizer(texts, padding=True, return_tensors="pt")

    def generated(model):
        with torch.no_grad():
            return model.eval().generate(**prompts, max_new_tokens=6, num_beams=2, do_sample=False).tolist()

    trained = generated(peft_model)
    # the forced <s> after the start token; none forced: another first token
    assert all((row[1] == tokenizer.bos_token_id) == (head == "bos") for row in trained)
    merged = lora.merge_adapter(tmp_path / "adapter")
    merged.save_pretrained(tmp_path / "merged")
    for model in (
        PretrainedModelDataset(str(tmp_path / "adapter")).load()["model"],
        merged,
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "merged"),
    ):
        assert generated(model) == trained


def _seq2seq_adapter(tmp_path, tokenizer, *, forced_by_base: bool):
    """A tiny BART base saved in ``tmp_path/base`` (its generation config forcing ``<s>`` first where
    ``forced_by_base``) and a LoRA over it whose B matrices are random (an adapter that changes outputs)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSeq2SeqLM

    from tests.support.tiny_seq2seq import tiny_seq2seq

    base = tiny_seq2seq("bart")
    base.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    base.generation_config.forced_bos_token_id = tokenizer.bos_token_id if forced_by_base else None
    base.save_pretrained(tmp_path / "base")
    peft_model = get_peft_model(
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "base"),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    return base, peft_model


@pytest.mark.parametrize("bos_before_text", [True, False])
def test_an_encoder_decoder_adapter_saved_without_its_generation_config_generates_as_it_trained(
    tmp_path, bos_before_text, caplog
):
    """An encoder-decoder adapter folder saved before adapters kept their generation config (no
    ``generation_config.json``) is given the setting its training used, rebuilt from the folder's tokenizer
    (the ``<s>`` it puts before a text forced, or none) and the base's decoder start, said once in the log:
    loaded and merged, it has the generation settings and the greedy generations of the same adapter saved
    with its generation config. Was: it generated from the base's generation config, without a word."""

    from fastlm.datasets import PretrainedModelDataset
    from fastlm.engine.data.collators import TextEnds
    from fastlm.engine.model.encoder_decoder import generate_as_trained
    from tests.support.tiny_seq2seq import bart_style_tokenizer

    tokenizer = bart_style_tokenizer(bos_before_text)
    base, peft_model = _seq2seq_adapter(tmp_path, tokenizer, forced_by_base=not bos_before_text)
    generate_as_trained(peft_model, base.config.decoder_start_token_id, TextEnds.of(tokenizer).head)
    PretrainedModelDataset(str(tmp_path / "new")).save({"model": peft_model, "tokenizer": tokenizer})
    shutil.copytree(tmp_path / "new", tmp_path / "old")
    (tmp_path / "old" / lora.GENERATION_CONFIG).unlink()
    prompts = tokenizer(
        ["summarize the dialogue", "a short summary please"], padding=True, return_tensors="pt"
    )
    settings = ("decoder_start_token_id", "forced_bos_token_id", "bos_token_id", "eos_token_id")

    def generation(model):
        with torch.no_grad():
            ids = model.eval().generate(**prompts, max_new_tokens=6, do_sample=False).tolist()
        config = model.generation_config
        return {name: getattr(config, name) for name in settings}, model.config.decoder_start_token_id, ids

    caplog.set_level(logging.INFO, logger="fastlm.engine.model.lora")
    for load in (
        lambda folder: lora.merge_adapter(folder),
        lambda folder: PretrainedModelDataset(str(folder)).load()["model"],
    ):
        assert generation(load(tmp_path / "old")) == generation(load(tmp_path / "new"))
    said = [record.getMessage() for record in caplog.records if lora.GENERATION_CONFIG in record.getMessage()]
    assert len(said) == 1 and "\n" not in said[0] and str(tmp_path / "old") in said[0], caplog.messages
