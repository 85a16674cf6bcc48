"""The same network in PyTorch eager mode, on the same weights and device input: the speed to
beat end to end. PyTorch is optional; without it (or without CUDA) this reports why."""

from __future__ import annotations

from typing import Callable

from .models import LRN, Conv, Dense, Flatten, MaxPool, ReLU, Softmax, Tanh, Weights


def unavailable_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (pip install -e \".[train]\")"
    if not torch.cuda.is_available():
        return "PyTorch has no CUDA device"
    return None


def eager_forward(weights: Weights, x, tf32: bool = False) -> Callable[[], object]:
    """A function running the model's forward pass in PyTorch eager mode (cuDNN convolutions,
    `torch.backends.cudnn.benchmark` on so cuDNN picks its fastest algorithm, TF32 off unless
    asked) on the device array x (CuPy, shared through DLPack). It returns the probabilities."""
    import torch
    import torch.nn.functional as F

    t = {k: torch.from_dlpack(_device(v)) for k, v in weights.arrays.items()
         if k != "reference_predictions"}
    xt = torch.from_dlpack(x)
    layers = weights.spec.layers

    def forward():
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = xt
        for layer in layers:
            if isinstance(layer, Conv):
                a = F.conv2d(a, t[f"{layer.name}.weight"], t.get(f"{layer.name}.bias"),
                             stride=layer.stride, padding=layer.pad, groups=layer.groups)
            elif isinstance(layer, ReLU):
                a = F.relu(a)
            elif isinstance(layer, Tanh):
                a = torch.tanh(a)
            elif isinstance(layer, LRN):
                a = F.local_response_norm(a, layer.size, layer.alpha, layer.beta, layer.k)
            elif isinstance(layer, MaxPool):
                a = F.max_pool2d(a, layer.size, layer.step)
            elif isinstance(layer, Flatten):
                a = a.flatten(1)
            elif isinstance(layer, Dense):
                a = F.linear(a, t[f"{layer.name}.weight"], t[f"{layer.name}.bias"])
            elif isinstance(layer, Softmax):
                a = F.softmax(a, dim=1)
        return a

    return forward


def _device(array):
    import cupy

    return cupy.asarray(array)
