"""convlab: a JIT kernel lab for the forward pass of a CNN's convolution layer."""

__version__ = "0.1.0"
