"""A model's forward pass with its conv layers computed by a chosen variant.

Conv layers call the variant's prepared Op; tanh, max-pool, fully connected layers and softmax
are the array library's own operations (CuPy on the GPU, NumPy for the cpu variant), written
once against either. Where the variant fuses the ECE408 block (conv, tanh, 2x2 max-pool) and the
model has it, the three layers become one Op.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kernels import TANH_POOL, Op, Variant
from .models import Conv, Dense, Flatten, MaxPool, Softmax, Tanh, Weights
from .shapes import ConvShape


@dataclass
class ConvStep:
    layer: Conv
    shape: ConvShape
    op: Op
    weights: np.ndarray
    bias: np.ndarray | None
    epilogue: str | None
    input: object = None  # the activation this layer read in the last forward pass
    output: object = None  # its output buffer

    @property
    def label(self) -> str:
        return f"{self.layer.name} + tanh + pool (fused)" if self.epilogue else self.layer.name


def fusable(layers: tuple, i: int) -> bool:
    rest = layers[i + 1:i + 3]
    return (len(rest) == 2 and isinstance(rest[0], Tanh) and isinstance(rest[1], MaxPool)
            and rest[1].size == 2)


class Network:
    """Plan once (compile every conv layer's variant), then run forward passes."""

    def __init__(self, weights: Weights, variant: Variant, batch: int):
        self.weights = weights
        self.variant = variant
        self.batch = batch
        if variant.on_gpu:
            import cupy as xp
        else:
            xp = np
        self.xp = xp
        self.plan: list = []  # ConvStep, or the layer itself for the array-library layers
        self.params = {name: xp.asarray(a) for name, a in weights.arrays.items()
                       if name != "reference_predictions"}
        shapes = weights.spec.conv_shapes(batch)
        layers = weights.spec.layers
        skip = 0
        for i, layer in enumerate(layers):
            if skip:
                skip -= 1
                continue
            if not isinstance(layer, Conv):
                self.plan.append(layer)
                continue
            shape = shapes[layer.name]
            epilogue = None
            if (variant.fuses_in_network and fusable(layers, i)
                    and variant.supports_epilogue(shape, TANH_POOL)):
                epilogue, skip = TANH_POOL, 2
            w = weights.arrays[f"{layer.name}.weight"]
            b = weights.arrays.get(f"{layer.name}.bias") if layer.bias else None
            op = variant.prepare(shape, w, epilogue, b)
            step = ConvStep(layer, shape, op, w, b, epilogue)
            step.output = xp.empty(op.output_shape, dtype=xp.float32)
            self.plan.append(step)

    @property
    def conv_steps(self) -> list[ConvStep]:
        return [s for s in self.plan if isinstance(s, ConvStep)]

    @property
    def compile_seconds(self) -> float:
        return sum(s.op.compile_seconds for s in self.conv_steps)

    def forward(self, x):
        """Class probabilities for a device (or host, for cpu) batch x of shape (B, 1, S, S)."""
        xp = self.xp
        a = x
        for step in self.plan:
            if isinstance(step, ConvStep):
                step.input = a
                step.op(a, step.output)
                a = step.op.output(step.output)
            elif isinstance(step, Tanh):
                a = xp.tanh(a)
            elif isinstance(step, MaxPool):
                s = step.size
                B, C, H, W = a.shape
                a = a[:, :, :H // s * s, :W // s * s].reshape(B, C, H // s, s, W // s, s).max(axis=(3, 5))
            elif isinstance(step, Flatten):
                a = a.reshape(a.shape[0], -1)
            elif isinstance(step, Dense):
                a = a @ self.params[f"{step.name}.weight"].T + self.params[f"{step.name}.bias"]
            elif isinstance(step, Softmax):
                e = xp.exp(a - a.max(axis=1, keepdims=True))
                a = e / e.sum(axis=1, keepdims=True)
            else:
                raise TypeError(f"no forward definition for layer {step!r}")
        return a

    def predict(self, images: np.ndarray) -> np.ndarray:
        """Host images in, host class predictions out: the end-to-end path."""
        x = self.xp.asarray(images)
        probs = self.forward(x)
        predictions = probs.argmax(axis=1)
        return predictions.get() if self.variant.on_gpu else predictions
