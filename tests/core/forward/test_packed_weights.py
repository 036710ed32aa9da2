"""Packed weights: a runner's linear products run on oneDNN-packed weights on the CPU, give what
the dense product gives (within rounding), and the model stays an ordinary model: its weights
read, copy, convert and stay tied."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from cascade.core.forward import fixed_order, packed_weights
from cascade.core.model.runner import ModelRunner
from cascade.core.forward.packed_weights import PackedConv1D, PackedLinear, available, pack
from models import tiny_gpt2, tiny_llama

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="oneDNN is not available")


def _packed(model) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, (PackedLinear, PackedConv1D))]


BF16_PACKS = packed_weights._bfloat16_packs()
BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not BF16_PACKS, reason="oneDNN packs no bfloat16 weights on this CPU"))


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_a_packed_product_equals_the_dense_one(dtype):
    layer = nn.Linear(96, 40).to(dtype)
    dense = layer.weight.detach().clone()
    holder = nn.Sequential(layer)
    assert pack(holder) == 1 and isinstance(layer, PackedLinear)
    assert "weight" not in layer._parameters  # only the packed copy is held
    x = torch.randn(7, 96).to(dtype)
    with torch.inference_mode():
        tolerance = 1e-5 if dtype is torch.float32 else 2e-2
        torch.testing.assert_close(layer(x), F.linear(x, dense, layer.bias), atol=tolerance,
                                   rtol=tolerance)
        assert torch.equal(layer.weight, dense)  # unpacked for a reader


def test_a_runner_packs_its_model_and_keeps_tied_weights_tied():
    config = GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                        tie_word_embeddings=True)
    gpt2 = ModelRunner(GPT2LMHeadModel(config)).model  # lm_head shares the input embeddings
    assert len(_packed(gpt2)) == 9  # 4 Conv1D per layer and the head
    head = gpt2.get_output_embeddings()
    assert isinstance(head, PackedLinear)
    assert head.weight is gpt2.get_input_embeddings().weight
    assert isinstance(tiny_gpt2(0).model.transformer.h[0].attn.c_attn, PackedConv1D)
    llama = tiny_llama(0).model
    assert all(isinstance(m, PackedLinear) for m in llama.modules()
               if isinstance(m, nn.Linear))


def test_a_deep_copy_is_an_ordinary_model_to_change():
    model = tiny_llama(0).model
    clone = copy.deepcopy(model)
    assert not _packed(clone)
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.inference_mode():
        torch.testing.assert_close(clone(prompt).logits, model(prompt).logits)
    clone.get_output_embeddings().weight.data.zero_()
    with torch.inference_mode():
        assert not clone(prompt).logits.any()
        assert model(prompt).logits.any()


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])
def test_a_packed_model_saves_its_weights(build, tmp_path):
    """``save_pretrained`` writes the dense weights: the model loaded back computes the same
    logits (it held only packed copies, and the state dict used to leave them out)."""
    from transformers import AutoModelForCausalLM

    model = build(0).model
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert set(loaded.state_dict()) >= {k for k in model.state_dict()}
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.inference_mode():
        torch.testing.assert_close(loaded(prompt).logits, model(prompt).logits)
    other = build(1).model  # packed too: the dense weights are packed in place
    other.load_state_dict(loaded.state_dict())
    with torch.inference_mode():
        torch.testing.assert_close(other(prompt).logits, model(prompt).logits)


@pytest.mark.parametrize("bf16_packs", [True, False] if BF16_PACKS else [False])
def test_converting_a_packed_model_packs_it_again_in_the_new_dtype(bf16_packs, monkeypatch):
    """Where oneDNN cannot pack bfloat16 (no AVX-512 / AVX-NE-CONVERT) the converted model is
    packed for fixed-order products, or without them keeps dense bfloat16 weights, instead of
    failing."""
    monkeypatch.setattr(packed_weights, "_bfloat16_packs", lambda: bf16_packs)
    model = tiny_llama(0).model
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.inference_mode():
        before = model(prompt).logits
        model.to(torch.bfloat16)
        assert all(m.packed.dtype == torch.bfloat16 for m in _packed(model))
        after = model(prompt).logits.float()
    kernels = {m.kernel for m in _packed(model)}
    if bf16_packs:
        assert kernels == {packed_weights.OneDnn} and len(_packed(model)) == 15
    elif fixed_order.available():
        assert kernels == {packed_weights.FixedOrder} and len(_packed(model)) == 15
    else:
        assert not kernels
    assert next(model.parameters()).dtype == torch.bfloat16
    torch.testing.assert_close(after, before, atol=0.1, rtol=0.1)


def test_nothing_is_packed_where_onednn_cannot_run_it():
    model = nn.Sequential(nn.Linear(8, 8).to(torch.float16))
    assert not available(model) and pack(model) == 0
    assert type(model[0]) is nn.Linear
