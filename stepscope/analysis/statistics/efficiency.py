"""Kernel efficiency: each op's FLOPs and bytes from its recorded shapes (record_shapes), the GPU
time of the kernels it launched, achieved TFLOP/s and TB/s, and where that sits under the device's
roofline (devices.py), per op and per kernel, as TraceLens reports them.

FLOPs are counted as multiply-adds x 2 for GEMMs (mm, addmm, bmm, baddbmm, _scaled_mm),
convolutions (2·N·K·out-spatial·C/groups·kernel-spatial; a backward pass once per gradient it
computes) and attention (2·B·H·Lq·Lk·(D + Dv), halved when causal; backward 2.5x forward: five
GEMMs for two). Elementwise ops count 1 FLOP per output element (copies and fills 0), sum and
mean 1 per input element, softmax 5 and layer/RMS norm 8. Bytes are each tensor read once and the
output written once (no cache reuse), the traffic a kernel cannot avoid. A kernel belongs to the
innermost op that launched it (Kineto's External id), so aten::linear's time is its addmm's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import numpy as np

from stepscope.analysis.loading.trace import KERNEL_CATS, Trace

from ..model import DeviceSpec, OpEfficiency
from . import intervals
from .devices import DevicePeak, device_peak

# dtype as the profiler writes it -> (bytes per element, class of peak rate; "" for none).
_DTYPES = {
    "float": (4, "fp32"),
    "c10::BFloat16": (2, "bf16"),
    "c10::Half": (2, "fp16"),
    "double": (8, ""),
    "c10::Float8_e4m3fn": (1, "fp8"),
    "c10::Float8_e5m2": (1, "fp8"),
    "c10::Float8_e4m3fnuz": (1, "fp8"),
    "c10::Float8_e5m2fnuz": (1, "fp8"),
    "long int": (8, ""),
    "long": (8, ""),
    "int": (4, ""),
    "short": (2, ""),
    "unsigned char": (1, ""),
    "signed char": (1, ""),
    "bool": (1, ""),
}
# Attention ops: (layout of q/k/v dims, position of the argument saying causal, backward).
_ATTENTION = {
    "aten::_scaled_dot_product_flash_attention": ("BHLD", 4, False),
    "aten::_scaled_dot_product_efficient_attention": ("BHLD", 6, False),
    "aten::_scaled_dot_product_cudnn_attention": ("BHLD", 6, False),
    "aten::_scaled_dot_product_flash_attention_backward": ("BHLD", 11, True),
    "aten::_scaled_dot_product_efficient_attention_backward": ("BHLD", 10, True),
    "aten::_scaled_dot_product_cudnn_attention_backward": ("BHLD", 11, True),
    "aten::_flash_attention_forward": ("BLHD", 8, False),
    "aten::_flash_attention_backward": ("BLHD", 11, True),
    "aten::_efficient_attention_forward": ("BLHD", 9, False),
    "aten::_efficient_attention_backward": ("BLHD", 12, True),
    "flash_attn::_flash_attn_forward": ("BLHD", 5, False),
    "flash_attn::_flash_attn_backward": ("BLHD", 11, True),
}
_FLOPS_PER_ELEMENT = {
    "aten::_softmax": 5,
    "aten::_log_softmax": 5,
    "aten::native_layer_norm": 8,
    "aten::_fused_rms_norm": 8,
    "aten::sum": 1,
    "aten::mean": 1,
}
_NO_FLOPS = ("aten::copy_", "aten::fill_")
MAX_ROWS = 50
MAX_SIZE = 1 << 40  # elements along one dimension: more is no tensor that ran


@dataclass(frozen=True)
class Cost:
    family: str
    flops: float
    bytes: float
    dtype: str  # the profiler's dtype of the op's main input


def _numel(dims: list) -> int:
    return math.prod(int(d) for d in dims)


def _size(dtype: str) -> int:
    return _DTYPES.get(dtype, (0, ""))[0]


def _tensors(dims: list, types: list) -> list[tuple[list, str]]:
    """The inputs that are tensors with dims and a known dtype. A Python number is recorded with
    no dims and a dtype too ("double"), like a 0-dim tensor: both are left out, a few bytes."""
    return [(d, t) for d, t in zip(dims, types) if isinstance(d, list) and d and t in _DTYPES]


def _gemm(name: str, dims: list, types: list, concrete: list) -> Cost | None:
    t = _tensors(dims, types)
    if name in ("aten::addmm", "aten::baddbmm"):
        bias, t = t[:1], t[1:]
    else:
        bias = []
    if len(t) < 2 or len(t[0][0]) != len(t[1][0]) or len(t[0][0]) not in (2, 3):
        return None
    (a, ta), (b, tb) = t[0], t[1]
    batch = a[0] if len(a) == 3 else 1
    m, k, n = a[-2], a[-1], b[-1]
    out_type = "c10::BFloat16" if name == "aten::_scaled_mm" else ta
    nbytes = batch * (m * k * _size(ta) + k * n * _size(tb) + m * n * _size(out_type)) + sum(
        _numel(d) * _size(x) for d, x in bias
    )
    return Cost("gemm", 2.0 * batch * m * n * k, float(nbytes), ta)


def _ints_of(text: str) -> list[int] | None:
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    return [int(v) for v in value] if isinstance(value, list) and all(isinstance(v, int) for v in value) else None


def _conv(name: str, dims: list, types: list, concrete: list) -> Cost | None:
    t = _tensors(dims, types)
    if name == "aten::convolution_backward":
        if len(t) < 3 or len(t[0][0]) < 3:
            return None
        (grad_out, dtype), (inp, _), (weight, _) = t[:3]
        # output_mask: which of grad input, grad weight (and grad bias, a reduction) it computes.
        mask = concrete[-1].strip("[]").split(",") if concrete and concrete[-1].startswith("[") else ["True", "True"]
        grad_in, grad_w = ((m.strip() == "True") for m in (mask + ["False", "False"])[:2])
        flops = 2.0 * _numel(grad_out) * _numel(weight[1:]) * (grad_in + grad_w)
        written = _numel(inp) * grad_in + _numel(weight) * grad_w
        return Cost(
            "conv", flops, float((_numel(grad_out) + _numel(inp) + _numel(weight) + written) * _size(dtype)), dtype
        )
    if len(t) < 2 or len(t[0][0]) < 3 or len(t[0][0]) != len(t[1][0]):
        return None
    (inp, dtype), (weight, _) = t[0], t[1]
    lists = [v for v in (_ints_of(c) for c in concrete[2:] if c.startswith("[")) if v is not None]
    spatial = len(inp) - 2
    if len(lists) < 3 or any(len(v) != spatial for v in lists[:3]):
        return None  # padding, stride and dilation not recorded (older profilers)
    padding, stride, dilation = lists[:3]
    out = [
        (inp[2 + i] + 2 * padding[i] - dilation[i] * (weight[2 + i] - 1) - 1) // stride[i] + 1 for i in range(spatial)
    ]
    out_numel = inp[0] * weight[0] * _numel(out)
    flops = 2.0 * out_numel * _numel(weight[1:])
    return Cost("conv", flops, float((_numel(inp) + _numel(weight) + out_numel) * _size(dtype)), dtype)


def _attention(name: str, dims: list, types: list, concrete: list) -> Cost | None:
    layout, causal_at, backward = _ATTENTION[name]
    t = _tensors(dims, types)[1:] if backward else _tensors(dims, types)  # backward starts with grad_out
    if len(t) < 3 or any(len(d) != 4 for d, _ in t[:3]):
        return None
    (q, dtype), (k, _), (v, _) = t[:3]
    if layout == "BHLD":
        b, h, lq, d = q
        lk, dv = k[2], v[3]
    else:
        b, lq, h, d = q
        lk, dv = k[1], v[3]
    causal = causal_at < len(concrete) and concrete[causal_at] not in ("", "False", "0")
    flops = 2.0 * b * h * lq * lk * (d + dv) / (2 if causal else 1)
    nbytes = (_numel(q) + _numel(k) + _numel(v) + b * h * lq * dv) * _size(dtype)
    return Cost("attention", flops * (2.5 if backward else 1.0), float(nbytes * (2 if backward else 1)), dtype)


def _elementwise(name: str, dims: list, types: list, concrete: list) -> Cost | None:
    t = _tensors(dims, types)
    if not t:
        return None
    dtype = t[0][1]
    if name in _FLOPS_PER_ELEMENT:
        n = _numel(t[0][0])
        reduction = name in ("aten::sum", "aten::mean")
        nbytes = n * _size(dtype) * (1 if reduction else 2) + sum(_numel(d) * _size(x) for d, x in t[1:])
        return Cost(
            "reduction" if reduction else "normalization", float(_FLOPS_PER_ELEMENT[name] * n), float(nbytes), dtype
        )
    try:
        out = list(np.broadcast_shapes(*(tuple(d) for d, _ in t)))
    except ValueError:
        return None
    n = _numel(out)
    reads = (
        0 if name == "aten::fill_" else sum(_numel(d) * _size(x) for d, x in (t[1:] if name == "aten::copy_" else t))
    )
    flops = 0.0 if name in _NO_FLOPS else float(n)
    return Cost("elementwise", flops, float(reads + n * _size(dtype)), dtype)


def op_cost(name: str, dims: list, types: list, concrete: list) -> Cost | None:
    """FLOPs and bytes of one op from its recorded inputs; None where the shapes do not say."""
    family: Callable[[str, list, list, list], Cost | None]
    # Sizes of a corrupt or hostile trace (negative, absurd, not numbers) give no figures.
    if any(
        not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < MAX_SIZE
        for d in dims
        if isinstance(d, list)
        for x in d
    ):
        return None
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm"):
        family = _gemm
    elif name in ("aten::cudnn_convolution", "aten::miopen_convolution", "aten::convolution_backward"):
        family = _conv
    elif name in _ATTENTION:
        family = _attention
    else:
        family = _elementwise
    try:
        return family(name, dims, types, concrete)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None  # shapes of another form than the op's signature has (a corrupt or foreign trace)


def _decode(text: bytes) -> list:
    try:
        value = msgspec.json.decode(text) if text else []
    except msgspec.DecodeError:
        return []
    return value if isinstance(value, list) else []


def device_of(trace: Trace, gpu: int) -> DeviceSpec | None:
    """The device `gpu` (a deviceProperties id) and its peaks; None where it is not in the table."""
    if not 0 <= gpu < len(trace.devices):
        return None
    name, units, memory = trace.devices[gpu]
    peak: DevicePeak | None = device_peak(name, units, memory)
    return DeviceSpec(name=name, model=peak.name, tflops=peak.tflops, tbs=peak.tbs) if peak else None


def _row(
    name: str,
    cost: Cost | None,
    count: int,
    gpu_us: float,
    flops: float,
    nbytes: float,
    device: DeviceSpec | None,
    **known: str,
) -> OpEfficiency:
    assert cost is not None  # kernels are linked to costed ops only
    dtype = cost.dtype
    rate_class = _DTYPES.get(dtype, (0, ""))[1]
    peak_tflops = device.tflops.get(rate_class, 0.0) if device else 0.0
    peak_tbs = device.tbs if device else 0.0
    tflops = flops / gpu_us / 1e6 if gpu_us > 0 else 0.0
    tbs = nbytes / gpu_us / 1e6 if gpu_us > 0 else 0.0
    # Achieved over the roofline at this intensity, min(peak, intensity x bandwidth): the larger of
    # the two fractions of peak.
    shares = [
        x
        for x in (tflops / peak_tflops if peak_tflops else None, tbs / peak_tbs if peak_tbs else None)
        if x is not None
    ]
    return OpEfficiency(
        name=name,
        family=cost.family,
        dtype=dtype,
        count=count,
        gpuUs=gpu_us,
        flops=flops,
        bytes=nbytes,
        tflops=tflops,
        tbs=tbs,
        peakTflops=peak_tflops,
        peakTbs=peak_tbs,
        pctOfPeak=round(100 * max(shares), 2) if shares else None,
        **known,
    )


def efficiency(
    trace: Trace, device: DeviceSpec | None, top: int = MAX_ROWS
) -> tuple[list[OpEfficiency], list[OpEfficiency]]:
    """Per op (name, shapes, dtype) and per kernel: the `top` of each by GPU time."""
    sh = trace.shapes
    if len(sh.row) == 0:
        return [], []
    # GPU time of each op: its kernels share its External id. Only ops that launched kernels are costed.
    kernels = np.flatnonzero(trace.cat_mask(KERNEL_CATS) & (trace.stream != -1) & (trace.external_id >= 0))
    op_of_kernel = intervals.lookup(trace.external_id[sh.row], trace.external_id[kernels])
    linked = op_of_kernel >= 0
    kernels, op_of_kernel = kernels[linked], op_of_kernel[linked]
    used = np.unique(op_of_kernel)
    if len(used) == 0:
        return [], []
    # Ops of one shape repeat thousands of times with the same recorded text: each is costed once.
    keys = [
        b"\0".join((str(int(trace.name[sh.row[i]])).encode(), sh.dims[i], sh.types[i], sh.concrete[i])) for i in used
    ]
    distinct, first_used, inverse_used = np.unique(np.array(keys, dtype=object), return_index=True, return_inverse=True)
    first = used[first_used]  # index into sh of each distinct op shape's first op
    inverse = np.full(len(sh.row), -1)
    inverse[used] = inverse_used.reshape(-1)
    costs = []
    for i in first:
        name = trace.names[int(trace.name[sh.row[i]])]
        costs.append(
            op_cost(name, _decode(sh.dims[i]), _decode(sh.types[i]), [str(v) for v in _decode(sh.concrete[i])])
        )
    costed = np.array([c is not None for c in costs], dtype=bool)
    keep = costed[inverse[op_of_kernel]]
    kernels, op_of_kernel = kernels[keep], op_of_kernel[keep]
    if len(kernels) == 0:
        return [], []
    dur = trace.dur[kernels]
    op_us = np.bincount(op_of_kernel, weights=dur, minlength=len(sh.row))
    # Ops without kernels (inverse -1) take the trailing 0.
    flops = np.array([c.flops if c else 0.0 for c in costs] + [0.0])[inverse]
    nbytes = np.array([c.bytes if c else 0.0 for c in costs] + [0.0])[inverse]
    ran = op_us > 0
    # Per distinct op shape.
    group = inverse[ran]
    g_us = np.bincount(group, weights=op_us[ran], minlength=len(distinct))
    g_flops = np.bincount(group, weights=flops[ran], minlength=len(distinct))
    g_bytes = np.bincount(group, weights=nbytes[ran], minlength=len(distinct))
    g_count = np.bincount(group, minlength=len(distinct))
    main_kernel = _main_kernel(trace, kernels, inverse[op_of_kernel], dur, len(distinct))
    ops = [
        _row(
            trace.names[int(trace.name[sh.row[first[g]]])],
            costs[g],
            int(g_count[g]),
            float(g_us[g]),
            float(g_flops[g]),
            float(g_bytes[g]),
            device,
            shapes=_compact(sh.dims[first[g]]),
            related=main_kernel[g],
        )
        for g in np.argsort(-g_us, kind="stable")[:top]
        if g_us[g] > 0 and costs[g] is not None
    ]
    # Per kernel name: each kernel takes its op's FLOPs and bytes in proportion to its time.
    share = np.divide(dur, op_us[op_of_kernel], out=np.zeros(len(dur)), where=op_us[op_of_kernel] > 0)
    codes, k_inverse = np.unique(trace.name[kernels], return_inverse=True)
    k_us = np.bincount(k_inverse, weights=dur)
    k_flops = np.bincount(k_inverse, weights=share * flops[op_of_kernel])
    k_bytes = np.bincount(k_inverse, weights=share * nbytes[op_of_kernel])
    k_count = np.bincount(k_inverse)
    op_group = inverse[op_of_kernel]
    per_kernel = []
    for k in np.argsort(-k_us, kind="stable")[:top]:
        groups = op_group[k_inverse == k]
        g = int(np.bincount(groups, weights=dur[k_inverse == k]).argmax())
        per_kernel.append(
            _row(
                trace.names[int(codes[k])],
                costs[g],
                int(k_count[k]),
                float(k_us[k]),
                float(k_flops[k]),
                float(k_bytes[k]),
                device,
                shapes=_compact(sh.dims[first[g]]),
                related=trace.names[int(trace.name[sh.row[first[g]]])],
            )
        )
    return ops, per_kernel


def _main_kernel(trace: Trace, kernels: np.ndarray, groups: np.ndarray, dur: np.ndarray, n: int) -> list[str]:
    """The kernel of most time of each op shape."""
    pairs, inverse = np.unique(np.stack([groups, trace.name[kernels]]), axis=1, return_inverse=True)
    time = np.bincount(inverse.reshape(-1), weights=dur)
    best = np.full(n, -1)
    order = np.argsort(time, kind="stable")  # the longest last: it wins the assignment
    best[pairs[0][order]] = pairs[1][order]
    return [trace.names[int(c)] if c >= 0 else "" for c in best]


def _compact(dims: bytes) -> str:
    """The tensor inputs' dims as one short line, '[888,2880] [2880,640]' (scalars, which have
    none, left out)."""
    return " ".join(msgspec.json.encode(d).decode() for d in _decode(dims) if isinstance(d, list) and d)[:200]
