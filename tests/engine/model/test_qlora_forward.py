"""QLoRA on real NF4 weights (bitsandbytes' CPU backend): the layers between the 4-bit matmuls compute in
the compute dtype, and the 4-bit LoRA layers' own forward (engine/model/lora_forward.py) adds no
activation-sized clone, cast, scaling pass or sum to the base's, with peft's loss and gradients within the
bf16 tolerances and peft's forward kept where it does not apply.

bitsandbytes quantizes, dequantizes and multiplies 4-bit weights on CPU (its ``default`` backend, or the
AVX-512 one where torch dispatches AVX-512 kernels: ``ATEN_CPU_CAPABILITY`` picks, so the kernels-marked
run under other kernel sets tries both), so these tests load a tiny Llama in 4 bits as a GPU run does, with
the CPU as its device."""

import collections
import contextlib

import pytest
import torch

from fastlm.engine.config import LoraParams
from fastlm.engine.model.lora import apply_lora, prepare_quantized
from fastlm.engine.model.lora_forward import fuse_lora_forward, use_peft_forward
from tests.support import lora_checks
from tests.support.lora_checks import ActivationOps, nonzero_lora_b, relative_norm_difference
from tests.support.tiny_models import llama_config
from tests.support.tolerances import BF16_MODEL_LOSS_REL, EPS_BF16

bnb = pytest.importorskip("bitsandbytes", reason="the dev install brings it: pip install -e .[dev]")

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

VOCAB, HIDDEN, TOKENS, LAYERS = 112, 64, 48, 2
ADAPTED = LAYERS * 7  # q, k, v, o, gate, up, down


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    shape = llama_config(vocab=VOCAB, hidden=HIDDEN, positions=128, num_hidden_layers=LAYERS)
    folder = tmp_path_factory.mktemp("qlora_base")
    LlamaForCausalLM(shape).to(torch.bfloat16).save_pretrained(folder)
    return folder


def quantized(folder):
    """The base in NF4 with double quantization and bf16 compute, as ``lora.load_kwargs`` asks on a GPU."""
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    config = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    return LlamaForCausalLM.from_pretrained(
        folder, dtype=torch.bfloat16, quantization_config=config, device_map={"": "cpu"}
    )


def adapted(folder, *, fused=True, checkpointing="off", dropout=0.0, dora=False):
    """The 4-bit base with fp32 adapters whose B is not zero (peft starts B at zero: the adapters would add
    nothing and A would get no gradient); the same adapters on each call. ``dora``: DoRA adapters."""
    params = LoraParams(
        enabled=True,
        load_in_4bit=True,
        r=4,
        alpha=8,
        dropout=dropout,
        fused_forward=fused,
        use_dora=dora,
    )
    torch.manual_seed(0)  # peft draws A's initial values
    model = apply_lora(quantized(folder), params, gradient_checkpointing=checkpointing)
    nonzero_lora_b(model)
    return model


def batch():
    return lora_checks.token_batch(VOCAB, TOKENS)


def loss_and_grads(model, autocast=True, seed=3):
    return lora_checks.loss_and_grads(model, batch(), autocast, seed)


def activation_ops(model) -> collections.Counter:
    with ActivationOps(rows=2 * TOKENS) as ops:
        loss_and_grads(model)
    return ops.counts


def test_a_qlora_model_computes_between_its_4bit_matmuls_in_the_compute_dtype(base_folder):
    """Frozen fp32 norms (what peft's ``prepare_model_for_kbit_training`` makes them) turn each norm's output
    into fp32 (an fp32 weight times a bf16 input); bitsandbytes' layers hand their output back in their
    input's dtype, so from the first layer on the residual stream, the MLP and every projection's output are
    fp32: twice the activation memory and traffic of the bf16 base of a LoRA run, and a cast before each 4-bit
    matmul. Frozen norms need no fp32 copy: the norm computes its statistics in fp32 either way."""
    model = adapted(base_folder)
    dtypes = collections.Counter()

    def record(module, inputs, output):
        dtypes[type(module).__name__, output.dtype] += 1

    layers = model.get_base_model().model.layers
    hooks = [
        module.register_forward_hook(record)
        for layer in layers
        for module in (layer, layer.input_layernorm, layer.mlp, layer.self_attn.q_proj, layer.mlp.down_proj)
    ]
    loss_and_grads(model)
    for hook in hooks:
        hook.remove()
    assert {dtype for _, dtype in dtypes} == {torch.bfloat16}, dtypes
    frozen = [p for p in model.parameters() if not p.requires_grad and p.dtype.is_floating_point]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)


def test_under_bf16_autocast_4bit_adapters_add_no_activation_sized_pass(base_folder):
    """The fused 4-bit layer makes exactly the activation-sized passes of the fused plain LoRA layer over a
    bf16 base (which test_lora_forward compares with the base model's own): the dequantized weight is
    weight-sized, and the adapter's product and input gradient are summed inside the base's matmuls. peft's
    4-bit layer clones the base output ("defensively"), scales the adapter's output in a pass of its own and
    adds the two, and autograd adds the two input gradients and scales in backward."""
    from transformers import LlamaForCausalLM

    bf16_base = LlamaForCausalLM.from_pretrained(base_folder, dtype=torch.bfloat16)
    params = LoraParams(enabled=True, r=4, dropout=0.0)
    plain = activation_ops(apply_lora(bf16_base, params, gradient_checkpointing="off"))
    fused = activation_ops(adapted(base_folder))
    peft = activation_ops(adapted(base_folder, fused=False))
    assert fused == plain, (fused, plain)
    assert peft["clone"] == fused["clone"] + ADAPTED, (peft, fused)
    assert peft["mul"] >= fused["mul"] + 2 * ADAPTED, (peft, fused)
    assert peft["add"] >= fused["add"] + 2 * ADAPTED - 3, (peft, fused)  # layer 0's q, k, v: no input grad


def test_bf16_autocast_the_fused_4bit_forward_gives_peft_loss_and_gradients(base_folder):
    """Both dequantize the same NF4 weights to bf16; peft rounds the adapter's output, its scaled copy and
    the sum to bf16, the fused matmul once, and likewise the input gradient's two parts: a few bf16 roundings
    per layer."""
    fused_loss, fused_grads = loss_and_grads(adapted(base_folder))
    peft_loss, peft_grads = loss_and_grads(adapted(base_folder, fused=False))
    torch.testing.assert_close(fused_loss, peft_loss, rtol=BF16_MODEL_LOSS_REL, atol=0)
    assert fused_grads.keys() == peft_grads.keys() and len(fused_grads) == 2 * ADAPTED
    for name in peft_grads:
        assert peft_grads[name].abs().max() > 0, name  # every adapter gets a gradient
        assert relative_norm_difference(fused_grads[name], peft_grads[name]) < 4 * EPS_BF16, name


def test_bf16_autocast_the_fused_4bit_dora_forward_gives_peft_loss_and_gradients(base_folder):
    """DoRA over NF4 weights: the norms of W + s B A from the dequantized W (fp32 sums) against peft's
    (a bf16 W + s B A, after dequantizing W again in its DoRA layer), the scaled fused product against
    peft's three bf16 passes: a few bf16 roundings per layer, the magnitudes' gradients too."""
    from fastlm.engine.model.lora_forward import FusedLoraLinear4bit

    model = adapted(base_folder, dora=True)
    assert len([m for m in model.modules() if type(m) is FusedLoraLinear4bit]) == ADAPTED
    fused_loss, fused_grads = loss_and_grads(model)
    peft_loss, peft_grads = loss_and_grads(adapted(base_folder, fused=False, dora=True))
    torch.testing.assert_close(fused_loss, peft_loss, rtol=BF16_MODEL_LOSS_REL, atol=0)
    assert fused_grads.keys() == peft_grads.keys() and len(fused_grads) == 3 * ADAPTED  # A, B, magnitude
    for name in peft_grads:
        assert peft_grads[name].abs().max() > 0, name
        assert relative_norm_difference(fused_grads[name], peft_grads[name]) < 4 * EPS_BF16, name


def test_with_dropout_the_fused_4bit_forward_draws_peft_masks(base_folder):
    """LoRA dropout: the base layer runs its own forward and only the sum is fused; the same masks, drawn in
    the same order, so the same loss within the bf16 tolerance. The gradients get twice the room of the
    test above: the dropped-out input is scaled in bf16 here, where peft outside a CUDA autocast casts it to
    the adapters' fp32 first (one more bf16 rounding of the adapter's input, forward and backward;
    measured at most 4.6 eps_bf16)."""
    fused_loss, fused_grads = loss_and_grads(adapted(base_folder, dropout=0.3).train())
    peft_loss, peft_grads = loss_and_grads(adapted(base_folder, dropout=0.3, fused=False).train())
    torch.testing.assert_close(fused_loss, peft_loss, rtol=BF16_MODEL_LOSS_REL, atol=0)
    for name in peft_grads:
        assert relative_norm_difference(fused_grads[name], peft_grads[name]) < 8 * EPS_BF16, name


def test_with_dropout_the_fused_4bit_dora_forward_draws_peft_masks(base_folder):
    """QDoRA with LoRA dropout, peft's definition (the base's output on x, plus W and the scaled adapter on
    the dropped-out input, W's product through bitsandbytes' 4-bit matmul on both sides): the same masks,
    the loss within the bf16 tolerance, the gradients (magnitudes' too) with the dropout test's room."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from fastlm.engine.model.lora_forward import FusedLoraLinear4bit

    class Identities(TorchDispatchMode):  # peft's DoRA forms B A through an [in x in] identity, each layer
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Identities.count += func.overloadpacket is torch.ops.aten.eye
            return func(*args, **(kwargs or {}))

    model = adapted(base_folder, dora=True, dropout=0.3).train()
    assert len([m for m in model.modules() if type(m) is FusedLoraLinear4bit]) == ADAPTED
    with Identities():
        fused_loss, fused_grads = loss_and_grads(model)
    assert Identities.count == 0  # the fused forward took the layers: no B A formed
    peft_loss, peft_grads = loss_and_grads(adapted(base_folder, dora=True, dropout=0.3, fused=False).train())
    torch.testing.assert_close(fused_loss, peft_loss, rtol=BF16_MODEL_LOSS_REL, atol=0)
    assert fused_grads.keys() == peft_grads.keys() and len(fused_grads) == 3 * ADAPTED
    for name in peft_grads:
        assert peft_grads[name].abs().max() > 0, name
        assert relative_norm_difference(fused_grads[name], peft_grads[name]) < 8 * EPS_BF16, name


def test_checkpointed_4bit_layers_recompute_the_same_loss_and_gradients(base_folder):
    """Checkpointing recomputes a layer's forward in backward: ``full`` (both layers) against ``selective``
    (the first) is the second layer's fused forward run again, the same computation, so the same loss and
    gradients exactly. (Against no checkpointing they differ by rounding: checkpointing makes the embedding
    output require a gradient, and bitsandbytes then takes its autograd path for the first layer's
    matmuls.)"""
    loss, grads = loss_and_grads(adapted(base_folder, checkpointing="selective"))
    again_loss, again_grads = loss_and_grads(adapted(base_folder, checkpointing="full"))
    assert torch.equal(loss, again_loss)
    for name in grads:
        assert torch.equal(grads[name], again_grads[name]), name


def logits(model, autocast=True):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return model(input_ids=batch()["input_ids"]).logits.float()


def test_outside_autocast_and_with_disabled_adapters_4bit_layers_take_peft_forward(base_folder):
    """Without autocast the 4-bit base computes in bf16 and peft's adapters in fp32: peft's forward, the same
    computation, so the same logits. Disabled adapters give the 4-bit base's logits."""
    fused, peft = adapted(base_folder).eval(), adapted(base_folder, fused=False).eval()
    assert torch.equal(logits(fused, autocast=False), logits(peft, autocast=False))
    base = quantized(base_folder)
    prepare_quantized(base)  # the same kernels (bitsandbytes' CPU inference repacking off)
    with fused.disable_adapter():
        assert torch.equal(logits(fused), logits(base.eval()))


def test_the_swap_covers_4bit_layers_both_ways(base_folder):
    model = adapted(base_folder, fused=False)
    assert fuse_lora_forward(model) == ADAPTED
    assert use_peft_forward(model) == ADAPTED
    assert fuse_lora_forward(model) == ADAPTED


def test_the_fused_4bit_forward_compiles_to_the_eager_loss_and_gradients(base_folder):
    """torch.compile traces the 4-bit layers' forward and backward (bitsandbytes' ops are torch custom ops;
    the eager backend keeps it quick) without a graph break: bf16 tolerances against eager (AOTAutograd's
    decompositions may round differently)."""
    import torch._dynamo

    eager_loss, eager_grads = loss_and_grads(adapted(base_folder))
    model = adapted(base_folder)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled_loss, _ = loss_and_grads(torch.compile(model, backend="aot_eager"))
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=BF16_MODEL_LOSS_REL, atol=0)
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            difference = relative_norm_difference(parameter.grad.float(), eager_grads[name])
            assert difference < 4 * EPS_BF16, name


def test_bf16_adapters_over_a_4bit_base_train_as_fp32_adapters_and_are_cast_in_no_micro_batch(base_folder):
    """``train.runtime.param_dtype`` bf16 on QLoRA (auto on a GPU): the 4-bit layers' adapters in bf16 with
    fp32 masters, no adapter cast in a step (tests/engine/train/test_lora_masters.py has the counts' why),
    the losses and fp32 weights of fp32 adapters under autocast within fp32 reordering."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from fastlm.engine.config import parse_train_params
    from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
    from fastlm.engine.train.step import make_optimization, train_step
    from tests.support.tolerances import TRAINED_FP32_LOSS_REL, TRAINED_FP32_WEIGHTS

    class Casts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket is torch.ops.aten._to_copy:
                self.shapes.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="bf16", compile=False, num_threads=1))
    runs = {}
    for param_dtype in ("bf16", "fp32"):
        model = adapted(base_folder)
        raw = {
            "runtime": {"device": "cpu", "precision": "bf16", "param_dtype": param_dtype, "float8": "off"},
            "model": {"lora": {"enabled": True, "load_in_4bit": True}},
            "loss": {"fused_linear": False},
            "optimizer": {"lr": 1e-2, "warmup_steps": 0},
        }
        opt = make_optimization(model, parse_train_params(raw), runtime, total_steps=3)
        trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
        shapes = {tuple(p.shape) for p in trained.values()}
        losses, casts = [], Casts()
        for step in range(3):
            micro = [lora_checks.token_batch(VOCAB, TOKENS, seed=10 * step + i) for i in range(2)]
            with casts if step == 2 else contextlib.nullcontext():
                result = train_step(model, micro, opt, runtime=runtime)
            losses.append(float(result.loss_sum / result.target_tokens))
        if opt.masters is not None:
            opt.release()
        runs[param_dtype] = (losses, sum(s in shapes for s in casts.shapes), trained, len(trained))
    (ours, our_casts, our_weights, adapters), (theirs, their_casts, their_weights, _) = (
        runs["bf16"],
        runs["fp32"],
    )
    assert adapters == 2 * ADAPTED and our_casts == 0 and their_casts >= 2 * 2 * adapters
    for a, b in zip(ours, theirs, strict=True):
        assert abs(a - b) <= TRAINED_FP32_LOSS_REL * abs(b)
    for name, param in our_weights.items():
        assert param.dtype == torch.float32, name
        torch.testing.assert_close(param.detach(), their_weights[name].detach(), **TRAINED_FP32_WEIGHTS)
