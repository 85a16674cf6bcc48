"""cudnn, cudnn-tf32: PyTorch's F.conv2d (cuDNN) on the same device arrays, as reference rows.

PyTorch is optional: without it these variants report SKIP with the reason. Arrays cross from
CuPy to PyTorch through DLPack (no copies); cuDNN's autotuner (cudnn.benchmark) is on, and
prepare() runs the op once so the algorithm search stays out of any timed region.
"""

from .base import TANH_POOL, Op, Support, Variant, check_epilogue, device_weights


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


class Cudnn(Variant):
    name = "cudnn"
    summary = "cuDNN via PyTorch F.conv2d, FP32 (TF32 off); the speed to beat"
    epilogues = (TANH_POOL,)
    allow_tf32 = False

    def supports(self, shape):
        if _torch() is None:
            return Support(False, "needs PyTorch with CUDA (pip install torch)")
        return Support(True)

    def prepare(self, shape, weights, epilogue=None):
        check_epilogue(self, epilogue)
        torch = _torch()
        if torch is None:
            raise RuntimeError(self.supports(shape).reason)
        F = torch.nn.functional
        w = torch.from_dlpack(device_weights(weights))
        stride, pad = shape.stride, shape.pad
        allow_tf32 = self.allow_tf32
        cache: dict = {}

        def launch(x, y):
            import cupy

            torch.backends.cudnn.benchmark = True
            torch.backends.cudnn.allow_tf32 = allow_tf32
            if cache.get("x") is not x:  # DLPack views are made once per input array
                cache["x"], cache["xt"] = x, torch.from_dlpack(x)
            out = F.conv2d(cache["xt"], w, stride=stride, padding=pad)
            if epilogue == TANH_POOL:
                out = F.max_pool2d(torch.tanh(out), 2)
            cache["out"] = out
            return cupy.from_dlpack(out)

        return Op(launch, self.output_shape(shape, epilogue))


class CudnnTF32(Cudnn):
    name = "cudnn-tf32"
    summary = "cuDNN via PyTorch F.conv2d with TF32 tensor cores allowed"
    precision = "tf32"
    allow_tf32 = True
