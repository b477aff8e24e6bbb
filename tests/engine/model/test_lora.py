"""LoRA on a local tiny Llama checkpoint (saved with save_pretrained, no hub): adapters only train, the
completion-only packed path is kept, checkpoints resume, the adapter saves and merges to the same logits (the
adapter folder itself: test_adapter_folder.py; the fixtures: conftest.py)."""

import json
import logging
import math
import shutil

import numpy as np
import pytest
import torch

from fastlm.engine.checkpoint.discovery import latest_checkpoint
from fastlm.engine.config import parse_train_params
from fastlm.engine.model import adapter_folder, lora
from fastlm.engine.model import loss as loss_fns
from fastlm.engine.model.build import build_model
from fastlm.engine.train.optim import make_adamw
from fastlm.errors import ConfigError
from tests.support.lora_models import MAX_LENGTH, model_params, run_train, train_params
from tests.support.packages import hide_package
from tests.support.tiny_llama import llama_style_tokenizer, save_tiny_llama
from tests.support.tolerances import (
    MERGED_ADAPTER_ATOL,
    OTHER_FP32_MODEL,
    TRAINED_FP32_LOSS_REL,
    reordered_sum_rtol,
)

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too


def assert_merges_to_the_unmerged_logits(folder, pairs) -> None:
    """The saved adapter merged into its base gives the unmerged model's logits (the merge rounds once per
    weight)."""
    merged = adapter_folder.merge_adapter(folder).eval()
    unmerged = adapter_folder.load_adapter_model(folder, merge=False).eval()
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
    merged = adapter_folder.merge_adapter(out)
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
    adapter_folder.save_adapter(result.model, out)
    config = json.loads((out / "adapter_config.json").read_text())
    # twice the rank at the same scaling: alpha / r, or alpha / sqrt(r) rank-stabilized
    alpha = 8 * math.sqrt(2) if rslora else 16
    assert (config["r"], config["init_lora_weights"]) == (8, True) and config["lora_alpha"] == pytest.approx(
        alpha
    )
    merged = adapter_folder.merge_adapter(out).eval()  # onto the base folder's weights, not the residual ones
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


@pytest.mark.parametrize("init", ["pissa", "pissa_niter_2", "olora"])
def test_pissa_or_olora_of_a_rank_above_a_layers_is_refused_in_one_line(base_dir, tokenizer, init):
    """``r`` 24 on the tiny Llama, whose k_proj and v_proj map 32 features to 16: their weights have rank 16
    at most, so the decomposition keeps 16 directions there (peft cuts the SVD or QR), the run trains rank-16
    adapters where the config says 24, and the saved adapter (twice the rank, 48 in its config, 32 in its
    tensors) no longer loads: the report, predict, merge-adapter and transformers all failed with peft's
    size-mismatch traceback after a run that had said it finished. Refused as the model is built, in one line
    naming the layers, their rank and the fixes."""
    params = parse_train_params({"model": model_params(base_dir, init=init, r=24)}).model
    with pytest.raises(ConfigError) as refused:
        build_model(params, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    message = str(refused.value)
    assert "\n" not in message, message
    assert message.startswith("train.model.lora.r = 24 is more than"), message
    assert "k_proj, v_proj" in message and "16" in message and "q_proj" not in message.split(" Fix: ")[0]
    assert "train.model.lora.r to at most 16" in message and "init: default" in message, message
    # a rank every adapted layer holds trains as before (the layers' 16 output features: rank 16 is kept)
    fits = parse_train_params({"model": model_params(base_dir, init=init, r=16)}).model
    model = build_model(fits, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    ranks = {p.shape[0] for name, p in model.named_parameters() if "lora_A" in name}
    assert ranks == {16}, ranks


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


@pytest.mark.parametrize(
    ("lora_settings", "both"),
    [
        ({"target_modules": ["q_proj"], "modules_to_save": ["q_proj"]}, "q_proj"),
        ({"target_modules": ["q_proj", "v_proj"], "modules_to_save": ["q_proj"]}, "q_proj"),
        ({"target_modules": "auto", "modules_to_save": ["down_proj", "lm_head"]}, "down_proj"),
    ],
)
def test_a_module_named_both_to_adapt_and_to_train_in_full_is_refused_in_one_line(
    base_dir, tokenizer, lora_settings, both
):
    """peft gives ``modules_to_save`` the precedence: a module named in both is trained in full, not adapted.
    Every target in it: peft's "No modules were targeted for adaptation", with the fix "set target_modules to
    auto or to Linear module names" (q_proj is one); some of them (auto's projections among them): those
    trained in full without a word. One line names the module and the two ways out."""
    params = parse_train_params({"model": model_params(base_dir, **lora_settings)}).model
    with pytest.raises(ConfigError) as error:
        build_model(params, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    message = str(error.value)
    assert "\n" not in message and "Fix:" in message, message
    assert f"train.model.lora.target_modules and train.model.lora.modules_to_save both name {both}" in message
    assert "auto or to Linear module names" not in message, message


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


def test_qlora_counts_and_costs_its_4bit_base_as_lora_does_the_same_base(
    tmp_path, base_dir, tokenizer, pairs
):
    """bitsandbytes packs two 4-bit weights in each byte of a ``Params4bit``: summed as ``numel()``, a QLoRA
    run's ``parameters`` left out half of every quantized matrix (76,960 against its own
    ``total_parameters`` 86,176 on a tiny Llama; ~55 % of a 3B model's), and its FLOPs per token, so its
    MFU, came out lower than the same model's under LoRA. Counted unpacked, the two are the same model."""
    pytest.importorskip("bitsandbytes", reason="the dev install brings it: pip install -e .[dev]")
    runs = {}
    for four_bit in (False, True):
        params = train_params(
            tmp_path / str(four_bit),
            base_dir,
            model=model_params(base_dir, load_in_4bit=four_bit, base_dtype="fp32"),
            runtime={"device": "cpu", "precision": "fp32"},
        )
        result = run_train(params, tokenizer, pairs)
        runs[four_bit] = {
            **result.summary,
            **lora.parameter_counts(result.model),
        }  # as the train node adds them
    plain, quantized = runs[False], runs[True]
    assert (
        quantized["parameters"]
        == plain["parameters"]
        == plain["total_parameters"]
        == quantized["total_parameters"]
    )
    assert quantized["flops_per_token"] == plain["flops_per_token"]
