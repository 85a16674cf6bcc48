"""cuDNN through PyTorch, as reference rows: each precision class (fp32, tf32, fp16, bf16) in
both activation layouts, NCHW (`cudnn`, `cudnn-tf32`, ...) and channels-last (`cudnn-nhwc`,
`cudnn-nhwc-tf32`, ...). A speed claim is measured against the faster of the two rows of its
class (compare.finish), because cuDNN picks other, often much faster, kernels for NHWC tensors.

PyTorch is optional: without it these variants report SKIP with the reason. Arrays cross from
CuPy to PyTorch through DLPack (no copies); cuDNN's autotuner (cudnn.benchmark) is on, and the
warm-up runs keep the algorithm search out of any timed region. Everything a user would do once
per tensor is staging, outside the timed region (Op.stage), as our own fp16 inputs are: the
conversion to half or bfloat16 and to channels-last. Outputs are returned as cuDNN leaves them
(half, channels-last strides): converting them back is left out of their time.

1x1 layers with stride 1 have a third row per class, `cublas-gemm` (`-tf32`, `-fp16`, `-bf16`):
the layer as one cuBLAS matrix product with the bias (and ReLU) in its epilogue, what a PyTorch
user can write instead of F.conv2d for such a layer. It competes with the two cuDNN rows.

Conv + bias + ReLU: PyTorch exposes cuDNN's fused convolution-bias-activation as
`torch.cudnn_convolution_relu`. Where a layer has a ReLU epilogue, both that and conv-then-ReLU
are timed once when the op is prepared, and the faster is kept; the row's note says which.
"""

import contextlib
from dataclasses import dataclass

from ..gpu import timer
from ..shapes import FEATURES, NCHW, NHWC
from .base import RELU, TANH_POOL, Op, Support, Variant, check_inputs, device_weights

CONV_THEN_RELU = "conv, then ReLU"
FUSED_RELU = "fused conv-bias-ReLU (torch.cudnn_convolution_relu)"


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


@dataclass(frozen=True)
class ClassMaths:
    """What a precision class's reference rows read and write, and how PyTorch is told."""

    dtype: str
    allow_tf32: bool
    words: str  # for the summary


CLASS_MATHS = {
    "fp32": ClassMaths("float32", False, "FP32 (TF32 off)"),
    "tf32": ClassMaths("float32", True, "TF32 tensor cores allowed"),
    "fp16": ClassMaths("float16", False, "half inputs and weights (FP32 accumulation)"),
    "bf16": ClassMaths("bfloat16", False, "bfloat16 inputs and weights"),
}


class Cudnn(Variant):
    """One class's cuDNN row in one layout: `cudnn`, `cudnn-nhwc`, `cudnn-tf32`, ...
    (reference_rows registers each)."""

    stem = "cudnn"
    epilogues = (TANH_POOL, RELU)
    general = frozenset(FEATURES)
    plain_note = CONV_THEN_RELU
    fused_note = FUSED_RELU

    def __init__(self, precision: str = "fp32", layout: str = NCHW):
        maths = CLASS_MATHS[precision]
        self.precision, self.layout = precision, layout
        self.dtype, self.allow_tf32 = maths.dtype, maths.allow_tf32  # what it reads and writes
        self.name = self.row_name(precision, layout)
        self.summary = self.describe(maths, layout)

    @classmethod
    def row_name(cls, precision: str, layout: str) -> str:
        return (cls.stem + ("-nhwc" if layout == NHWC else "")
                + ("" if precision == "fp32" else f"-{precision}"))

    @staticmethod
    def describe(maths: ClassMaths, layout: str) -> str:
        tensors = "channels-last" if layout == NHWC else "NCHW"
        return f"cuDNN via PyTorch F.conv2d, {maths.words}, {tensors} tensors"

    @staticmethod
    def fits(shape) -> bool:
        """Whether this reference row applies to the layer at all (cuDNN's: every layer)."""
        return True

    def supports(self, shape):
        if _torch() is None:
            return Support(False, "needs PyTorch with CUDA (pip install torch)")
        return super().supports(shape)

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)
        torch = _torch()
        if torch is None:
            raise RuntimeError(self.supports(shape).reason)
        w = torch.from_dlpack(device_weights(weights)).to(self._torch_dtype(torch))
        b = (torch.from_dlpack(device_weights(bias)).to(self._torch_dtype(torch))
             if bias is not None else None)
        plain, fused = self._calls(torch, shape, w, b, epilogue)
        cache: dict = {}
        chosen = {"fn": plain}
        streams: dict = {}

        def launch(x, y):
            import cupy

            if cache.get("x") is not x:  # DLPack views are made once per input array
                cache["x"], cache["xt"] = x, torch.from_dlpack(x)
            # PyTorch launches on its own current stream; the network's pipeline runs on a
            # stream of CuPy's that does not wait for the default one: launch on CuPy's.
            ptr = cupy.cuda.get_current_stream().ptr
            if ptr not in streams:
                streams[ptr] = (torch.cuda.ExternalStream(ptr) if ptr
                                else torch.cuda.default_stream())
            with torch.cuda.stream(streams[ptr]), self._switched(torch):
                out = chosen["fn"](cache["xt"])
                cache["out"] = out
                return cupy.from_dlpack(out)

        op = Op(launch, self.output_shape(shape, epilogue), epilogue=epilogue, capturable=False,
                stage_input=self._stager(torch))
        if epilogue == RELU:
            op.note = self._faster_relu(op, shape, chosen, plain, fused)
        return op

    @contextlib.contextmanager
    def _switched(self, torch):
        """PyTorch's switches for this row's maths while it launches, put back after: another
        row, or a PyTorch baseline in the same process, keeps its own."""
        flags = torch.backends.cudnn
        saved = flags.benchmark, flags.allow_tf32
        flags.benchmark, flags.allow_tf32 = True, self.allow_tf32
        try:
            yield
        finally:
            flags.benchmark, flags.allow_tf32 = saved

    def _calls(self, torch, shape, w, b, epilogue):
        """(the layer as PyTorch users write it, the fused conv-bias-ReLU or None where there is
        none): functions of the staged input tensor."""
        F = torch.nn.functional
        w = w.contiguous(memory_format=self._tensor_layout(torch))
        stride, groups, dilation = shape.stride, shape.groups, shape.dilation
        pad = (shape.pad_h, shape.pad_w)

        def conv(xt):
            return F.conv2d(xt, w, b, stride=stride, padding=pad, dilation=dilation,
                            groups=groups)

        def fused(xt):
            return torch.cudnn_convolution_relu(xt, w, b, (stride, stride), pad,
                                                (dilation, dilation), groups)

        def plain(xt):
            out = conv(xt)
            if epilogue == TANH_POOL:
                return F.max_pool2d(torch.tanh(out), 2)
            if epilogue == RELU:
                return F.relu(out)
            return out

        return plain, fused

    def _torch_dtype(self, torch):
        return getattr(torch, self.dtype)

    def _tensor_layout(self, torch):
        return torch.channels_last if self.layout == NHWC else torch.contiguous_format

    def _stager(self, torch):
        """The input as this row reads it: its dtype and layout, converted outside the time."""
        if self.dtype == "float32" and self.layout == NCHW:
            return None
        dtype, layout = self._torch_dtype(torch), self._tensor_layout(torch)

        def stage(x, out=None):  # PyTorch converts into tensors of its own: out is not used
            return cupy_from_torch(torch.from_dlpack(x).to(dtype).contiguous(memory_format=layout))

        return stage

    def _faster_relu(self, op: Op, shape, chosen: dict, plain, fused) -> str:
        """Time the layer then a ReLU, and the fused call, on a random input of the layer's
        shape; keep the faster in `chosen`, and say which. A fused call PyTorch or the library
        refuses for this layer leaves the separate ReLU."""
        import cupy

        x = op.stage(cupy.random.standard_normal(shape.input_shape, dtype=cupy.float32))
        policy = timer.TimingPolicy(warmup=2, min_runs=5, max_runs=30, budget_s=0.3)
        chosen["fn"] = plain
        if fused is None:
            return self.plain_note
        plain_ms = timer.time_device(lambda: op(x, None), policy).median_ms
        chosen["fn"] = fused
        try:
            fused_ms = timer.time_device(lambda: op(x, None), policy).median_ms
        except Exception:  # noqa: BLE001 - no fused kernel for this layer here, or in this PyTorch
            fused_ms = None
        if fused_ms is not None and fused_ms < plain_ms:
            return self.fused_note
        chosen["fn"] = plain
        return self.plain_note


def cupy_from_torch(tensor):
    import cupy

    return cupy.from_dlpack(tensor)


class CublasGemm(Cudnn):
    """A 1x1 convolution with stride 1 is a matrix product over the channels-last input: the
    (pixels x C) view of it times the filters' (C x M). A PyTorch user with such a layer can
    call `torch.addmm` on that view instead of `F.conv2d`, and cuBLAS then adds the bias in
    its GEMM's epilogue (with a ReLU too, through `torch._addmm_activation`): for layers
    without a ReLU that is the fastest thing PyTorch offers, since F.conv2d adds the bias in a
    kernel of its own (ResNet-50's last 1x1s at batch 128 on an H100, 2026-11-27: cuDNN's
    rows at 20-33% of the roofline floor). Rows of each class sit beside cuDNN's as a speedup's
    basis (CUDNN_ROWS). FP32 accumulation in every class: PyTorch's reduced-precision
    reductions for half and bfloat16 are switched off."""

    stem = "cublas-gemm"
    epilogues = (RELU,)
    general = frozenset({"bias"})  # fits() has ruled out the rest
    plain_note = "GEMM with the bias in its epilogue, then ReLU"
    fused_note = "GEMM with bias and ReLU in its epilogue (torch._addmm_activation)"

    def __init__(self, precision: str = "fp32"):
        super().__init__(precision, NHWC)

    @classmethod
    def row_name(cls, precision: str, layout: str) -> str:
        return cls.stem + ("" if precision == "fp32" else f"-{precision}")

    @staticmethod
    def describe(maths: ClassMaths, layout: str) -> str:
        return f"cuBLAS GEMM via PyTorch addmm on a 1x1 layer's channels-last view, {maths.words}"

    @staticmethod
    def fits(shape) -> bool:
        """Whether the layer is one matrix product over its channels-last input."""
        return ((shape.Kh, shape.Kw, shape.stride, shape.groups) == (1, 1, 1, 1)
                and not shape.pad_h and not shape.pad_w)

    def supports(self, shape):
        if not self.fits(shape):
            return Support(False, "a GEMM over the channels-last input: 1x1 layers with "
                                  "stride 1, no padding and one group only")
        return super().supports(shape)

    @contextlib.contextmanager
    def _switched(self, torch):
        matmul = torch.backends.cuda.matmul
        names = ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                 "allow_bf16_reduced_precision_reduction")
        saved = [getattr(matmul, name) for name in names]
        for name, value in zip(names, (self.allow_tf32, False, False)):
            setattr(matmul, name, value)
        try:
            yield
        finally:
            for name, value in zip(names, saved):
                setattr(matmul, name, value)

    def _calls(self, torch, shape, w, b, epilogue):
        C, M = shape.C, shape.M
        wt = w.reshape(M, C).t()

        def rows(xt):  # channels-last (B, C, H, W) -> its (B*H*W, C) view: no copy
            return xt.permute(0, 2, 3, 1).reshape(-1, C)

        def image(out, xt):  # (B*H*W, M) -> (B, M, H, W) with channels-last strides
            return out.view(xt.shape[0], xt.shape[2], xt.shape[3], M).permute(0, 3, 1, 2)

        def gemm(xt):
            return torch.mm(rows(xt), wt) if b is None else torch.addmm(b, rows(xt), wt)

        def plain(xt):
            out = gemm(xt)
            if epilogue == RELU:
                out = torch.relu_(out)
            return image(out, xt)

        def fused(xt):
            return image(torch._addmm_activation(b, rows(xt), wt), xt)

        return plain, (fused if b is not None else None)


def reference_rows() -> list[Variant]:
    """Every reference row, from one table: cuDNN in both layouts for each class, then cuBLAS's
    GEMM for each class."""
    return ([Cudnn(precision, layout) for precision in CLASS_MATHS for layout in (NCHW, NHWC)]
            + [CublasGemm(precision) for precision in CLASS_MATHS])
