"""Kernel efficiency: FLOPs and bytes from recorded shapes against hand computations, per op
family, on synthetic ops and on the ops of real traces (B200, MI300X, H100); achieved rates and
% of the roofline against the device table; the finding; the roofline in the report."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from stepscope.analysis.diagnosis.efficiency import efficiency_findings
from stepscope.analysis.diagnosis.rank_tables import build_tables
from stepscope.analysis.loading.trace import load_trace
from stepscope.analysis.pipeline import analyze_uri
from stepscope.analysis.statistics.devices import device_peak
from stepscope.analysis.statistics.efficiency import op_cost
from stepscope.analysis.statistics.summary import summarize
from tests.analysis.statistics.test_statistics import ev, gpu

BF16, F32 = "c10::BFloat16", "float"


@pytest.mark.parametrize(
    "name, dims, types, concrete, family, flops, nbytes",
    [
        # GEMMs: 2·M·N·K; each operand read once, the output written once.
        (
            "aten::mm",
            [[128, 64], [64, 32]],
            [BF16, BF16],
            ["", ""],
            "gemm",
            2 * 128 * 32 * 64,
            2 * (128 * 64 + 64 * 32 + 128 * 32),
        ),
        (
            "aten::addmm",
            [[32], [128, 64], [64, 32], [], []],
            [BF16, BF16, BF16, "Scalar", "Scalar"],
            ["", "", "", "1", "1"],
            "gemm",
            2 * 128 * 32 * 64,
            2 * (32 + 128 * 64 + 64 * 32 + 128 * 32),
        ),
        (
            "aten::bmm",
            [[4, 128, 64], [4, 64, 32]],
            [F32, F32],
            ["", ""],
            "gemm",
            4 * 2 * 128 * 32 * 64,
            4 * 4 * (128 * 64 + 64 * 32 + 128 * 32),
        ),
        # Convolution: 3x3, stride 2, padding 1 on 32x32 -> 16x16 out; 2·N·K·16·16·C·3·3.
        (
            "aten::cudnn_convolution",
            [[2, 8, 32, 32], [16, 8, 3, 3], [], [], [], [], [], []],
            [F32, F32, "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar"],
            ["", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "False", "False"],
            "conv",
            2 * 2 * 16 * 16 * 16 * 8 * 9,
            4 * (2 * 8 * 32 * 32 + 16 * 8 * 9 + 2 * 16 * 16 * 16),
        ),
        # Grouped (depthwise) convolution: C/groups = 1 input channel per output.
        (
            "aten::miopen_convolution",
            [[1, 8, 10, 10], [8, 1, 3, 3], [], [], [], [], [], [], []],
            [BF16, BF16, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar"],
            ["", "", "", "[0, 0]", "[1, 1]", "[1, 1]", "8", "False", "False"],
            "conv",
            2 * 8 * 8 * 8 * 1 * 9,
            2 * (800 + 72 + 8 * 8 * 8),
        ),
        # Backward of a convolution computing both gradients: twice the forward FLOPs.
        (
            "aten::convolution_backward",
            [[2, 16, 16, 16], [2, 8, 32, 32], [16, 8, 3, 3]],
            [F32, F32, F32],
            ["", "", "", "[0]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[True, True, False]"],
            "conv",
            2 * 2 * 2 * 16 * 16 * 16 * 8 * 9,
            4 * (2 * 16 * 256 + 2 * 2 * 8 * 1024 + 2 * 16 * 72),
        ),
        # Attention: 2·B·H·Lq·Lk·(D + Dv), halved when causal; q, k, v read and the output written.
        (
            "aten::_scaled_dot_product_flash_attention",
            [[2, 4, 128, 64]] * 3 + [[]] * 4,
            [BF16] * 3 + ["Scalar"] * 4,
            ["", "", "", "0.", "True", "False", "0.125"],
            "attention",
            2 * 2 * 4 * 128 * 128 * 128 / 2,
            2 * 4 * 2 * 4 * 128 * 64,
        ),
        (
            "flash_attn::_flash_attn_forward",
            [[2, 128, 4, 64], [2, 256, 4, 64], [2, 256, 4, 64]],
            [BF16] * 3,
            ["", "", "", "0.0", "0.125", "False"],
            "attention",
            2 * 2 * 4 * 128 * 256 * 128,
            2 * (2 * 128 * 256 + 2 * 2 * 256 * 256 + 2 * 4 * 128 * 64),
        ),
        # Elementwise with broadcasting: one FLOP per output element.
        (
            "aten::mul",
            [[8, 16, 32], [1, 16, 1]],
            [BF16, BF16],
            ["", ""],
            "elementwise",
            8 * 16 * 32,
            2 * (4096 + 16 + 4096),
        ),
        (
            "aten::add",
            [[64, 32], [], []],
            [F32, "double", "Scalar"],
            ["", "", "1"],
            "elementwise",
            64 * 32,
            4 * 2 * 64 * 32,
        ),
        (
            "aten::copy_",
            [[64, 32], [64, 32], []],
            [BF16, F32, "Scalar"],
            ["", "", "False"],
            "elementwise",
            0,
            4 * 64 * 32 + 2 * 64 * 32,
        ),
        # Reductions and normalisations.
        (
            "aten::sum",
            [[1024, 512], [], [], []],
            [F32, "ScalarList", "Scalar", ""],
            ["", "[1]", "False", ""],
            "reduction",
            1024 * 512,
            4 * 1024 * 512,
        ),
        (
            "aten::_softmax",
            [[16, 1024], [], []],
            [BF16, "Scalar", "Scalar"],
            ["", "-1", "False"],
            "normalization",
            5 * 16 * 1024,
            2 * 2 * 16 * 1024,
        ),
    ],
)
def test_flops_and_bytes_from_shapes(name, dims, types, concrete, family, flops, nbytes):
    cost = op_cost(name, dims, types, concrete)
    assert cost is not None and cost.family == family
    assert cost.flops == flops and cost.bytes == nbytes


def test_shapes_that_do_not_fit_the_signature_cost_nothing():
    assert op_cost("aten::mm", [[128, 64]], [BF16], [""]) is None
    assert (
        op_cost("aten::cudnn_convolution", [[2, 8, 32, 32], [16, 8, 3, 3]], [F32, F32], ["", ""]) is None
    )  # no stride recorded
    assert op_cost("aten::mul", [[3, 4], [5, 4]], [F32, F32], ["", ""]) is None  # not broadcastable
    assert op_cost("aten::_scaled_dot_product_flash_attention", [["x"], [1], [2]], [BF16] * 3, []) is None
    # A corrupt or hostile trace: negative or absurd sizes give no figures, never an exception.
    assert op_cost("aten::mm", [[-128, 64], [64, 32]], [BF16, BF16], ["", ""]) is None
    assert op_cost("aten::mm", [[10**200, 10**200], [10**200, 10**200]], [BF16, BF16], ["", ""]) is None
    assert op_cost("aten::mul", [[[1, 2]], [3]], [F32, F32], ["", ""]) is None


@pytest.mark.parametrize(
    "name, units, memory_gib, model, bf16, tbs",
    [
        ("NVIDIA H100 80GB HBM3", 132, 80, "H100 SXM", 989.4, 3.35),
        ("NVIDIA H100 PCIe", 114, 80, "H100 PCIe", 756, 2.0),
        ("NVIDIA H800", 132, 80, "H800 SXM", 989.4, 3.35),
        ("NVIDIA A100-PG509-200", 108, 40, "A100 40GB", 312, 1.555),
        ("NVIDIA A100-SXM4-80GB", 108, 80, "A100 SXM 80GB", 312, 2.039),
        ("NVIDIA B200", 148, 180, "B200", 2250, 8.0),
        ("AMD Instinct MI300X", 304, 192, "MI300X", 1307.4, 5.3),
        ("AMD Radeon Graphics", 104, 64, "MI250 (one GCD)", 181.05, 1.6384),
    ],
)
def test_device_table(name, units, memory_gib, model, bf16, tbs):
    peak = device_peak(name, units, memory_gib << 30)
    assert peak is not None and (peak.name, peak.tflops["bf16"], peak.tbs) == (model, bf16, tbs)


def test_v100_and_unknown_devices():
    v100 = device_peak("Tesla V100-SXM2-32GB", 80, 32 << 30)
    assert v100 is not None and v100.tflops == {"fp32": 15.7, "fp16": 125} and v100.tbs == 0.9
    assert device_peak("Quadro GP100", 56, 16 << 30) is None


def _gemm_trace(path: Path, device: str = "NVIDIA H100 80GB HBM3", kernel_us: float = 1000.0) -> Path:
    """One step: a 4096³ bf16 mm whose one kernel takes `kernel_us`, and a short elementwise add."""
    mm = ev(
        "cpu_op",
        "aten::mm",
        0,
        5,
        **{
            "External id": 5,
            "Input Dims": [[4096, 4096], [4096, 4096]],
            "Input type": [BF16, BF16],
            "Concrete Inputs": ["", ""],
        },
    )
    add = ev(
        "cpu_op",
        "aten::add",
        6,
        2,
        **{
            "External id": 6,
            "Input Dims": [[4096, 4096], [4096, 4096], []],
            "Input type": [BF16, BF16, "Scalar"],
            "Concrete Inputs": ["", "", "1"],
        },
    )
    events = [
        ev("user_annotation", "ProfilerStep#1", 0, 2000),
        mm,
        add,
        ev("cuda_runtime", "cudaLaunchKernel", 1, 1, correlation=1, **{"External id": 5}),
        ev("cuda_runtime", "cudaLaunchKernel", 7, 1, correlation=2, **{"External id": 6}),
        gpu("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 10, kernel_us, 1, **{"External id": 5}),
        gpu(
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>(int)",
            10 + kernel_us,
            50,
            2,
            **{"External id": 6},
        ),
    ]
    path.write_text(
        json.dumps(
            {
                "deviceProperties": [{"id": 0, "name": device, "numSms": 132, "totalGlobalMem": 85 << 30}],
                "distributedInfo": {"rank": 0, "world_size": 1},
                "traceEvents": events,
            }
        )
    )
    return path


def test_achieved_rate_and_roofline_share_per_op_and_kernel(tmp_path: Path):
    s = summarize(load_trace(_gemm_trace(tmp_path / "rank-0.json")))
    assert s.device is not None and s.device.model == "H100 SXM"
    mm = next(o for o in s.opEfficiency if o.name == "aten::mm")
    flops = 2 * 4096**3
    assert (mm.count, mm.gpuUs, mm.flops, mm.bytes) == (1, 1000.0, flops, 3 * 4096 * 4096 * 2)
    assert mm.tflops == pytest.approx(flops / 1000e-6 / 1e12)  # 137.4 TFLOP/s
    assert mm.pctOfPeak == pytest.approx(round(100 * mm.tflops / 989.4, 2))  # compute-bound: % of the bf16 peak
    assert mm.related.startswith("sm90_xmma_gemm") and mm.shapes == "[4096,4096] [4096,4096]"
    add = next(o for o in s.opEfficiency if o.name == "aten::add")
    assert add.tbs == pytest.approx(3 * 4096 * 4096 * 2 / 50e-6 / 1e12)  # memory-bound: % of 3.35 TB/s
    assert add.pctOfPeak == pytest.approx(round(100 * add.tbs / 3.35, 2))
    kernel = next(k for k in s.kernelEfficiency if k.name.startswith("sm90_xmma_gemm"))
    assert (kernel.flops, kernel.gpuUs, kernel.related) == (flops, 1000.0, "aten::mm")


def test_dominant_ops_far_below_peak_are_a_finding_and_fast_ones_are_not(tmp_path: Path):
    slow = summarize(load_trace(_gemm_trace(tmp_path / "rank-0.json")), rank=0)
    (finding,) = efficiency_findings(build_tables([slow]))
    assert finding.category == "kernel" and finding.ranks == [0] and finding.severity == "warning"
    assert "aten::mm [4096,4096] [4096,4096] BFloat16 at 14%" in finding.message and "H100 SXM" in finding.message
    fast = summarize(load_trace(_gemm_trace(tmp_path / "rank-1.json", kernel_us=200.0)), rank=1)  # 687 TFLOP/s: 69 %
    assert efficiency_findings(build_tables([fast])) == []
    unknown = summarize(load_trace(_gemm_trace(tmp_path / "rank-2.json", device="Quadro GP100")), rank=2)
    assert unknown.device is None and efficiency_findings(build_tables([unknown])) == []  # no peak, no verdict


def test_report_has_the_roofline_and_the_efficiency_table(tmp_path: Path):
    trace = _gemm_trace(tmp_path / "rank-0.json")
    analyze_uri(str(trace), progress=False, output=str(tmp_path / "out"))
    page = (tmp_path / "out" / "index.html").read_text()
    assert "Kernel efficiency (roofline)" in page and "<polyline" in page and "BFloat16 989 TFLOP/s" in page
    assert "aten::mm [4096,4096] [4096,4096] c10::BFloat16: 137.44 TFLOP/s" in page
    with open(tmp_path / "out" / "kernel_efficiency.csv", newline="") as f:
        rows = {(r["Kind"], r["Name"]): r for r in csv.DictReader(f)}
    assert float(rows["op", "aten::mm"]["TFLOP/s"]) == pytest.approx(137.439, abs=0.001)
    assert rows["op", "aten::mm"]["Device"] == "H100 SXM"


@pytest.mark.parametrize(
    "folder, op, shapes, per_call_flops, per_call_bytes",
    [
        # 2·888·640·2880; (888·2880 + 2880·640 + 888·640 + 640 bias) bf16 elements.
        (
            "tracelens__b200_eager_trace",
            "aten::addmm",
            "[640] [888,2880] [2880,640]",
            2 * 888 * 640 * 2880,
            2 * (888 * 2880 + 2880 * 640 + 888 * 640 + 640),
        ),
        # 3x3 stride 1 padding 1: 56x56 out; 2·10·64·56·56·64·9.
        (
            "tracelens__mi300_resnet_act_checkpoint",
            "aten::miopen_convolution",
            "[10,64,56,56] [64,64,3,3]",
            2 * 10 * 64 * 56 * 56 * 64 * 9,
            2 * (10 * 64 * 56 * 56 * 2 + 64 * 64 * 9),
        ),
        (
            "tracelens__mi300_resnet_act_checkpoint",
            "aten::convolution_backward",
            "[10,64,56,56] [10,64,56,56] [64,64,3,3]",
            2 * 2 * 10 * 64 * 56 * 56 * 64 * 9,
            2 * (3 * 10 * 64 * 56 * 56 + 2 * 64 * 64 * 9),
        ),
        # Causal flash attention, [B, L, H, D] = [16, 559, 16, 64]: 2·16·16·559·559·128 / 2.
        (
            "tracelens__h100_Qwen_Qwen1.5-0.5B-Chat__1016005",
            "aten::_flash_attention_forward",
            "[16,559,16,64] [16,559,16,64] [16,559,16,64]",
            16 * 16 * 559 * 559 * 128,
            2 * 4 * 16 * 559 * 16 * 64,
        ),
        (
            "tracelens__h100_Qwen_Qwen1.5-0.5B-Chat__1016005",
            "aten::mul",
            "[16,16,559,64] [1,1,559,64]",
            16 * 16 * 559 * 64,
            2 * (2 * 16 * 16 * 559 * 64 + 559 * 64),
        ),
        (
            "tracelens__h100_Qwen_Qwen1.5-0.5B-Chat__1016005",
            "aten::mean",
            "[16,559,1024]",
            16 * 559 * 1024,
            4 * 16 * 559 * 1024,
        ),
    ],
)
def test_real_traces_ops_against_hand_computed_flops(
    shared_traces: Path, folder, op, shapes, per_call_flops, per_call_bytes
):
    (path,) = (shared_traces / folder).glob("*.json.gz")
    s = summarize(load_trace(path), top=1000)
    (row,) = [o for o in s.opEfficiency if o.name == op and o.shapes == shapes]
    assert row.flops == per_call_flops * row.count and row.bytes == per_call_bytes * row.count
    assert row.pctOfPeak is not None and 0 < row.pctOfPeak <= 100
