"""ConvShape: one invocation of a convolution layer, and the arithmetic derived from it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import ConvlabError

FLOAT_BYTES = 4

# The ways a layer can differ from the course's plain stride-1, unpadded, single-group,
# bias-free convolution. A variant declares which of them it implements (Variant.general).
FEATURES = ("stride", "pad", "groups", "bias")


# Memory formats of a 4-D activation. Arrays keep the logical NCHW shape (B, C, H, W) in both,
# as PyTorch's channels_last does; NHWC is a matter of strides: a pixel's channels adjacent.
NCHW, NHWC = "nchw", "nhwc"
LAYOUTS = (NCHW, NHWC)


def channels_last(buffer):
    """The logical (B, C, H, W) view of a contiguous buffer of that shape whose memory holds
    (B, H, W, C): what a channels-last kernel wrote into it."""
    b, c, h, w = buffer.shape
    return buffer.reshape(b, h, w, c).transpose(0, 3, 1, 2)


def is_channels_last(a) -> bool:
    """Whether a logical (B, C, H, W) array's memory is (B, H, W, C), densely packed."""
    return a.ndim == 4 and a.transpose(0, 2, 3, 1).flags.c_contiguous


def memory_view(a, layout: str):
    """The array in its memory order, C-contiguous: a itself for NCHW, (B, H, W, C) for NHWC."""
    return a.transpose(0, 2, 3, 1) if layout == NHWC else a


@dataclass(frozen=True)
class ConvShape:
    """x[B][C][H][W] (*) k[M][C/G][K][K] (+ bias[M]) -> y[B][M][Ho][Wo], a cross-correlation.

    With G groups, output channel m reads only the C/G input channels of its group
    (m // (M/G)); G = 1 is the course's convolution.
    """

    B: int
    C: int
    H: int
    W: int
    M: int
    K: int
    stride: int = 1
    pad: int = 0
    groups: int = 1
    bias: bool = False

    def __post_init__(self):
        for name in ("B", "C", "H", "W", "M", "K", "stride", "groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConvlabError(f"ConvShape.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.pad, int) or isinstance(self.pad, bool) or self.pad < 0:
            raise ConvlabError(f"ConvShape.pad must be a non-negative integer, got {self.pad!r}")
        if not isinstance(self.bias, bool):
            raise ConvlabError(f"ConvShape.bias must be True or False, got {self.bias!r}")
        if self.C % self.groups or self.M % self.groups:
            raise ConvlabError(f"{self.groups} groups must divide both C={self.C} and M={self.M}")
        if self.Ho < 1 or self.Wo < 1:
            raise ConvlabError(
                f"a {self.K}x{self.K} kernel does not fit a {self.H}x{self.W} input "
                f"with padding {self.pad}"
            )

    @property
    def Ho(self) -> int:
        return (self.H + 2 * self.pad - self.K) // self.stride + 1

    @property
    def Wo(self) -> int:
        return (self.W + 2 * self.pad - self.K) // self.stride + 1

    @property
    def Cg(self) -> int:
        """Input channels each output channel reads (C / groups)."""
        return self.C // self.groups

    @property
    def Mg(self) -> int:
        """Output channels per group (M / groups)."""
        return self.M // self.groups

    @property
    def reduction(self) -> int:
        """Terms summed into one output: Cg*K*K products, plus the bias."""
        return self.Cg * self.K * self.K + int(self.bias)

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.B, self.C, self.H, self.W)

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.M, self.Cg, self.K, self.K)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.B, self.M, self.Ho, self.Wo)

    @property
    def flops(self) -> int:
        """Two per multiply-add of the convolution (the bias adds are not counted)."""
        return 2 * self.B * self.M * self.Ho * self.Wo * self.Cg * self.K * self.K

    @property
    def min_bytes(self) -> int:
        """Each input, weight, bias and output element crosses device memory exactly once."""
        inputs = self.B * self.C * self.H * self.W
        weights = self.M * self.Cg * self.K * self.K + (self.M if self.bias else 0)
        outputs = self.B * self.M * self.Ho * self.Wo
        return FLOAT_BYTES * (inputs + weights + outputs)

    def features(self) -> frozenset[str]:
        """Which of FEATURES this layer uses."""
        used = {"stride": self.stride != 1, "pad": self.pad != 0, "groups": self.groups != 1,
                "bias": self.bias}
        return frozenset(name for name, on in used.items() if on)

    @property
    def is_plain(self) -> bool:
        """Stride 1, no padding, one group, no bias: the only form the course's kernels handle."""
        return not self.features()

    def with_batch(self, B: int) -> "ConvShape":
        return replace(self, B=B)

    def _extras(self) -> list[str]:
        extras = []
        if self.stride != 1:
            extras.append(f"s{self.stride}")
        if self.pad:
            extras.append(f"p{self.pad}")
        if self.groups != 1:
            extras.append(f"g{self.groups}")
        if self.bias:
            extras.append("+b")
        return extras

    def describe(self) -> str:
        words = {"s": "stride", "p": "pad", "g": "groups"}
        extra = ", ".join("bias" if e == "+b" else f"{words[e[0]]} {e[1:]}" for e in self._extras())
        return (f"{self.B}x{self.C}x{self.H}x{self.W} -> {self.M}x{self.Ho}x{self.Wo}, "
                f"{self.K}x{self.K}{', ' + extra if extra else ''}")

    def brief(self) -> str:
        """The layer without the batch: 'CxHxW->MxHoxWo KxK' plus s/p/g/+b where they apply."""
        extra = "".join(" " + e for e in self._extras())
        return f"{self.C}x{self.H}x{self.W}->{self.M}x{self.Ho}x{self.Wo} {self.K}x{self.K}{extra}"

    def as_dict(self) -> dict:
        return {
            "B": self.B, "C": self.C, "H": self.H, "W": self.W, "M": self.M, "K": self.K,
            "stride": self.stride, "pad": self.pad, "groups": self.groups, "bias": self.bias,
        }


LAYER_FIELDS = ("B", "C", "H", "W", "M", "K", "stride", "pad", "groups")
LAYER_SYNTAX = "B,C,H,W,M,K[,stride,pad,groups]"


def parse_layer(spec: str, bias: bool = False) -> ConvShape:
    """'B,C,H,W,M,K[,stride,pad,groups]' (six to nine integers; left out: stride 1, pad 0, one
    group) -> ConvShape, with a bias if `bias`; ConvlabError for anything else, naming --layer."""
    parts = [p.strip() for p in spec.split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if not 6 <= len(values) <= 9:
        raise ConvlabError(f"--layer takes six to nine integers {LAYER_SYNTAX} (e.g. "
                           f"10000,1,28,28,50,5 or 128,96,27,27,256,5,1,2,2); got '{spec}'")
    for i, (name, value) in enumerate(zip(LAYER_FIELDS, values)):
        least = 0 if name == "pad" else 1
        if value < least:
            raise ConvlabError(f"--layer '{spec}': {name} (number {i + 1} of {LAYER_SYNTAX}) must "
                               f"be {least} or more, got {value}")
    try:
        return ConvShape(**dict(zip(LAYER_FIELDS, values)), bias=bias)
    except ConvlabError as exc:
        raise ConvlabError(f"--layer '{spec}': {exc}") from None
