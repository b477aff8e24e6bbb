"""LoRA adapters through peft, applied as the model is built: which modules get adapters, frozen base
weights, QLoRA, and what a model that trains part of its weights saves and loads back.

``train.model.lora`` (``LoraParams``) turns it on for a pretrained ``train.model.name_or_path``. The base
model is frozen (bf16 on GPUs that have it: half the memory of fp32, and LoRA needs no fp32 master copy of
frozen weights); the adapters are fp32 (peft's ``autocast_adapter_dtype``) and are all the optimizer sees
(``optim`` skips frozen parameters). The packed path is unchanged: adapters wrap Linear layers, attention and
its block-diagonal mask are the base model's.

Gradient checkpointing with frozen embeddings: the embedding output does not require grad, so a *reentrant*
checkpoint would see no input needing a gradient and drop the adapters' gradients. fastlm checkpoints
non-reentrantly (``use_reentrant=False``), which does not need it, and also calls
``enable_input_require_grads`` so that any reentrant path still works.

QLoRA (``load_in_4bit``): NF4 base weights with double quantization (``BitsAndBytesConfig``), dequantized to
and multiplied in ``base_dtype`` (auto: bf16; ``qlora_compute_dtype``), then ``prepare_quantized`` (frozen,
everything that is not 4-bit left in the compute dtype, norms and head included, unlike peft's
``prepare_model_for_kbit_training``); it needs the bitsandbytes package (on CUDA, or on CPU from its version
0.50) and is refused with one line without it. On a GPU without native bf16 (T4, V100) it trains rather than
being refused: the 4-bit matmuls compute in fp16, as the runtime's autocast does there (emulated bf16 would be
slow and would disagree with it), and the fp16 GradScaler is safe because everything it unscales is fp32: the
adapters (peft's ``autocast_adapter_dtype``), ``modules_to_save`` (cast to fp32 after ``get_peft_model``), and
nothing frozen (the optimizer holds the trainable parameters only).

A LoRA model trains its adapters alone (``trains_part_only``): what it checkpoints and what a worker hands
back is those (``load_trained_weights`` reads them back), so the resume digest records the base weights too
(``resume.run_digest``). The adapter folder on disk (saving, the record of the base weights it trains on,
loading and merging) is ``adapter_folder``'s; the content digests of weight folders, ``weights_identity``'s.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import re
import time

import torch

from fastlm.engine import config as engine_config
from fastlm.engine.config import LoraParams, ModelParams
from fastlm.errors import ConfigError

log = logging.getLogger(__name__)

PARAM = "train.model.lora"
_ATTENTION_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DEFAULT_TARGETS: dict[str, list[str]] = {
    **{
        name: _ATTENTION_MLP
        for name in (
            "llama",
            "mistral",
            "mixtral",
            "qwen2",
            "qwen3",
            "gemma",
            "gemma2",
            "gemma3_text",
            "olmo2",
            "exaone",
            "solar",
        )
    },
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],  # q/k/v and gate/up fused
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    # encoder-decoder families: self- and cross-attention and the feed-forward, in encoder and decoder alike
    **{name: ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"] for name in ("bart", "mbart")},
    **{name: ["q", "k", "v", "o", "wi", "wi_0", "wi_1", "wo"] for name in ("t5", "mt5", "umt5")},
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def check_supported(params: ModelParams) -> None:
    """Refuse, with one line, LoRA without a pretrained base and 4-bit weights without bitsandbytes (or with
    one too old for CPU on a machine without CUDA: ``config.bitsandbytes_missing``)."""
    if params.name_or_path is None:
        raise ConfigError(
            f"{PARAM}.enabled is true but train.model.name_or_path is null: LoRA adapts a pretrained model.",
            fix="set train.model.name_or_path to a local save_pretrained folder, or set "
            "train.model.lora.enabled: false.",
        )
    if params.lora.load_in_4bit:
        missing = engine_config.bitsandbytes_missing()
        if missing:
            raise ConfigError(
                f"{PARAM}.load_in_4bit is true but {missing} (4-bit QLoRA weights run through bitsandbytes, "
                "on CUDA or, from its version 0.50, on CPU).",
                fix=f"set {PARAM}.load_in_4bit: false (LoRA on bf16/fp32 weights), or "
                "`pip install 'bitsandbytes>=0.50'`.",
            )


def _native_bf16() -> bool:
    """bf16 tensor cores (Ampere and newer), as ``runtime.environment.gpu_has_native_bf16`` decides the
    training precision: torch's plain ``is_bf16_supported()`` also says yes for emulated bf16 (T4, V100)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def base_dtype(lora: LoraParams) -> torch.dtype:
    """The frozen base weights' dtype: ``auto`` = bf16 on a GPU that has it natively, else fp32."""
    if lora.base_dtype != "auto":
        return DTYPES[lora.base_dtype]
    return torch.bfloat16 if _native_bf16() else torch.float32


def qlora_compute_dtype(lora: LoraParams) -> torch.dtype:
    """The 4-bit matmuls' dtype (what the weights are dequantized to and multiplied in; also the frozen
    embedding, head and norms): ``lora.base_dtype`` where given (fp32: a run with mixed precision off), else
    bf16 where the GPU has it natively or on CPU, else fp16 (the runtime then trains in fp16 with a
    GradScaler; see the module docstring)."""
    if lora.base_dtype != "auto":
        return DTYPES[lora.base_dtype]
    return torch.bfloat16 if _native_bf16() or not torch.cuda.is_available() else torch.float16


def load_kwargs(lora: LoraParams) -> dict:
    """Extra ``from_pretrained`` arguments for the base model (dtype; 4-bit quantization for QLoRA)."""
    if not lora.load_in_4bit:
        return {"dtype": base_dtype(lora)}
    from transformers import BitsAndBytesConfig

    compute = qlora_compute_dtype(lora)
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute,
    )
    device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
    return {"dtype": compute, "quantization_config": quantization, "device_map": {"": device}}


def target_modules(model, requested) -> list[str] | str:
    """``auto``: the architecture's attention and MLP projections (``DEFAULT_TARGETS``; a multimodal model's:
    its language model's family, in its language model only, a pattern peft matches), else every Linear layer
    except the output head (peft's ``all-linear``)."""
    if requested != "auto":
        return requested
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not config:  # multimodal: its language model's family, in its language model only
        names = DEFAULT_TARGETS.get(getattr(text, "model_type", ""))
        inside = [name for name, _ in model.named_modules() if name.endswith("language_model")]
        if names and inside:
            return rf".*{re.escape(inside[0])}\..*\.({'|'.join(names)})"
    return DEFAULT_TARGETS.get(getattr(config, "model_type", ""), "all-linear")


def _matches_target(name: str, module_name: str) -> bool:
    """peft's rule for a listed target: the module is called ``name`` or its name ends in ``.<name>``."""
    return module_name == name or module_name.endswith(f".{name}")


def _matches_saved(name: str, module_name: str) -> bool:
    """peft's rule for ``modules_to_save``: the module's name ends in ``name``."""
    return module_name.endswith(name)


def check_named_modules(model, lora: LoraParams) -> None:
    """Every module a LoRA setting names exists in ``model`` (matched as peft matches it), else one line with
    the missing names and names the model has. peft adapts the names it finds and drops the others silently.

    ``target_modules: auto`` is not checked name by name: it lists an architecture family's names, some of
    which a given member lacks (T5's ``wi`` or ``wi_0``/``wi_1``); peft refuses it when none is found.
    """
    named = [name for name, _ in model.named_modules() if name]
    requested = [("target_modules", lora.target_modules, _matches_target, _adaptable_names(model))]
    if lora.modules_to_save:
        requested.append(("modules_to_save", lora.modules_to_save, _matches_saved, _weighted_names(model)))
    for param, names, matches, candidates in requested:
        if not isinstance(names, list):  # auto / all-linear
            continue
        missing = [name for name in names if not any(matches(name, module) for module in named)]
        if missing:
            close = [found for name in missing for found in difflib.get_close_matches(name, candidates, n=2)]
            shown = list(dict.fromkeys(close + candidates))
            listed = ", ".join(shown[:8]) + (", ..." if len(shown) > 8 else "")
            raise ConfigError(
                f"{PARAM}.{param} names {', '.join(missing)}, which no module of the model "
                f"({type(model).__name__}) is called or ends with: peft would leave "
                f"{'it' if len(missing) == 1 else 'them'} out.",
                fix=f"name modules the model has (e.g. {listed}) in {PARAM}.{param}"
                + (", or set it to auto." if param == "target_modules" else ", or remove the missing names."),
            )
    _refuse_adapted_and_saved(model, lora, named)


def _refuse_adapted_and_saved(model, lora: LoraParams, named: list[str]) -> None:
    """One line where a module is both a LoRA target (listed, or one of ``auto``'s) and saved in full
    (``modules_to_save``): peft trains it in full and leaves it unadapted (``modules_to_save`` takes
    precedence), silently, or, where every target is one, with its "No modules were targeted for
    adaptation"."""
    targets = target_modules(model, lora.target_modules)
    if not lora.modules_to_save or not isinstance(targets, list):  # all-linear / a pattern: peft's own rules
        return
    both = [
        module
        for module in named
        if any(_matches_target(name, module) for name in targets)
        and any(_matches_saved(name, module) for name in lora.modules_to_save)
    ]
    if not both:
        return
    found = list(dict.fromkeys(module.rsplit(".", 1)[-1] for module in both))
    names, it = ", ".join(found), "it" if len(found) == 1 else "them"
    listed = "" if isinstance(lora.target_modules, list) else f" (auto is {', '.join(targets)})"
    raise ConfigError(
        f"{PARAM}.target_modules and {PARAM}.modules_to_save both name {names}: peft would train {it} in "
        f"full and save {it}, with no adapter (modules_to_save takes precedence).",
        fix=f"leave {names} out of {PARAM}.modules_to_save to adapt {it}, or list {PARAM}.target_modules "
        f"without {it}{listed} to train {it} in full.",
    )


def _adaptable_names(model) -> list[str]:
    """The last name component of the layers LoRA can adapt (a weight matrix: Linear, Conv1D, Embedding)."""
    return list(
        dict.fromkeys(
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if name and getattr(getattr(module, "weight", None), "ndim", 0) >= 2
        )
    )


def _weighted_names(model) -> list[str]:
    """The last name component of every module with weights of its own (what ``modules_to_save`` names), the
    embedding and output head first (what it usually names)."""
    from fastlm.engine.model import pretrained

    return list(
        dict.fromkeys(
            [
                *sorted(pretrained.embedding_module_names(model)),
                *(
                    name.rsplit(".", 1)[-1]
                    for name, module in model.named_modules()
                    if name and any(True for _ in module.parameters(recurse=False))
                ),
            ]
        )
    )


def adapted_modules(peft_model) -> list[str]:
    """The names of the modules that carry a LoRA adapter (peft's tuner layers), in model order."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [
        name
        for name, module in peft_model.get_base_model().named_modules()
        if isinstance(module, BaseTunerLayer)
    ]


def _described(names: list[str]) -> str:
    """``q_proj, v_proj (4 modules)``: the distinct last name components and how many modules."""
    short = list(dict.fromkeys(name.rsplit(".", 1)[-1] for name in names))
    return f"{', '.join(short)} ({len(names)} module{'' if len(names) == 1 else 's'})"


def apply_lora(model, lora: LoraParams, *, gradient_checkpointing: str | bool):
    """Wrap ``model`` in a peft LoRA model: base frozen, everything trainable (adapters, ``modules_to_save``)
    in fp32.

    ``gradient_checkpointing``: the policy (``engine.model.recompute``; a boolean is full/off), applied to a
    4-bit base after ``prepare_quantized``, so that ``selective`` stays every other layer.
    """
    from peft import LoraConfig, TaskType, get_peft_model

    from fastlm.engine.model.recompute import enable_checkpointing, resolve_policy

    policy = resolve_policy({True: "full", False: "off"}.get(gradient_checkpointing, gradient_checkpointing))
    if lora.load_in_4bit:
        prepare_quantized(model)
        enable_checkpointing(model, policy)
    if policy != "off":
        model.enable_input_require_grads()
    check_named_modules(model, lora)
    targets = target_modules(model, lora.target_modules)
    task = TaskType.SEQ_2_SEQ_LM if getattr(model.config, "is_encoder_decoder", False) else TaskType.CAUSAL_LM
    config = LoraConfig(
        task_type=task,
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias=lora.bias,
        modules_to_save=lora.modules_to_save,
        use_rslora=lora.use_rslora,
        use_dora=lora.use_dora,
        init_lora_weights={"default": True}.get(lora.init, lora.init),
    )
    started = time.perf_counter()
    try:
        with _seeded_decomposition(lora.init):
            peft_model = get_peft_model(model, config)
    except ValueError as error:  # e.g. target modules not found in the model
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ConfigError(
            f"{PARAM}.target_modules = {lora.target_modules!r} does not fit the model: {first}",
            fix=f"set {PARAM}.target_modules to auto or to Linear module names of the model.",
        ) from error
    transposed = sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in peft_model.named_modules()
            if type(getattr(module, "base_layer", None)).__name__ == "Conv1D"
        }
    )
    if lora.init == "olora" and transposed:  # peft's OLoRA reads W as [out x in]: shapes mismatch in forward
        raise ConfigError(
            f"{PARAM}.init = 'olora' cannot decompose this model's {', '.join(transposed)} layers (GPT-2's "
            "Conv1D holds its weight transposed).",
            fix=f"set {PARAM}.init: pissa or default for this model.",
        )
    if moves_base_weights(lora):
        _refuse_ranks_above_the_layers(peft_model, lora)
    _say_biasless(peft_model, lora.bias)
    for parameter in peft_model.parameters():  # modules_to_save copies keep the base's 16-bit dtype
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()
    saved_modules_compute_in_fp32(peft_model)
    if moves_base_weights(lora):
        _remember_initial_adapters(peft_model)
        log.info(
            "%s init: the adapted weights decomposed in %.1f s (in every process that builds the model)%s",
            init_name(lora.init),
            time.perf_counter() - started,
            "; pissa_niter_<n> draws a randomized SVD, far quicker on large weights"
            if lora.init == "pissa"
            else "",
        )
    if lora.fused_forward:
        from fastlm.engine.model.lora_forward import fuse_lora_forward, group_shared_inputs

        fuse_lora_forward(peft_model)
        if lora.shared_input:
            group_shared_inputs(peft_model)
    counts = parameter_counts(peft_model)
    saved = f"; fully training {', '.join(lora.modules_to_save)}" if lora.modules_to_save else ""
    kind = "DoRA" if lora.use_dora else "LoRA"
    kind += " on a 4-bit NF4 base (QLoRA)" if lora.load_in_4bit else ""
    kind += " (rank-stabilized: alpha / sqrt(r))" if lora.use_rslora else ""
    kind += f" ({init_name(lora.init)} init)" if lora.init != "default" else ""
    log.info(
        "%s r=%d alpha=%g adapting %s%s: %s trainable of %s parameters (%.3f%%)",
        kind,
        lora.r,
        lora.alpha,
        _described(adapted_modules(peft_model)),
        saved,
        f"{counts['trainable_parameters']:,}",
        f"{counts['total_parameters']:,}",
        100 * counts["trainable_share"],
    )
    return peft_model


def _refuse_ranks_above_the_layers(peft_model, lora: LoraParams) -> None:
    """PiSSA and OLoRA take ``r`` directions of each adapted weight (an SVD, a QR), and a weight of ``in`` x
    ``out`` features has at most ``min(in, out)``: peft cuts the decomposition there silently, so such a
    layer trains adapters of that rank where the config says ``r``, and the adapter saved (twice the rank,
    ``save_adapter``) no longer loads onto its base (peft's size-mismatch traceback in the report, predict,
    ``merge-adapter`` and transformers). Refused in one line naming the layers and the largest ``r``."""
    from peft.tuners.lora import LoraLayer

    short: dict[str, int] = {}
    for name, module in peft_model.get_base_model().named_modules():
        decomposed = getattr(module, "lora_A", None)  # an embedding's adapters (lora_embedding_A) are not
        if not isinstance(module, LoraLayer) or not isinstance(decomposed, torch.nn.ModuleDict):
            continue
        for layer in decomposed.values():
            rank = int(layer.weight.shape[0])  # the directions the decomposition found: at most min(in, out)
            if rank < lora.r:
                short.setdefault(name.rsplit(".", 1)[-1], rank)
    if not short:
        return
    most = min(short.values())
    layers = ", ".join(short)
    dims = ", ".join(f"{name} {rank}" for name, rank in short.items())
    raise ConfigError(
        f"{PARAM}.r = {lora.r} is more than the rank of {layers} ({dims}: the smaller of a weight's input "
        f"and output features), which {init_name(lora.init)} init decomposes into the adapters: peft would "
        f"train adapters of that rank there and save an adapter that does not load onto its base.",
        fix=f"set {PARAM}.r to at most {most}, leave {layers} out of {PARAM}.target_modules, or set "
        f"{PARAM}.init: default (a plain LoRA of any rank).",
    )


def _say_biasless(peft_model, bias: str) -> None:
    """``lora.bias: all`` trains every bias of the model, ``lora_only`` those of the adapted modules (peft's
    rule): one warning where there is none to train (a Llama's projections and norms have no bias), as the
    setting then changes nothing."""
    if bias == "none":
        return
    if bias == "all":
        where = "the model has no bias parameters"
        found = [
            name
            for name, _ in peft_model.named_parameters()
            if name.endswith(".bias") and "lora_" not in name
        ]
    else:
        modules = adapted_modules(peft_model)
        where = f"the adapted modules, {_described(modules)}, carry no bias"
        base = peft_model.get_base_model()
        found = [name for name in modules if base.get_submodule(name).get_base_layer().bias is not None]
    if not found:
        log.warning(
            "%s.bias: %s trains nothing beyond the adapters: %s, so the setting changes nothing; set "
            "%s.bias: none.",
            PARAM,
            bias,
            where,
            PARAM,
        )


def _floats_to(dtype: torch.dtype, value):
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    return value


def _inputs_to_own_dtype(dtype: torch.dtype, module, args, kwargs):
    return tuple(_floats_to(dtype, a) for a in args), {k: _floats_to(dtype, v) for k, v in kwargs.items()}


def _output_to(dtype: torch.dtype, module, args, output):
    return _floats_to(dtype, output)


def saved_modules_compute_in_fp32(peft_model) -> None:
    """Each ``modules_to_save`` copy (trained in fp32) over a 16-bit frozen base (QLoRA's compute dtype, or
    ``base_dtype`` bf16) computes in its fp32: its floating inputs (the head's bf16 hidden states) cast to
    fp32, as peft casts an adapter's; its output goes on in the dtype the frozen module gave (the embedding's,
    a norm's: bf16, so the layers after it compute as in a run without it), the LM head's stays fp32 (logits
    for the fp32 loss). Without mixed precision (``runtime.precision: fp32``, what ``auto`` measures on CPU)
    a bf16 input met the fp32 weight (``expected m1 and m2 to have the same dtype``); under autocast the casts
    change nothing autocast does not."""
    get_head = getattr(peft_model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    for wrapper in peft_model.modules():
        copies = getattr(wrapper, "modules_to_save", None)
        original = getattr(wrapper, "original_module", None)
        if not isinstance(copies, torch.nn.ModuleDict) or original is None:
            continue
        frozen = next((p.dtype for p in original.parameters() if p.is_floating_point()), torch.float32)
        for copy in copies.values():
            own = next((p.dtype for p in copy.parameters() if p.is_floating_point()), frozen)
            if own == frozen:
                continue
            copy.register_forward_pre_hook(functools.partial(_inputs_to_own_dtype, own), with_kwargs=True)
            if wrapper is not head:
                copy.register_forward_hook(functools.partial(_output_to, frozen))


INIT_NAMES = {"gaussian": "Gaussian", "pissa": "PiSSA", "olora": "OLoRA"}


def init_name(init: str) -> str:
    """``train.model.lora.init``'s name in the log: ``pissa_niter_4`` -> ``PiSSA``."""
    return INIT_NAMES[init.split("_niter_")[0]]


_INITIAL = (
    "_fastlm_initial_adapters"  # PiSSA's / OLoRA's initial A and B, kept on the model until it is saved
)


def moves_base_weights(lora: LoraParams) -> bool:
    """PiSSA and OLoRA move each weight's principal part into the adapters: the base trains changed."""
    return lora.init not in engine_config.BASE_KEEPING_INITS


@contextlib.contextmanager
def _seeded_decomposition(init: str):
    """A randomized SVD (``pissa_niter_<n>``) drawn from a fixed seed, the caller's random state kept: every
    process that builds the model (the workers, the launcher's parent, a resume) derives the same residual
    base. The other inits are exact decompositions, or random adapters that the trained ones replace."""
    if "_niter_" not in init:
        yield
        return
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []  # this process's GPU alone
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(0)
        yield


def _remember_initial_adapters(peft_model) -> None:
    from peft import get_peft_model_state_dict

    initial = {
        name: tensor.detach().to("cpu", copy=True)
        for name, tensor in get_peft_model_state_dict(peft_model).items()
        if ".lora_A." in name or ".lora_B." in name
    }
    object.__setattr__(peft_model, _INITIAL, initial)


def initial_adapters(peft_model) -> dict | None:
    """PiSSA's / OLoRA's initial A and B (``{name: tensor}`` on the CPU), kept on ``peft_model`` since it was
    built, for its adapter to be saved as its trained difference (``adapter_folder.save_adapter``); None for
    an init that keeps the base weights."""
    return peft_model.__dict__.get(_INITIAL)


def prepare_quantized(model) -> None:
    """A 4-bit base made ready for adapters: every parameter frozen, and every one that is not 4-bit left
    in the compute dtype, as the frozen base of a plain LoRA run is.

    peft's ``prepare_model_for_kbit_training`` casts every 16-bit parameter that is not 4-bit to fp32: for a
    128k-vocabulary 3B model the embedding and LM head grow by 0.8 GB per copy (1.6 GB for the tied one) and
    the head multiplies in fp32. Even fp32 *norms* alone cost more than they give: an fp32 weight times a
    bf16 input makes each norm's output fp32, bitsandbytes' layers return their input's dtype, so the
    residual stream, the MLP and every projection's output turn fp32 from the first layer on (twice the
    activation memory and traffic, and a cast before each 4-bit matmul), while a frozen norm's statistics
    are computed in fp32 either way (tests/engine/model/test_qlora_forward.py). Gradient checkpointing is
    the caller's (``recompute.enable_checkpointing``, non-reentrant)."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for module in model.modules():
        # bitsandbytes repacks a 4-bit weight, in place and for good, for its CPU inference kernel (which
        # has no backward) the first time the layer runs in eval mode without gradients on a CPU with
        # AVX-512 bf16: training after an evaluation pass would back-propagate nothing through the base
        if getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False


def adapter_description(lora: LoraParams) -> str:
    """The adapter as configured, in a few words (the summary's ``adapter``, the report's model line)."""
    kind = f"{'Q' if lora.load_in_4bit else ''}{'DoRA' if lora.use_dora else 'LoRA'}"
    parts = [f"r {lora.r}", f"alpha {lora.alpha:g}"]
    if lora.use_rslora:
        parts.append("rank-stabilized scaling")
    if lora.init != "default":
        parts.append(f"{lora.init} init")
    if lora.loraplus_lr_ratio is not None:
        parts.append(f"B at {lora.loraplus_lr_ratio:g}x the rate")
    if lora.load_in_4bit:
        parts.append("NF4 base")
    return f"{kind} ({', '.join(parts)})"


def parameter_counts(model) -> dict:
    """Trainable and total parameters (each shared tensor once; 4-bit packed weights counted unpacked)."""
    if hasattr(model, "get_nb_trainable_parameters"):
        trainable, total = model.get_nb_trainable_parameters()
    else:
        total = model_parameters(model)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "trainable_parameters": int(trainable),
        "total_parameters": int(total),
        "trainable_share": round(trainable / total, 6) if total else 0.0,
    }


def model_parameters(model: torch.nn.Module) -> int:
    """The model's parameters (each shared tensor once; FSDP2's DTensors by their global size), a QLoRA
    base's 4-bit weights counted unpacked: bitsandbytes' ``Params4bit`` packs two values in each byte of its
    storage (peft's count), where ``numel()`` counts the bytes: half of every quantized matrix, in the run's
    parameter count and its FLOPs per token (its MFU)."""
    return parameter_count(model.parameters())


def parameter_count(params) -> int:
    """``model_parameters``' count of the parameters ``params`` (each counted as given: a shared tensor once
    where the iterable holds it once)."""
    total = 0
    for param in params:
        values = param.numel()
        if type(param).__name__ == "Params4bit":
            storage = getattr(param, "quant_storage", None)
            values *= 2 * (storage.itemsize if isinstance(storage, torch.dtype) else param.element_size())
        total += values
    return total


def trains_part_only(model: torch.nn.Module) -> bool:
    """Whether some of ``model``'s weights are frozen (LoRA: its base): what it saves, hands back and
    checkpoints is its trained weights alone (``load_trained_weights`` reads them back)."""
    return any(not param.requires_grad for param in model.parameters())


def load_trained_weights(model: torch.nn.Module, trained: dict) -> None:
    """A LoRA model's trained weights (``trained``: exactly its trainable parameters, as a trainable-only
    checkpoint or a worker hands them back) into ``model``, built over its base."""
    expected = {name for name, param in model.named_parameters() if param.requires_grad}
    if set(trained) != expected:
        raise RuntimeError(
            f"the trained weights hold {len(trained)} tensors where the model trains {len(expected)} "
            f"(first differences: {sorted(set(trained) ^ expected)[:3]})"
        )
    model.load_state_dict(trained, strict=False)
