"""cpu: the float32 NumPy reference, the course's "CPU implementation" baseline."""

from ..reference import conv2d
from .base import Op, Support, Variant, check_epilogue


class Cpu(Variant):
    name = "cpu"
    summary = "NumPy float32 patches x filters on the CPU (the reference, as a baseline)"
    on_gpu = False

    def supports(self, shape):
        return Support(True)

    def prepare(self, shape, weights, epilogue=None):
        check_epilogue(self, epilogue)

        def launch(x, y):
            y[...] = conv2d(x, weights, shape.stride, shape.pad)

        return Op(launch, shape.output_shape)
