"""The LoRA layers' own forward (engine/model/lora_forward.py) against peft's: no activation-sized dtype copy
or scaling pass under autocast, the same loss and gradients within each precision's tolerance, and peft's
forward kept wherever the fused one does not apply (merged, disabled, another adapter kind)."""

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fastlm.engine.config import LoraParams
from fastlm.engine.model.lora import apply_lora
from fastlm.engine.model.lora_forward import FusedLoraLinear, use_peft_forward
from tests.support import lora_checks
from tests.support.lora_checks import ActivationOps, nonzero_lora_b, relative_norm_difference
from tests.support.tiny_models import llama_config
from tests.support.tolerances import (
    BF16_MODEL_LOSS_REL,
    EPS_BF16,
    OTHER_FP32_KERNEL_GRAD,
    OTHER_FP32_MODEL,
)

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

VOCAB, HIDDEN, TOKENS = 112, 64, 48  # 2 x TOKENS rows: no weight's (hidden 64, MLP 128, vocab 112)


def tiny_llama(dtype=torch.float32, layers=2, **config):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    shape = llama_config(
        vocab=VOCAB,
        hidden=HIDDEN,
        positions=128,
        num_hidden_layers=layers,
        tie_word_embeddings=True,
        **config,
    )
    return LlamaForCausalLM(shape).to(dtype)


def adapted(dtype=torch.float32, *, fused=True, dropout=0.0, config=None, **lora):
    """A tiny Llama with LoRA adapters whose B is not zero (peft starts B at zero: the adapters would then
    add nothing and A would get no gradient, hiding any difference)."""
    params = LoraParams(**{"enabled": True, "r": 4, "alpha": 8, "dropout": dropout, **lora})
    model = apply_lora(tiny_llama(dtype, **(config or {})), params, gradient_checkpointing=False)
    if not fused:
        use_peft_forward(model)
    nonzero_lora_b(model)
    return model


def batch():
    return lora_checks.token_batch(VOCAB, TOKENS)


def loss_and_grads(model, autocast: bool, seed=3):
    return lora_checks.loss_and_grads(model, batch(), autocast, seed)


def activation_ops(model) -> collections.Counter:
    with ActivationOps(rows=2 * TOKENS) as ops:
        loss_and_grads(model, autocast=True)
    return ops.counts


def test_under_bf16_autocast_adapters_add_no_activation_sized_copy_scaling_pass_or_sum():
    """bf16 base, fp32 adapters, bf16 autocast (a GPU LoRA run): the adapted model's forward and backward do
    exactly the activation-sized dtype copies, multiplications and additions of the base model without
    adapters whose projections train (the same activation gradients flow): the adapter's share of the input
    gradient is summed inside the base's input-gradient matmul, as its output is inside the forward's."""
    base = tiny_llama(torch.bfloat16)  # the same gradients flow: frozen but for the adapted projections
    for name, parameter in base.named_parameters():
        parameter.requires_grad_(name.endswith("proj.weight"))
    base = activation_ops(base)
    fused = activation_ops(adapted(torch.bfloat16, shared_input=False))
    peft = activation_ops(adapted(torch.bfloat16, fused=False))
    assert fused == base, (fused, base)
    # and with the shared-input groups (q/k/v, gate/up; on by default) the sums of their input gradients are
    # inside the matmuls too: 2 + 1 adds fewer per layer than the base model's autograd sums, but for the
    # first layer's q, k, v (their input needs no gradient)
    grouped = activation_ops(adapted(torch.bfloat16))
    assert grouped == base - collections.Counter(add=2 * 3 - 2), (grouped, base)
    # peft's forward per adapted layer: x cast to the adapters' fp32 and back, and again in backward where x
    # needs a gradient (not for the first layer's q, k, v: its input comes from the frozen embedding); the
    # scaling pass, forward and backward
    adapted_layers = 2 * 7
    assert peft["_to_copy"] == base["_to_copy"] + 4 * adapted_layers - 2 * 3, (peft, base)
    assert peft["mul"] == base["mul"] + 2 * adapted_layers, (peft, base)
    # and a sum of the adapter's output with the base's, forward, and of the two input gradients, backward
    # (where the input needs one)
    assert peft["add"] == base["add"] + 2 * adapted_layers - 3, (peft, base)


class AllOps(TorchDispatchMode):
    """Counts every aten op dispatched, whatever its size."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket).removeprefix("aten.")] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("alpha", [8, 6], ids=["scaling-2", "scaling-1.5"])
def test_the_scaling_is_the_matmuls_alpha_not_a_pass_of_its_own(alpha):
    """peft's scaling (alpha / r) multiplies B forward and B's gradient backward in passes of their own: two
    small kernels per adapted layer and micro-batch, each with its launch (196 adapted layers on the 3B
    shape). The fused forward passes it as each matmul's ``alpha`` instead: no ``mul`` beyond the base
    model's, and the same loss and gradients as peft's forward within bf16's rounding."""
    base = tiny_llama(torch.bfloat16)
    for name, parameter in base.named_parameters():
        parameter.requires_grad_(name.endswith("proj.weight"))
    with AllOps() as base_ops:
        loss_and_grads(base, autocast=True)
    fused = adapted(torch.bfloat16, alpha=alpha)
    with AllOps() as fused_ops:
        fused_loss, fused_grads = loss_and_grads(fused, autocast=True)
    assert fused_ops.counts["mul"] == base_ops.counts["mul"], (fused_ops.counts, base_ops.counts)
    peft_loss, peft_grads = loss_and_grads(adapted(torch.bfloat16, alpha=alpha, fused=False), autocast=True)
    torch.testing.assert_close(fused_loss, peft_loss, rtol=BF16_MODEL_LOSS_REL, atol=0)
    for name, grad in peft_grads.items():  # as the bf16 test below: a few bf16 roundings per layer
        assert relative_norm_difference(fused_grads[name], grad) < 4 * EPS_BF16, name


@pytest.mark.parametrize("config", [{}, {"attention_bias": True}], ids=["no-bias", "biased-attention"])
def test_fp32_the_fused_forward_gives_peft_loss_and_gradients(config):
    """fp32, no autocast (a CPU run): the adapter's product is added inside the base output's matmul rather
    than after it, a reordered sum: other-fp32-kernel tolerances; also where the base Linear has a bias (q, k,
    v and o of a Qwen2-style attention)."""
    fused_loss, fused_grads = loss_and_grads(adapted(config=config), autocast=False)
    peft_loss, peft_grads = loss_and_grads(adapted(fused=False, config=config), autocast=False)
    torch.testing.assert_close(fused_loss, peft_loss, **OTHER_FP32_MODEL)
    assert fused_grads.keys() == peft_grads.keys() and len(fused_grads) == 2 * 2 * 7
    for name in peft_grads:
        assert peft_grads[name].abs().max() > 0, (
            name
        )  # every adapter gets a gradient: the check means something
        torch.testing.assert_close(fused_grads[name], peft_grads[name], **OTHER_FP32_KERNEL_GRAD, msg=name)


@pytest.mark.parametrize("base_dtype", [torch.bfloat16, torch.float32], ids=["bf16-base", "fp32-base"])
def test_bf16_autocast_the_fused_forward_gives_peft_loss_and_gradients(base_dtype):
    """bf16 autocast on a bf16 base (a GPU run) or an fp32 one (a CPU run whose probe chose bf16): peft rounds
    the adapter's output, its scaled copy and the sum to bf16 (three roundings), the fused matmul once, and
    likewise the input gradient's two parts; a few bf16 roundings per layer, so the loss within
    BF16_MODEL_LOSS_REL and each adapter's gradient within a few eps_bf16 in norm."""
    fused_loss, fused_grads = loss_and_grads(adapted(base_dtype), autocast=True)
    peft_loss, peft_grads = loss_and_grads(adapted(base_dtype, fused=False), autocast=True)
    torch.testing.assert_close(fused_loss, peft_loss, rtol=BF16_MODEL_LOSS_REL, atol=0)
    for name in peft_grads:
        assert relative_norm_difference(fused_grads[name], peft_grads[name]) < 4 * EPS_BF16, name


def test_rslora_scales_by_alpha_over_the_root_of_r_inside_the_fused_matmuls():
    """``use_rslora`` (rank-stabilized LoRA: alpha / sqrt(r), not alpha / r) is peft's scaling, read by the
    fused forward as its matmuls' alpha: the fused layers stay, and give peft's own forward's loss and
    gradients (fp32, a reordered sum); the scaling changes the result (the setting reaches the model)."""
    model = adapted(use_rslora=True)
    layers = [m for m in model.modules() if isinstance(m, FusedLoraLinear)]
    assert len(layers) == 2 * 7 and {layer.scaling["default"] for layer in layers} == {8 / 4**0.5}
    fused_loss, fused_grads = loss_and_grads(model, autocast=False)
    peft_loss, peft_grads = loss_and_grads(adapted(use_rslora=True, fused=False), autocast=False)
    torch.testing.assert_close(fused_loss, peft_loss, **OTHER_FP32_MODEL)
    for name in peft_grads:
        torch.testing.assert_close(fused_grads[name], peft_grads[name], **OTHER_FP32_KERNEL_GRAD, msg=name)
    plain_loss, _ = loss_and_grads(adapted(), autocast=False)
    assert not torch.allclose(plain_loss, fused_loss, **OTHER_FP32_MODEL)  # beyond any rounding


@pytest.mark.parametrize("config", [{}, {"attention_bias": True}], ids=["no-bias", "biased-attention"])
def test_fp32_the_fused_dora_forward_gives_peft_loss_and_gradients(config):
    """``use_dora`` (weight-decomposed LoRA: a trained magnitude m per output feature over the direction of
    W + s B A): the fused forward computes m / ||W + s B A|| (the norm detached, as peft and the DoRA paper
    do) from W A^T and r x r products, and scales the fused base-plus-adapter product by it; peft builds
    B A and W + s B A, weight-sized, in every forward. fp32: the same loss and gradients (the magnitudes'
    too) within the reordered sums' tolerances; a bias stays outside the scaling, as peft keeps it."""
    model = adapted(use_dora=True, config=config)
    assert len([m for m in model.modules() if isinstance(m, FusedLoraLinear)]) == 2 * 7
    fused_loss, fused_grads = loss_and_grads(model, autocast=False)
    peft_loss, peft_grads = loss_and_grads(adapted(use_dora=True, fused=False, config=config), autocast=False)
    torch.testing.assert_close(fused_loss, peft_loss, **OTHER_FP32_MODEL)
    magnitudes = [name for name in peft_grads if "lora_magnitude_vector" in name]
    assert fused_grads.keys() == peft_grads.keys() and len(magnitudes) == 2 * 7
    for name in peft_grads:
        assert peft_grads[name].abs().max() > 0, name
        torch.testing.assert_close(fused_grads[name], peft_grads[name], **OTHER_FP32_KERNEL_GRAD, msg=name)
    plain_loss, _ = loss_and_grads(adapted(), autocast=False)
    assert not torch.allclose(plain_loss, fused_loss, **OTHER_FP32_MODEL)  # DoRA is not plain LoRA here


@pytest.mark.parametrize("base_dtype", [torch.bfloat16, torch.float32], ids=["bf16-base", "fp32-base"])
def test_bf16_autocast_the_fused_dora_forward_gives_peft_loss_and_gradients(base_dtype):
    """bf16 autocast: peft computes the weight norm of a bf16 W + s B A (a bf16 sum and a bf16 norm), the
    fused forward in fp32 from fp32 products; each side rounds its outputs and scalings to bf16 a few times
    per layer: the loss within BF16_MODEL_LOSS_REL, each gradient within a few eps_bf16 in norm."""
    fused_loss, fused_grads = loss_and_grads(adapted(base_dtype, use_dora=True), autocast=True)
    peft_loss, peft_grads = loss_and_grads(adapted(base_dtype, use_dora=True, fused=False), autocast=True)
    torch.testing.assert_close(fused_loss, peft_loss, rtol=BF16_MODEL_LOSS_REL, atol=0)
    for name in peft_grads:
        assert relative_norm_difference(fused_grads[name], peft_grads[name]) < 4 * EPS_BF16, name


def test_dora_after_generation_and_a_merge_trains_as_a_fresh_model():
    """The fused DoRA forward under inference mode (generation, evaluation) leaves nothing behind: training
    afterwards is a fresh model's (the same computation: equal); merged, peft's forward gives the unmerged
    logits, and unmerged the fused forward does again."""
    fresh_loss, fresh_grads = loss_and_grads(adapted(use_dora=True), autocast=False)
    model = adapted(use_dora=True).eval()
    with torch.inference_mode():
        model(input_ids=batch()["input_ids"])
    loss, grads = loss_and_grads(model.train(), autocast=False)
    assert torch.equal(loss, fresh_loss)
    assert all(torch.equal(grads[name], fresh_grads[name]) for name in fresh_grads)
    before = logits(model.eval())
    model.merge_adapter()
    torch.testing.assert_close(logits(model), before, rtol=0, atol=1e-4)  # MERGED_ADAPTER_ATOL's reason
    model.unmerge_adapter()
    torch.testing.assert_close(logits(model), before, rtol=0, atol=1e-4)


class WeightShapedOutputs(TorchDispatchMode):
    """Counts the ops whose output (not a view) has one of ``shapes`` (the adapted weights' ``[out x in]``
    and the ``[in x in]`` identity peft multiplies to form B A)."""

    def __init__(self, shapes: set[tuple[int, ...]]):
        super().__init__()
        self.shapes, self.counts = shapes, collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # a view (W.t(), a detach) writes nothing
            return out
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and tuple(tensor.shape) in self.shapes:
                self.counts[str(func.overloadpacket).removeprefix("aten.")] += 1
        return out


def test_the_fused_dora_forward_makes_no_weight_sized_tensor():
    """peft's DoRA forward builds, per adapted layer and micro-batch, B A through an identity matrix of the
    input's width and W + s B A (weight-sized, a 3B layer's ~100 M elements each); the fused forward reads W
    in two passes (its row norms and W A^T) and writes nothing its size
    (bf16 base under bf16 autocast, as a GPU run: no dtype copy of W either)."""
    from peft.tuners.lora.layer import Linear

    model = adapted(torch.bfloat16, use_dora=True)
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    shapes = {tuple(m.base_layer.weight.shape) for m in layers}
    shapes |= {(m.in_features, m.in_features) for m in layers}
    assert 2 * TOKENS not in {size for shape in shapes for size in shape}  # no activation has these shapes
    with WeightShapedOutputs(shapes) as fused:
        loss_and_grads(model, autocast=True)
    with WeightShapedOutputs(shapes) as peft:
        loss_and_grads(adapted(torch.bfloat16, use_dora=True, fused=False), autocast=True)
    assert sum(peft.counts.values()) >= 2 * 2 * 7, peft.counts  # B A and W + s B A in each layer
    assert not fused.counts, fused.counts


def test_dropout_draws_the_same_mask_as_peft():
    """LoRA dropout on the adapter's input, drawn once per layer in the same order: the same masks."""
    fused_loss, fused_grads = loss_and_grads(adapted(dropout=0.3).train(), autocast=False)
    peft_loss, peft_grads = loss_and_grads(adapted(dropout=0.3, fused=False).train(), autocast=False)
    torch.testing.assert_close(fused_loss, peft_loss, **OTHER_FP32_MODEL)
    for name in peft_grads:
        torch.testing.assert_close(fused_grads[name], peft_grads[name], **OTHER_FP32_KERNEL_GRAD, msg=name)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_dora_with_active_dropout_draws_peft_masks_and_forms_nothing_weight_sized(autocast):
    """DoRA with LoRA dropout, as peft defines it: the base's output on x, plus (m / ||W + s B A|| - 1) times
    W applied to the dropped-out input, plus the scaled adapter on it (one more base product, which peft's
    forward computes too). The fused forward draws the same masks in the same order, so peft's loss and
    gradients (fp32: the reordered sums' tolerances; bf16 autocast: the DoRA tests' bf16 room, doubled as
    the plain dropout test's 4-bit twin explains), and the norms without B A or W + s B A."""
    dtype = torch.bfloat16 if autocast else torch.float32
    model = adapted(dtype, use_dora=True, dropout=0.3).train()
    peft_model = adapted(dtype, use_dora=True, dropout=0.3, fused=False).train()
    layers = [m for m in model.modules() if isinstance(m, FusedLoraLinear)]
    shapes = {tuple(m.base_layer.weight.shape) for m in layers} | {
        (m.in_features, m.in_features) for m in layers
    }
    with WeightShapedOutputs(shapes) as fused:
        fused_loss, fused_grads = loss_and_grads(model, autocast=autocast)
    peft_loss, peft_grads = loss_and_grads(peft_model, autocast=autocast)
    assert not fused.counts, fused.counts
    assert fused_grads.keys() == peft_grads.keys()
    assert len([name for name in peft_grads if "lora_magnitude_vector" in name]) == 2 * 7
    if autocast:
        torch.testing.assert_close(fused_loss, peft_loss, rtol=BF16_MODEL_LOSS_REL, atol=0)
    else:
        torch.testing.assert_close(fused_loss, peft_loss, **OTHER_FP32_MODEL)
    for name in peft_grads:
        assert peft_grads[name].abs().max() > 0, name
        if autocast:
            assert relative_norm_difference(fused_grads[name], peft_grads[name]) < 8 * EPS_BF16, name
        else:
            torch.testing.assert_close(
                fused_grads[name], peft_grads[name], **OTHER_FP32_KERNEL_GRAD, msg=name
            )
    if not autocast:  # the masks changed the loss beyond the comparison's tolerance (dropout was active)
        no_dropout_loss, _ = loss_and_grads(adapted(use_dora=True).train(), autocast=False)
        assert not torch.allclose(no_dropout_loss, fused_loss, **OTHER_FP32_MODEL)


def logits(model, autocast=False):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return model(input_ids=batch()["input_ids"]).logits.float()


def test_merged_and_disabled_adapters_take_peft_forward():
    fused, peft = adapted().eval(), adapted(fused=False).eval()
    torch.testing.assert_close(logits(fused), logits(peft), **OTHER_FP32_MODEL)
    with fused.disable_adapter(), peft.disable_adapter():
        torch.testing.assert_close(logits(fused), logits(tiny_llama().eval()), rtol=0, atol=0)
        torch.testing.assert_close(logits(peft), logits(tiny_llama().eval()), rtol=0, atol=0)
    before = logits(fused)
    fused.merge_adapter()
    torch.testing.assert_close(logits(fused), before, rtol=0, atol=1e-4)  # MERGED_ADAPTER_ATOL's reason
    fused.unmerge_adapter()
    torch.testing.assert_close(logits(fused), before, rtol=0, atol=1e-4)


def test_the_fused_forward_is_on_by_default_and_off_by_its_parameter():
    layers = [m for m in adapted().modules() if isinstance(m, FusedLoraLinear)]
    assert len(layers) == 2 * 7
    model = apply_lora(
        tiny_llama(), LoraParams(enabled=True, r=4, fused_forward=False), gradient_checkpointing=False
    )
    assert not any(isinstance(m, FusedLoraLinear) for m in model.modules())


@pytest.mark.parametrize("lora", [{}, {"use_dora": True}], ids=["lora", "dora"])
def test_the_fused_forward_compiles_to_the_eager_loss_and_gradients(lora):
    """The whole adapted model through torch.compile (AOTAutograd traces the fused layers' forward and
    backward; the eager backend keeps it quick): other-fp32-kernel tolerances against eager. DoRA too (its
    weight norms then computed in each forward, nothing kept between calls)."""
    eager_loss, eager_grads = loss_and_grads(adapted(**lora), autocast=False)
    model = adapted(**lora)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=False)
    torch.manual_seed(3)
    loss = compiled(**batch()).loss
    loss.backward()
    torch.testing.assert_close(loss.detach(), eager_loss, **OTHER_FP32_MODEL)
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            torch.testing.assert_close(parameter.grad, eager_grads[name], **OTHER_FP32_KERNEL_GRAD, msg=name)


def test_a_lora_checkpoint_resumes_across_the_forward_switches(tmp_path):
    """fused_forward and shared_input change no weight, data order or loss beyond rounding (as compile): a
    checkpoint written with either setting, or before the switches existed, resumes with the other; the
    dropout, which changes the training, does not."""
    from fastlm.engine.checkpoint.resume import digest_differences, run_digest
    from fastlm.engine.config import parse_train_params

    model = tiny_llama()

    def digest(**lora):
        raw = {"model": {"name_or_path": str(tmp_path), "lora": {"enabled": True, **lora}}}
        return run_digest(model, parse_train_params(raw), max_length=8, data="d", world_size=1, sharded=False)

    digests = [
        digest(fused_forward=fused, shared_input=shared)
        for fused in (True, False)
        for shared in (True, False)
    ]
    assert digests[0]["model.lora"]["r"] == 16  # the adapter's settings are in the digest
    assert all(digest_differences(digests[0], other) == [] for other in digests[1:])
    # so a digest saved before the switches matches
    assert not {"fused_forward", "shared_input"} & set(digests[0]["model.lora"])
    assert digest_differences(digests[0], digest(dropout=0.05))  # the old dropout default: not resumed
    # rsLoRA and DoRA change the training: not resumed across; off, a digest saved before they existed
    assert not {"use_rslora", "use_dora", "loraplus_lr_ratio"} & set(digests[0]["model.lora"])
    assert digest_differences(digests[0], digest(use_rslora=True))
    assert digest_differences(digests[0], digest(use_dora=True))
    assert digest_differences(digests[0], digest(loraplus_lr_ratio=16))


@pytest.mark.parametrize("targets", ["auto", ["q_proj", "v_proj"]], ids=["attention-and-mlp", "q-and-v"])
def test_shared_input_groups_give_each_layers_own_loss_and_gradients(targets):
    """q/k/v (or q/v, peft's usual pair) and gate/up in one step against each layer on its own: the same sums
    in another order and x @ A.T as one matmul over the concatenated A's. fp32: other-fp32-kernel tolerances;
    bf16 autocast: a few bf16 roundings per layer, as the bf16 test above."""
    from fastlm.engine.model.lora_forward import group_shared_inputs

    grouped_model = adapted(target_modules=targets)
    assert group_shared_inputs(adapted(target_modules=targets, shared_input=False)) == (
        2 * 2 if targets == "auto" else 2
    )
    grouped_loss, grouped_grads = loss_and_grads(grouped_model, autocast=False)
    own_loss, own_grads = loss_and_grads(adapted(target_modules=targets, shared_input=False), autocast=False)
    torch.testing.assert_close(grouped_loss, own_loss, **OTHER_FP32_MODEL)
    assert grouped_grads.keys() == own_grads.keys()
    for name, grad in own_grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(grouped_grads[name], grad, **OTHER_FP32_KERNEL_GRAD)

    grouped_loss, grouped_grads = loss_and_grads(
        adapted(torch.bfloat16, target_modules=targets), autocast=True
    )
    own_loss, own_grads = loss_and_grads(
        adapted(torch.bfloat16, target_modules=targets, shared_input=False), autocast=True
    )
    torch.testing.assert_close(grouped_loss, own_loss, rtol=BF16_MODEL_LOSS_REL, atol=0)
    for name, grad in own_grads.items():
        assert relative_norm_difference(grouped_grads[name], grad) < 4 * EPS_BF16, name


def test_a_group_whose_layers_read_different_inputs_computes_each_alone(caplog):
    """A member called with another tensor than the one its group computed for (a cross-attention's k and v
    read the encoder's states): its own output from its own input, the group off from then on, said once."""
    model = adapted()
    attention = model.base_model.model.model.layers[0].self_attn
    torch.manual_seed(5)
    x, other = torch.randn(2, 6, HIDDEN), torch.randn(2, 6, HIDDEN)
    alone = adapted(shared_input=False).base_model.model.model.layers[0].self_attn
    with caplog.at_level("WARNING", logger="fastlm.engine.model.lora_forward"):
        q, k, v = attention.q_proj(x), attention.k_proj(other), attention.v_proj(other)
        q_again = attention.q_proj(x)
    for got, layer, source in (
        (q, "q_proj", x),
        (k, "k_proj", other),
        (v, "v_proj", other),
        (q_again, "q_proj", x),
    ):
        torch.testing.assert_close(got, getattr(alone, layer)(source), **OTHER_FP32_MODEL)
    said = [
        record.getMessage() for record in caplog.records if record.name == "fastlm.engine.model.lora_forward"
    ]
    assert len(said) == 1 and "do not read one input" in said[0], said


def test_a_forward_cut_short_leaves_no_stale_outputs_and_keeps_the_group(caplog):
    """A forward stopped between the group's computation and its other members (an exception, a checkpoint's
    recompute stopped early): the next forward's first member drops the stale outputs without turning the
    group off, and each output is that of its own input."""
    model = adapted()
    attention = model.base_model.model.model.layers[0].self_attn
    alone = adapted(shared_input=False).base_model.model.model.layers[0].self_attn
    torch.manual_seed(6)
    x, y = torch.randn(2, 6, HIDDEN), torch.randn(2, 6, HIDDEN)
    with caplog.at_level("WARNING", logger="fastlm.engine.model.lora_forward"):
        attention.q_proj(x)  # k and v never asked for x
        got = [attention.q_proj(y), attention.k_proj(y), attention.v_proj(y)]
    assert not [record for record in caplog.records if record.name == "fastlm.engine.model.lora_forward"]
    from fastlm.engine.model.lora_forward import GROUP_KEY

    group = attention.q_proj.__dict__[GROUP_KEY][0]
    assert group.enabled and group.pending is None
    for out, layer in zip(got, ("q_proj", "k_proj", "v_proj"), strict=True):
        torch.testing.assert_close(out, getattr(alone, layer)(y), **OTHER_FP32_MODEL)


def test_an_encoder_decoders_cross_attention_is_not_grouped(caplog):
    """BART's decoder layers hold a cross-attention (``encoder_attn``) whose q reads the decoder's states and
    k, v the encoder's: not a shared input. Only the self-attentions are grouped, and a training forward says
    nothing; the loss equals each layer on its own."""
    from fastlm.engine.model.lora_forward import shares_input
    from tests.support.tiny_seq2seq import tiny_seq2seq

    def bart(shared: bool):
        params = LoraParams(
            enabled=True, r=4, target_modules=["q_proj", "k_proj", "v_proj"], shared_input=shared
        )
        model = apply_lora(tiny_seq2seq("bart"), params, gradient_checkpointing=False)
        nonzero_lora_b(model)
        return model

    model = bart(True)
    grouped = {name for name, module in model.named_modules() if shares_input(module)}
    assert grouped and not any("encoder_attn" in name for name in grouped)
    assert any(".decoder." in name and "self_attn" in name for name in grouped)
    ids = torch.randint(4, 60, (2, 12), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids.flip(1)}
    with caplog.at_level("WARNING", logger="fastlm.engine.model.lora_forward"):
        loss = model(**batch).loss
    assert not [record for record in caplog.records if record.name == "fastlm.engine.model.lora_forward"]
    torch.testing.assert_close(loss, bart(False)(**batch).loss, **OTHER_FP32_MODEL)


def test_groups_run_under_inference_mode():
    """Generation runs under ``torch.inference_mode`` (engine/evaluate/generation.py), whose tensors keep no
    version counter: the grouped model's logits there equal each layer on its own."""
    ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        grouped = adapted().eval()(input_ids=ids).logits
        alone = adapted(shared_input=False).eval()(input_ids=ids).logits
    torch.testing.assert_close(grouped, alone, **OTHER_FP32_MODEL)
