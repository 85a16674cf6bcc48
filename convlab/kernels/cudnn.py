"""cudnn, cudnn-tf32, cudnn-fp16, cudnn-bf16: PyTorch's F.conv2d (cuDNN) on the same device
arrays, as reference rows: each of our variants is compared with cuDNN in its own precision.

PyTorch is optional: without it these variants report SKIP with the reason. Arrays cross from
CuPy to PyTorch through DLPack (no copies); cuDNN's autotuner (cudnn.benchmark) is on, and the
warm-up runs keep the algorithm search out of any timed region. The half-precision rows get
half inputs and weights, converted once outside the timed region (Op.stage), like ours, and
return cuDNN's half output as it is: converting it back is left out of their time.
"""

from ..shapes import FEATURES
from .base import RELU, TANH_POOL, Op, Support, Variant, check_inputs, device_weights


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


class Cudnn(Variant):
    name = "cudnn"
    summary = "cuDNN via PyTorch F.conv2d, FP32 (TF32 off); the speed to beat"
    epilogues = (TANH_POOL, RELU)
    general = frozenset(FEATURES)
    allow_tf32 = False
    dtype = "float32"  # what cuDNN reads and writes

    def supports(self, shape):
        if _torch() is None:
            return Support(False, "needs PyTorch with CUDA (pip install torch)")
        return super().supports(shape)

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)
        torch = _torch()
        if torch is None:
            raise RuntimeError(self.supports(shape).reason)
        F = torch.nn.functional
        dtype = getattr(torch, self.dtype)
        w = torch.from_dlpack(device_weights(weights)).to(dtype)
        b = torch.from_dlpack(device_weights(bias)).to(dtype) if bias is not None else None
        stride, pad, groups = shape.stride, shape.pad, shape.groups
        allow_tf32 = self.allow_tf32
        cache: dict = {}

        def launch(x, y):
            import cupy

            torch.backends.cudnn.benchmark = True
            torch.backends.cudnn.allow_tf32 = allow_tf32
            if cache.get("x") is not x:  # DLPack views are made once per input array
                cache["x"], cache["xt"] = x, torch.from_dlpack(x)
            out = F.conv2d(cache["xt"], w, b, stride=stride, padding=pad, groups=groups)
            if epilogue == TANH_POOL:
                out = F.max_pool2d(torch.tanh(out), 2)
            elif epilogue == RELU:
                out = F.relu(out)
            cache["out"] = out
            return cupy.from_dlpack(out)

        def to_dtype(x):
            return cupy_from_torch(torch.from_dlpack(x).to(dtype))

        stage = to_dtype if self.dtype != "float32" else None
        return Op(launch, self.output_shape(shape, epilogue), epilogue=epilogue, capturable=False,
                  stage_input=stage)


def cupy_from_torch(tensor):
    import cupy

    return cupy.from_dlpack(tensor)


class CudnnTF32(Cudnn):
    name = "cudnn-tf32"
    summary = "cuDNN via PyTorch F.conv2d with TF32 tensor cores allowed"
    precision = "tf32"
    allow_tf32 = True


class CudnnFP16(Cudnn):
    name = "cudnn-fp16"
    summary = "cuDNN via PyTorch F.conv2d on half inputs and weights (FP32 accumulation)"
    precision = "fp16"
    dtype = "float16"


class CudnnBF16(Cudnn):
    name = "cudnn-bf16"
    summary = "cuDNN via PyTorch F.conv2d on bfloat16 inputs and weights"
    precision = "bf16"
    dtype = "bfloat16"
