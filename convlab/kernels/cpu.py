"""cpu: the float32 NumPy reference, the course's "CPU implementation" baseline."""

from ..oracle.reference import conv2d, conv_shape_args, relu
from ..shapes import FEATURES
from .base import RELU, Op, Variant, check_inputs


class Cpu(Variant):
    name = "cpu"
    summary = "NumPy float32 patches x filters on the CPU (the reference, as a baseline)"
    on_gpu = False
    general = frozenset(FEATURES)
    epilogues = (RELU,)

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)

        def launch(x, y):
            out = conv2d(x, weights, bias=bias, **conv_shape_args(shape))
            y[...] = relu(out) if epilogue == RELU else out

        return Op(launch, shape.output_shape, epilogue=epilogue)
