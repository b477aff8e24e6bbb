"""The LoRA adapter folder on a local tiny Llama (and tiny BART) checkpoint: saved with the record of its base
weights, loaded and merged over the base it trained on (a QLoRA one over its 4-bit weights), a changed,
moved or missing base refused or found, the merged folder in the base's saved dtype with its ties, an
encoder-decoder adapter generating as it trained (the fixtures: conftest.py)."""

import copy
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fastlm.engine.config import parse_train_params
from fastlm.engine.model import adapter_folder, lora
from fastlm.engine.model.build import build_model
from fastlm.errors import ConfigError, find_user_error
from tests.support import background
from tests.support.lora_models import MAX_LENGTH, model_params, run_train, train_params
from tests.support.tiny_llama import save_tiny_llama
from tests.support.tolerances import BF16_VS_FP32, MERGED_ADAPTER_ATOL

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

REPO = Path(__file__).resolve().parents[3]


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
    unmerged = adapter_folder.load_adapter_model(out, merge=False)
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
            for model in (merged, adapter_folder.merge_adapter(out).eval()):
                torch.testing.assert_close(
                    model(input_ids=ids).logits, expected, rtol=0, atol=MERGED_ADAPTER_ATOL
                )


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
    adapter_folder.merge_adapter(adapter, base=str(moved))

    save_tiny_llama(base, tokenizer, seed=1)  # another model of the same shape in the base folder
    for load in (
        lambda: PretrainedModelDataset(str(adapter)).load(),
        lambda: adapter_folder.merge_adapter(adapter),
    ):
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


def test_the_merged_folder_generates_with_the_tokenizers_pad_as_a_full_fine_tune_does(
    tmp_path, base_dir, tokenizer
):
    """A full fine-tune's folder records the tokenizer's pad id in its generation config (a base whose
    generation config has none); the merged folder of an adapter kept the base's, without one, so a user's
    batched ``generate`` padded with the EOS and warned. The merged folder records it too."""
    from transformers import GenerationConfig

    from fastlm.__main__ import merge_adapter_command

    padded = copy.deepcopy(tokenizer)
    padded.pad_token = padded.eos_token  # as the split gives a tokenizer without a pad token one
    assert GenerationConfig.from_pretrained(base_dir).pad_token_id is None
    _, adapter = _adapter(tmp_path, base_dir, padded)
    out = tmp_path / "merged"
    assert merge_adapter_command(["--adapter", str(adapter), "--out", str(out)]) == 0
    generation = GenerationConfig.from_pretrained(out)
    assert generation.pad_token_id == padded.pad_token_id is not None
    assert generation.eos_token_id == padded.eos_token_id


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
    digest = json.loads((adapter / adapter_folder.BASE_DIGEST).read_text())
    assert "quantized" in digest and digest["quantized"] is None  # a 32-bit base, recorded as such
    lines = module_log_lines(monkeypatch, adapter_folder)

    def merged_warnings(out: str) -> list[str]:
        lines.clear()
        assert merge_adapter_command(["--adapter", str(adapter), "--out", str(tmp_path / out)]) == 0
        capsys.readouterr()
        return [line for line in lines if "4-bit" in line or "load_in_4bit" in line]

    assert merged_warnings("recorded") == []
    del digest["quantized"]  # as an earlier fastlm saved it
    (adapter / adapter_folder.BASE_DIGEST).write_text(json.dumps(digest))
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
    unmerged = adapter_folder.load_adapter_model(
        adapter, merge=False
    ).eval()  # fp32; a QLoRA one on its NF4 weights
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
    assert adapter_folder.saved_dtype(mixed) == torch.bfloat16
    binary = tmp_path / "binary"
    LlamaConfig(hidden_size=8, num_attention_heads=2, dtype="float16").save_pretrained(binary)
    (binary / "pytorch_model.bin").write_bytes(b"")
    assert adapter_folder.saved_dtype(binary) == torch.float16


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
    adapter_folder.merge_adapter(tmp_path / "adapter", base=str(base)).save_pretrained(tmp_path / "merged")
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
        adapter_folder.load_adapter_model(adapter)
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
        adapter_folder.merge_adapter(adapter)


def test_an_adapter_saved_without_a_base_digest_loads_with_one_warning(tmp_path, base_dir, tokenizer, caplog):
    from fastlm.datasets import PretrainedModelDataset

    _, adapter = _adapter(tmp_path, base_dir, tokenizer)
    (adapter / adapter_folder.BASE_DIGEST).unlink()  # as an earlier fastlm saved it
    with caplog.at_level(logging.WARNING):
        PretrainedModelDataset(str(adapter)).load()
        adapter_folder.merge_adapter(adapter)
    warned = [record for record in caplog.records if adapter_folder.BASE_DIGEST in record.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0].getMessage(), caplog.messages


def _untrained_adapter(tmp_path, base_dir, tokenizer):
    """A LoRA model over a copy of the base (``tmp_path/base``), as built for training, not trained."""
    base = tmp_path / "base"
    shutil.copytree(base_dir, base)
    return build_model(
        parse_train_params({"model": model_params(base)}).model,
        tokenizer,
        max_length=MAX_LENGTH,
        attn_implementation="sdpa",
    )


def test_an_adapter_without_a_base_digest_is_said_saved_elsewhere_or_by_fastlm_as_it_was(
    tmp_path, base_dir, tokenizer, caplog
):
    """An adapter folder peft saved itself (``save_pretrained``: no training_data.json, no
    base_digest.json) loaded with a warning that it was "saved by an earlier fastlm": wrong about where it
    came from. It is said to hold none of fastlm's training records, that its base weights cannot be
    checked and what to do; a folder fastlm's train pipeline wrote (its training_data.json) without
    base_digest.json is said to be fastlm's, with why it may lack the digest."""
    from fastlm.datasets import PretrainedModelDataset
    from fastlm.datasets.pretrained_model import TRAINING_DATA

    model = _untrained_adapter(tmp_path, base_dir, tokenizer)
    elsewhere, ours = tmp_path / "elsewhere", tmp_path / "ours"
    model.save_pretrained(str(elsewhere))  # as peft saves it, beside the tokenizer
    tokenizer.save_pretrained(str(elsewhere))
    PretrainedModelDataset(str(ours)).save({"model": model, "tokenizer": tokenizer, "training_data": {}})
    (ours / adapter_folder.BASE_DIGEST).unlink()
    assert (ours / TRAINING_DATA).is_file() and not (elsewhere / TRAINING_DATA).exists()

    def warning(folder: Path) -> str:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            PretrainedModelDataset(str(folder)).load()
        said = [record.getMessage() for record in caplog.records if "base_digest.json" in record.getMessage()]
        assert len(said) == 1 and "\n" not in said[0], caplog.messages
        return said[0]

    said = warning(elsewhere)
    assert "earlier fastlm" not in said, said
    assert (
        f"{elsewhere} holds none of fastlm's training records (training_data.json, base_digest.json)" in said
    )
    assert "cannot be checked" in said and f"Fix: make sure {tmp_path / 'base'} holds" in said, said
    said = warning(ours)
    assert f"{ours} was written by fastlm's train pipeline (its training_data.json)" in said, said
    assert "cannot be checked" in said and "kedro run --pipeline=train" in said, said


def test_an_adapter_folder_without_a_tokenizer_is_refused_naming_the_command_that_adds_its_bases(
    tmp_path, base_dir, tokenizer
):
    """An adapter folder saved without its tokenizer (peft's ``save_pretrained`` alone) was refused with
    "save the model's tokenizer into the folder": which tokenizer, and how, was left to guess. The fix names
    the command that saves the tokenizer of the base its adapter_config.json records into the folder
    (predict has no parameter naming a tokenizer apart from the model)."""
    from fastlm.datasets import PretrainedModelDataset

    model = _untrained_adapter(tmp_path, base_dir, tokenizer)
    folder = tmp_path / "adapter"
    model.save_pretrained(str(folder))
    recorded = json.loads((folder / adapter_folder.ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
    for load in (
        PretrainedModelDataset(str(folder)).load,
        PretrainedModelDataset(str(folder)).load_tokenizer,
    ):
        with pytest.raises(Exception) as refused:  # noqa: PT011 - Kedro wraps a load's error in its own
            load()
        said = str(find_user_error(refused.value))
        assert said.startswith(f"{folder} holds no tokenizer") and "\n" not in said, said
        command = f'AutoTokenizer.from_pretrained("{recorded}").save_pretrained("{folder}")'
        assert command in said.split("Fix:")[1], said


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
        assert adapter_folder.adapter_base(moved) == str(
            (tmp_path / "moved" / base.relative_to(project)).resolve()
        )
        loaded = PretrainedModelDataset(str(moved)).load()["model"]
        for (name, a), (_, b) in zip(expected.named_parameters(), loaded.named_parameters(), strict=True):
            assert torch.equal(a, b), name  # the same merge of the same files


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
        merged = adapter_folder.merge_adapter(tmp_path / "adapter", base=str(base)).eval()
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
    merged = adapter_folder.merge_adapter(tmp_path / "adapter")
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
    """An encoder-decoder adapter folder fastlm's train pipeline saved before adapters kept their generation
    config (its ``training_data.json``, no ``generation_config.json``) is given the setting its training
    used, rebuilt from the folder's tokenizer (the ``<s>`` it puts before a text forced, or none) and the
    base's decoder start, said once in the log: loaded and merged, it has the generation settings and the
    greedy generations of the same adapter saved with its generation config. Was: it generated from the
    base's generation config, without a word."""

    from fastlm.datasets import PretrainedModelDataset
    from fastlm.engine.data.collators import TextEnds
    from fastlm.engine.model.encoder_decoder import generate_as_trained
    from tests.support.tiny_seq2seq import bart_style_tokenizer

    tokenizer = bart_style_tokenizer(bos_before_text)
    base, peft_model = _seq2seq_adapter(tmp_path, tokenizer, forced_by_base=not bos_before_text)
    generate_as_trained(peft_model, base.config.decoder_start_token_id, TextEnds.of(tokenizer).head)
    PretrainedModelDataset(str(tmp_path / "new")).save(
        {"model": peft_model, "tokenizer": tokenizer, "training_data": {}}
    )
    shutil.copytree(tmp_path / "new", tmp_path / "old")
    (tmp_path / "old" / adapter_folder.GENERATION_CONFIG).unlink()
    prompts = tokenizer(
        ["summarize the dialogue", "a short summary please"], padding=True, return_tensors="pt"
    )
    settings = ("decoder_start_token_id", "forced_bos_token_id", "bos_token_id", "eos_token_id")

    def generation(model):
        with torch.no_grad():
            ids = model.eval().generate(**prompts, max_new_tokens=6, do_sample=False).tolist()
        config = model.generation_config
        return {name: getattr(config, name) for name in settings}, model.config.decoder_start_token_id, ids

    caplog.set_level(logging.INFO, logger="fastlm.engine.model.adapter_folder")
    for load in (
        lambda folder: adapter_folder.merge_adapter(folder),
        lambda folder: PretrainedModelDataset(str(folder)).load()["model"],
    ):
        assert generation(load(tmp_path / "old")) == generation(load(tmp_path / "new"))
    said = [
        record.getMessage()
        for record in caplog.records
        if adapter_folder.GENERATION_CONFIG in record.getMessage()
    ]
    assert len(said) == 1 and "\n" not in said[0] and str(tmp_path / "old") in said[0], caplog.messages


def test_an_encoder_decoder_adapter_peft_saved_generates_with_its_bases_generation_config(tmp_path, caplog):
    """An encoder-decoder adapter folder peft saved itself (``save_pretrained``: no ``training_data.json``,
    no ``generation_config.json``) loads and merges with its base's own generation config, as transformers
    and peft load it, said in one line. Was: it was said "saved by an earlier fastlm" and given fastlm's
    training-time settings (the ``<s>`` its tokenizer puts before a text forced first) as if it "generates
    as it trained", for an adapter that may not have trained that way."""
    from peft import PeftModel
    from transformers import AutoModelForSeq2SeqLM

    from fastlm.datasets import PretrainedModelDataset
    from fastlm.datasets.pretrained_model import TRAINING_DATA
    from tests.support.tiny_seq2seq import bart_style_tokenizer

    tokenizer = bart_style_tokenizer(True)  # <s> before a text: fastlm's training would force it first
    _, peft_model = _seq2seq_adapter(tmp_path, tokenizer, forced_by_base=False)
    folder = tmp_path / "peft"
    peft_model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    assert not (folder / TRAINING_DATA).exists() and not (folder / adapter_folder.GENERATION_CONFIG).exists()
    settings = ("decoder_start_token_id", "forced_bos_token_id", "bos_token_id", "eos_token_id")

    def generation(model):
        return {name: getattr(model.generation_config, name) for name in settings}, (
            model.config.decoder_start_token_id
        )

    as_peft_loads = PeftModel.from_pretrained(
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "base"), folder
    )
    assert generation(as_peft_loads)[0]["forced_bos_token_id"] is None
    caplog.set_level(logging.INFO, logger="fastlm.engine.model.adapter_folder")
    for load in (
        lambda: adapter_folder.merge_adapter(folder),
        lambda: PretrainedModelDataset(str(folder)).load()["model"],
    ):
        assert generation(load()) == generation(as_peft_loads)
    said = [
        record.getMessage()
        for record in caplog.records
        if adapter_folder.GENERATION_CONFIG in record.getMessage()
    ]
    assert len(said) == 1 and "\n" not in said[0] and str(folder) in said[0], caplog.messages
    assert "earlier fastlm" not in said[0] and "as it trained" not in said[0], said
    assert "base's generation config" in said[0], said


def test_the_tokenizer_command_is_one_shell_word_though_a_path_holds_a_quote(tmp_path):
    """The fix's ``python -c '...'`` command broke in the shell where the base or the folder held a single
    quote (``it's``): the command is now quoted for the shell, and reads back as the Python that saves the
    base's tokenizer into the folder."""
    import shlex

    from fastlm.datasets import PretrainedModelDataset

    folder = tmp_path / "it's adapter"
    folder.mkdir()
    base = "/models/o'brien base"
    (folder / adapter_folder.ADAPTER_CONFIG).write_text(json.dumps({"base_model_name_or_path": base}))
    with pytest.raises(Exception) as refused:  # noqa: PT011 - Kedro wraps a load's error in its own
        PretrainedModelDataset(str(folder)).load_tokenizer()
    fix = str(find_user_error(refused.value)).split("Fix:")[1]
    words = shlex.split(fix.split(": ", 1)[1].split(" (a training")[0])
    assert words[:2] == ["python", "-c"] and len(words) == 3, words
    assert (
        f"AutoTokenizer.from_pretrained({json.dumps(base)}).save_pretrained({json.dumps(str(folder))})"
        in words[2]
    )


@pytest.mark.parametrize("targets", [["q_proj", "embed_tokens"], ["embed_tokens", "lm_head"]])
def test_an_adapter_on_the_input_embedding_saves_and_merges_into_the_model_it_trained(
    tmp_path, base_dir, tokenizer, targets
):
    """``target_modules`` naming ``embed_tokens`` (peft's LoRA Embedding wraps it): the save read
    ``num_embeddings`` of that wrapper, which has none, and every such training ended in an AttributeError
    traceback after its last step (its model never written, the same again on each rerun). It saves, and
    the folder merges into the function the model computed."""
    params = parse_train_params({"model": model_params(base_dir, target_modules=targets)}).model
    model = build_model(params, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    with torch.no_grad():  # every adapter away from its start (an embedding adapter's A starts at 0)
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    adapter_folder.save_adapter(model, tmp_path / "adapter")
    ids = torch.randint(0, len(tokenizer), (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        trained = model.eval()(input_ids=ids).logits
        merged = adapter_folder.merge_adapter(tmp_path / "adapter").eval()
        torch.testing.assert_close(merged(input_ids=ids).logits, trained, atol=MERGED_ADAPTER_ATOL, rtol=0)


def test_merge_adapter_given_a_file_as_out_a_missing_adapter_or_a_checkpoint_says_so_in_one_line(
    tmp_path, base_dir, tokenizer, capsys
):
    """``--out`` naming an existing file (with or without ``--overwrite``): a NotADirectoryError traceback
    from the check for a non-empty folder, the file kept; ``--adapter`` naming a folder that does not exist,
    or a training checkpoint (the folder holding model.safetensors a user finds first), was "not a LoRA
    adapter folder (no adapter_config.json)". One line each, exit 2, nothing written."""
    from fastlm.__main__ import merge_adapter_command
    from fastlm.engine.checkpoint.layout import MARKER

    _, adapter = _adapter(tmp_path, base_dir, tokenizer)
    file = tmp_path / "notes.txt"
    file.write_text("keep me", encoding="utf-8")
    checkpoint = tmp_path / "checkpoints" / "lora1" / "checkpoint-00000006"
    checkpoint.mkdir(parents=True)
    (checkpoint / MARKER).write_text("", encoding="utf-8")
    (checkpoint / "model.safetensors").write_bytes(b"")
    cases = [
        (["--adapter", str(adapter), "--out", str(file)], f"--out {file} is a file"),
        (["--adapter", str(adapter), "--out", str(file), "--overwrite"], f"--out {file} is a file"),
        (["--adapter", str(tmp_path / "gone"), "--out", str(tmp_path / "m")], "does not exist"),
        (["--adapter", str(checkpoint), "--out", str(tmp_path / "m")], "checkpoint of the training lora1"),
    ]
    for argv, said in cases:
        assert merge_adapter_command(argv) == 2, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and said in lines[0] and "Fix:" in lines[0], lines
    assert file.read_text(encoding="utf-8") == "keep me" and not (tmp_path / "m").exists()


def test_a_base_given_as_a_folder_that_does_not_exist_is_said_to_be_mistyped(
    tmp_path, base_dir, tokenizer, capsys
):
    """``merge-adapter --base <typo>``: the folder the user typed does not exist. Said as the path given,
    with the fix of giving the folder that holds the base. Was: "put the base model back there", the advice
    for a recorded base that moved away."""
    from fastlm.__main__ import merge_adapter_command

    _, adapter = _adapter(tmp_path, base_dir, tokenizer)
    gone = tmp_path / "nonexist"
    assert (
        merge_adapter_command(["--adapter", str(adapter), "--base", str(gone), "--out", str(tmp_path / "m")])
        == 2
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"--base {gone} does not exist" in lines[0], lines
    assert "put the base model back" not in lines[0] and "Fix:" in lines[0], lines
    assert not (tmp_path / "m").exists()


def test_a_base_folder_that_holds_no_model_or_an_adapter_is_named_as_such(
    tmp_path, base_dir, tokenizer, capsys
):
    """``merge-adapter --base`` naming a folder without a model (``conf``), or an adapter folder (the
    adapter's own, another run's): "no longer holds the weights the adapter was trained on (21 of 21 weights
    differ: lm_head.weight is gone, ...)", as if a base had been replaced; said for what it is, one line."""
    from fastlm.__main__ import merge_adapter_command

    _, adapter = _adapter(tmp_path, base_dir, tokenizer)
    other = tmp_path / "other"
    shutil.copytree(adapter, other)
    empty = tmp_path / "conf"
    empty.mkdir()
    (empty / "parameters.yml").write_text("a: 1\n", encoding="utf-8")
    for base, said in [(empty, "holds no model (no config.json)"), (other, "is a LoRA adapter folder")]:
        argv = ["--adapter", str(adapter), "--base", str(base), "--out", str(tmp_path / "merged")]
        assert merge_adapter_command(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and f"base model folder {base}" in lines[0] and said in lines[0], lines
        assert "no longer holds" not in lines[0] and "Fix:" in lines[0], lines
    assert not (tmp_path / "merged").exists()
