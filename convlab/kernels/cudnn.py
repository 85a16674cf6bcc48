"""cudnn, cudnn-tf32: PyTorch's F.conv2d (cuDNN) on the same device arrays, as reference rows.

PyTorch is optional: without it these variants report SKIP with the reason. Arrays cross from
CuPy to PyTorch through DLPack (no copies); cuDNN's autotuner (cudnn.benchmark) is on, and
prepare() runs the op once so the algorithm search stays out of any timed region.
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
        w = torch.from_dlpack(device_weights(weights))
        b = torch.from_dlpack(device_weights(bias)) if bias is not None else None
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

        return Op(launch, self.output_shape(shape, epilogue), epilogue=epilogue)


class CudnnTF32(Cudnn):
    name = "cudnn-tf32"
    summary = "cuDNN via PyTorch F.conv2d with TF32 tensor cores allowed"
    precision = "tf32"
    allow_tf32 = True
