"""Fixed-order products: what ``F.linear`` gives (within rounding), a row's bits the same at
every row count, and a runner's float32 weights packed for them where they are available."""

import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cascade.core.forward import fixed_order, packed_weights
from cascade.core.forward.packed_weights import FixedOrder, OneDnn, PackedLinear, pack
from models import tiny_llama

# Where the CPU and a compiler allow it, the kernel must build: a failed build fails here.
pytestmark = pytest.mark.skipif(not fixed_order._supported() or shutil.which("c++") is None,
                                reason="fixed-order products need an x86 CPU with AVX2 and a "
                                       "C++ compiler")


def _weights(out: int, width: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(out, width, generator=generator),
            torch.randn(out, generator=generator))


@pytest.mark.parametrize("out,width", [(40, 96), (7, 5), (64, 33), (100, 128)])
def test_the_product_is_the_dense_one(out, width):
    weight, bias = _weights(out, width)
    packed = fixed_order.pack(weight)
    assert packed.shape == (-(-out // 16), width, 16)
    x = torch.randn(2, 9, width)
    for b in (None, bias):
        torch.testing.assert_close(fixed_order.product(x, packed, out, b), F.linear(x, weight, b),
                                   atol=1e-4, rtol=1e-5)
    strided = torch.randn(width, 6).t()  # not contiguous
    torch.testing.assert_close(fixed_order.product(strided, packed, out, bias),
                               F.linear(strided, weight, bias), atol=1e-4, rtol=1e-5)
    assert torch.equal(fixed_order.unpack(packed, out), weight)


def test_a_row_gets_the_same_bits_at_every_row_count():
    weight, bias = _weights(72, 200)  # panels in every grouping, a partial last panel
    packed = fixed_order.pack(weight)
    x = torch.randn(40, 200)
    alone = torch.cat([fixed_order.product(x[i:i + 1], packed, 72, bias) for i in range(40)])
    for rows in range(1, 41):
        together = fixed_order.product(x[:rows], packed, 72, bias)
        assert torch.equal(together, alone[:rows]), rows


def test_bfloat16_weights_sum_in_float32_and_keep_each_row_alike():
    weight, bias = _weights(40, 96)
    weight, bias = weight.bfloat16(), bias.bfloat16()
    packed = fixed_order.pack(weight)
    x = torch.randn(20, 96).bfloat16()
    exact = F.linear(x.float(), weight.float(), bias.float())
    got = fixed_order.product(x, packed, 40, bias)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), exact.bfloat16().float(), atol=0, rtol=1 / 128)
    alone = torch.cat([fixed_order.product(x[i:i + 1], packed, 40, bias) for i in range(20)])
    assert torch.equal(got, alone)


def test_no_rows_and_bad_inputs():
    weight, _ = _weights(20, 8)
    packed = fixed_order.pack(weight)
    assert fixed_order.product(torch.empty(0, 8), packed, 20, None).shape == (0, 20)
    with pytest.raises(RuntimeError, match="the input is Double, the weight Float"):
        fixed_order.product(torch.randn(3, 8, dtype=torch.float64), packed, 20, None)
    with pytest.raises(RuntimeError, match="float32 or bfloat16 weights"):
        fixed_order.product(torch.randn(3, 8).half(), packed.half(), 20, None)
    with pytest.raises(RuntimeError, match="the input has 9 features, the weight 8"):
        fixed_order.product(torch.randn(3, 9), packed, 20, None)
    with pytest.raises(RuntimeError, match="does not match"):
        fixed_order.product(torch.randn(3, 8), packed, 40, None)
    with pytest.raises(RuntimeError, match="bias"):
        fixed_order.product(torch.randn(3, 8), packed, 20, torch.zeros(19))


def test_a_runner_packs_float32_weights_for_fixed_order_products():
    model = tiny_llama(0).model
    kinds = {m.kernel for m in model.modules() if isinstance(m, PackedLinear)}
    assert kinds == {FixedOrder}
    layer = nn.Linear(24, 10)
    dense = layer.weight.detach().clone()
    pack(nn.Sequential(layer))
    assert torch.equal(layer.weight, dense)  # read back through the panels
    assert isinstance(layer.state_dict()["weight"], torch.Tensor)


def test_bfloat16_weights_use_onednn_only_where_it_has_bfloat16_instructions(monkeypatch):
    for onednn_bf16, kernel in ((True, OneDnn), (False, FixedOrder)):
        monkeypatch.setattr(packed_weights, "_bfloat16_packs", lambda b=onednn_bf16: b)
        assert packed_weights._kernel(torch.zeros(2, 2, dtype=torch.bfloat16)) is kernel


def test_without_fixed_order_products_float32_weights_use_onednn(monkeypatch):
    if not torch.backends.mkldnn.is_available():
        pytest.skip("oneDNN is not available")
    monkeypatch.setattr(fixed_order, "available", lambda: False)
    layer = nn.Linear(24, 10)
    pack(nn.Sequential(layer))
    assert layer.kernel is OneDnn
    assert packed_weights._kernel(torch.zeros(2, 2, dtype=torch.float64)) is None


def test_the_build_command_reports_the_kernel(capsys):
    assert fixed_order.main() == 0
    assert "fixed-order product kernel ready in" in capsys.readouterr().out


def _attention_case(span: int, rows: int, generator):
    """keys/values of 2 kv heads over 3 * span slots; a group of ``rows`` queries over
    ``span`` scattered slots, causal by position."""
    from cascade.core.forward.invariant import Group, visible

    keys, values = (torch.randn(2, 3 * span, 16, generator=generator) for _ in range(2))
    slots = torch.randperm(3 * span, generator=generator)[:span].tolist()
    positions = list(range(span - rows, span))
    return keys, values, Group(list(range(rows)), slots,
                               visible(torch.arange(span), positions, None))


def test_attention_is_softmax_attention_and_each_query_its_own():
    generator = torch.Generator().manual_seed(0)
    keys, values, group = _attention_case(40, 5, generator)
    query = torch.randn(6, 5, 16, generator=generator)  # 3 query heads per kv head
    out = fixed_order.attention(query, keys, values, fixed_order.AttentionPlan.of([group]),
                                0.25, None)
    k = keys[:, group.slots].repeat_interleave(3, 0)
    v = values[:, group.slots].repeat_interleave(3, 0)
    scores = (query @ k.transpose(1, 2) * 0.25).masked_fill(~group.visible, float("-inf"))
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v, atol=1e-5, rtol=1e-5)
    # one query alone, and beside another group of other slots: the same bits
    last = fixed_order.AttentionPlan.of([type(group)([0], group.slots, group.visible[-1:])])
    alone = fixed_order.attention(query[:, -1:].contiguous(), keys, values, last, 0.25, None)
    assert torch.equal(alone[:, 0], out[:, -1])
    _, _, other = _attention_case(64, 3, generator)
    other = type(other)([5, 6, 7], other.slots[:64], other.visible)
    query_both = torch.cat([query, torch.randn(6, 3, 16, generator=generator)], 1)
    both = fixed_order.attention(query_both, keys, values,
                                 fixed_order.AttentionPlan.of([group, other]), 0.25, None)
    assert torch.equal(both[:, :5], out)


def test_attention_soft_caps_and_reads_bfloat16_keys():
    generator = torch.Generator().manual_seed(1)
    keys, values, group = _attention_case(24, 2, generator)
    query = torch.randn(2, 2, 16, generator=generator)
    plan = fixed_order.AttentionPlan.of([group])
    k, v = keys[:, group.slots], values[:, group.slots]
    scores = torch.tanh(query @ k.transpose(1, 2) / 5.0) * 5.0
    expected = torch.softmax(scores.masked_fill(~group.visible, float("-inf")), -1) @ v
    torch.testing.assert_close(fixed_order.attention(query, keys, values, plan, 1.0, 5.0),
                               expected, atol=1e-5, rtol=1e-5)
    half = fixed_order.attention(query, keys.bfloat16(), values.bfloat16(), plan, 1.0, 5.0)
    torch.testing.assert_close(half, expected, atol=3e-2, rtol=3e-2)
    with pytest.raises(RuntimeError, match="float32"):
        fixed_order.attention(query.double(), keys, values, plan, 1.0, None)
