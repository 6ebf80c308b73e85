"""The few-rows CPU kernel (``kernels/cpu_rows.c``): F.linear's result against a float64 oracle, for every row
count across its groups of 8, awkward widths and both weight dtypes; and each row's result bit for bit the
same alone as beside other rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from solutions.kernels import cpu_rows
from solutions.quant.linear import QuantLinear, int4_mm_cpu, use_fastest_int4

pytestmark = pytest.mark.skipif(cpu_rows.library() is None, reason="no C compiler to build cpu_rows.c")
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 1e-2}
SHAPES = [(1, 1), (7, 13), (16, 64), (65, 33), (960, 576), (49, 1536)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_features,in_features", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_the_kernel_computes_f_linear(dtype, out_features, in_features, bias):
    generator = torch.Generator().manual_seed(out_features * 1000 + in_features)
    weight = torch.randn(out_features, in_features, generator=generator).to(dtype)
    b = torch.randn(out_features, generator=generator).to(dtype) if bias else None
    packed = cpu_rows.pack(weight)
    for rows in (1, 2, 7, 8, 9, 17):
        x = torch.randn(rows, in_features, generator=generator).to(dtype)
        expected = F.linear(x.double(), weight.double(), None if b is None else b.double())
        got = cpu_rows.apply(x, packed, b)
        assert got.dtype == dtype and got.shape == (rows, out_features)
        rel = float((got.double() - expected).norm() / expected.norm())
        shape = f"{out_features}x{in_features}"
        assert rel < TOLERANCE[dtype], f"{dtype} {shape}, {rows} rows: relative error {rel:.1e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(dtype):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(320, 1536, generator=generator).to(dtype)
    packed = cpu_rows.pack(weight)
    x = torch.randn(19, 1536, generator=generator).to(dtype)
    together = cpu_rows.apply(x, packed, None)
    for row in range(19):
        alone = cpu_rows.apply(x[row : row + 1].contiguous(), packed, None)
        assert torch.equal(alone[0], together[row]), f"row {row} differs alone and among 19 rows"


def test_an_input_of_another_dtype_is_refused():
    packed = cpu_rows.pack(torch.randn(16, 8))
    with pytest.raises(TypeError, match="the packed weight is torch.float32, the input torch.bfloat16"):
        cpu_rows.apply(torch.randn(2, 8).to(torch.bfloat16), packed, None)


def test_a_weight_of_another_dtype_is_not_supported():
    assert not cpu_rows.supports(torch.float16)


@pytest.mark.parametrize(
    "out_features,in_features,group_size", [(64, 64, 64), (192, 576, 64), (128, 1536, 128)]
)
def test_the_int4_kernel_computes_torchs_int4_product(out_features, in_features, group_size):
    """``rows_int4`` reads torch's INT4 layout as it is: against the dequantized weight in float64 (inputs
    rounded to bfloat16, as torch's kernel rounds them, and its result rounded to bfloat16 as torch's is),
    every row count across its groups of 8, float32 or bfloat16 inputs; and each row the same alone as among
    17."""
    generator = torch.Generator().manual_seed(out_features + in_features)
    layer = QuantLinear.from_float(torch.randn(out_features, in_features, generator=generator), 4, group_size)
    weight = layer.dequantize().double()
    x = torch.randn(17, in_features, generator=generator)
    together = cpu_rows.apply_int4(x, layer.qweight, group_size, layer.scale_offset)
    expected = x.to(torch.bfloat16).double() @ weight.T
    rel = float((together.double() - expected).norm() / expected.norm())
    assert rel < 4e-3, f"relative error {rel:.1e} against the dequantized weight"
    assert torch.equal(together, together.to(torch.bfloat16).float()), "the result is not rounded to bfloat16"
    bf16 = cpu_rows.apply_int4(x.to(torch.bfloat16), layer.qweight, group_size, layer.scale_offset)
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16.float(), together), "bfloat16 inputs differ"
    for rows in (1, 2, 8, 9):
        alone = cpu_rows.apply_int4(x[:rows].contiguous(), layer.qweight, group_size, layer.scale_offset)
        assert torch.equal(alone, together[:rows]), f"the first {rows} rows differ alone and among 17"


def test_a_quant_linear_runs_the_packed_kernel_where_its_rows_say(monkeypatch):
    """``use_fastest_int4`` under the batch-invariant mode gives every row count the packed kernel, and the
    layer's result is torch's to bfloat16 rounding."""
    monkeypatch.setenv("FASTMODE_BATCH_INVARIANT", "1")
    holder = torch.nn.Module()
    holder.proj = QuantLinear.from_float(
        torch.randn(128, 256, generator=torch.Generator().manual_seed(1)), 4, 64
    )
    assert use_fastest_int4(holder) == {}  # nothing measured: the invariant mode needs one kernel
    assert set(holder.proj.rows_paths) == {"packed"} and holder.proj.prefill_path == "packed"
    x = torch.randn(5, 256)
    calls, original = [], cpu_rows.apply_int4
    monkeypatch.setattr(cpu_rows, "apply_int4", lambda *args: calls.append(1) or original(*args))
    got = holder.proj(x)
    assert calls, "the layer did not call the packed kernel"
    holder.proj(torch.randn(70, 256))  # a prompt's rows too: its K/V must be what a lone decode computes
    assert len(calls) == 2, "a call of more than 64 rows left the packed kernel under the invariant mode"
    torch_result = int4_mm_cpu(x, holder.proj.qweight, 64, holder.proj.scale_offset)
    assert got.dtype == torch.float32
    assert torch.allclose(got, torch_result, rtol=1e-2, atol=1e-2)
