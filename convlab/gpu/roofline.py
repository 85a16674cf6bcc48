"""What a time means: the fewest bytes a layer moves through device memory, and its GFLOP/s and
GB/s. With the device's ceilings (gpu.ceilings) they make the roofline floor of a layer."""

from __future__ import annotations

from ..shapes import FLOAT_BYTES, ConvShape

def element_bytes(precision: str) -> int:
    """Bytes an element of a precision class's inputs and outputs takes: fp16 and bf16 rows
    read and write 16-bit tensors (cuDNN's, and ours in a single-layer run)."""
    return 2 if precision in ("fp16", "bf16") else FLOAT_BYTES


def traffic_bytes(shape: ConvShape, epilogue: str | None = None,
                  element: int = FLOAT_BYTES) -> int:
    """Fewest bytes through device memory: inputs, weights and the output written, once each,
    `element` bytes each (a fused 2x2 pool writes a quarter of the conv's output; a fused ReLU
    writes all of it; a fused residual add reads the kept activation, the output's size, too)."""
    elements = shape.min_bytes // FLOAT_BYTES
    if epilogue == "add-relu":
        elements += shape.B * shape.M * shape.Ho * shape.Wo
    if epilogue == "tanh-pool":
        elements -= shape.B * shape.M * shape.Ho * shape.Wo - shape.B * shape.M * (
            shape.Ho // 2) * (shape.Wo // 2)
    return element * elements


def gflops(shape: ConvShape, ms: float) -> float:
    return shape.flops / (ms * 1e-3) / 1e9


def gbps(shape: ConvShape, ms: float, epilogue: str | None = None,
         element: int = FLOAT_BYTES) -> float:
    return traffic_bytes(shape, epilogue, element) / (ms * 1e-3) / 1e9
