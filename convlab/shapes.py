"""ConvShape: one invocation of a convolution layer, and the arithmetic derived from it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import ConvlabError

FLOAT_BYTES = 4

# The ways a layer can differ from the course's plain stride-1, unpadded, single-group,
# bias-free convolution with a square filter. A variant declares which of them it implements
# (Variant.general): "rectangular" is a KhxKw filter or padding that differs along H and W
# (Inception's 1x7 with padding 0x3), "dilation" a filter whose taps lie d pixels apart.
FEATURES = ("stride", "pad", "groups", "bias", "rectangular", "dilation")
# What the kernels written for square, undilated filters implement at most.
SQUARE_FEATURES = frozenset(("stride", "pad", "groups", "bias"))


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


def dense_in(wanted: str, shape: tuple[int, ...], layout: str) -> bool:
    """Whether a dense array of logical (B, C, H, W) `shape` in memory format `layout` is dense
    in `wanted` too, as is_channels_last and flags.c_contiguous find it, without the array:
    where C or H*W is 1 the two orders are one."""
    _, c, h, w = shape
    return wanted == layout or c == 1 or h * w == 1


def memory_view(a, layout: str):
    """The array in its memory order, C-contiguous: a itself for NCHW, (B, H, W, C) for NHWC."""
    return a.transpose(0, 2, 3, 1) if layout == NHWC else a


@dataclass(frozen=True)
class ConvShape:
    """x[B][C][H][W] (*) k[M][C/G][Kh][Kw] (+ bias[M]) -> y[B][M][Ho][Wo], a cross-correlation.

    With G groups, output channel m reads only the C/G input channels of its group
    (m // (M/G)); G = 1 is the course's convolution. `K` and `pad` are the filter's height and
    the padding above and below; the width `Kw` and the padding left and right `pad_w` equal
    them unless given (as PyTorch's kernel_size=(Kh, Kw), padding=(ph, pw)). With `dilation`
    d the taps of a filter row or column lie d pixels apart (PyTorch's dilation=d).
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
    Kw: int | None = None
    pad_w: int | None = None
    dilation: int = 1

    def __post_init__(self):
        # Left out, the width and the side padding are the square filter's: normalised here,
        # so that a 3x3 layer is one value however it was written.
        if self.Kw is None:
            object.__setattr__(self, "Kw", self.K)
        if self.pad_w is None:
            object.__setattr__(self, "pad_w", self.pad)
        for name in ("B", "C", "H", "W", "M", "K", "Kw", "stride", "groups", "dilation"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConvlabError(f"ConvShape.{name} must be a positive integer, got {value!r}")
        for name in ("pad", "pad_w"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConvlabError(f"ConvShape.{name} must be a non-negative integer, "
                                   f"got {value!r}")
        if not isinstance(self.bias, bool):
            raise ConvlabError(f"ConvShape.bias must be True or False, got {self.bias!r}")
        if self.C % self.groups or self.M % self.groups:
            raise ConvlabError(f"{self.groups} groups must divide both C={self.C} and M={self.M}")
        if self.Ho < 1 or self.Wo < 1:
            dilated = f" dilated {self.dilation}x" if self.dilation > 1 else ""
            raise ConvlabError(
                f"a {self.Kh}x{self.Kw}{dilated} kernel does not fit a {self.H}x{self.W} input "
                f"with padding {self.padding_text()}"
            )

    @property
    def Kh(self) -> int:
        return self.K

    @property
    def pad_h(self) -> int:
        return self.pad

    @property
    def span_h(self) -> int:
        """Input rows one window covers: dilation*(Kh-1) + 1."""
        return self.dilation * (self.Kh - 1) + 1

    @property
    def span_w(self) -> int:
        return self.dilation * (self.Kw - 1) + 1

    @property
    def taps(self) -> int:
        """Filter taps: Kh*Kw."""
        return self.Kh * self.Kw

    @property
    def Ho(self) -> int:
        return (self.H + 2 * self.pad_h - self.span_h) // self.stride + 1

    @property
    def Wo(self) -> int:
        return (self.W + 2 * self.pad_w - self.span_w) // self.stride + 1

    @property
    def is_square(self) -> bool:
        """A KxK filter, padded alike on every side, undilated: what most kernels handle."""
        return self.Kh == self.Kw and self.pad_h == self.pad_w and self.dilation == 1

    def kernel_text(self) -> str:
        """'3x3', '1x7'."""
        return f"{self.Kh}x{self.Kw}"

    def padding_text(self) -> str:
        """'1', or '0x3' where the rows and columns are padded differently."""
        return str(self.pad_h) if self.pad_h == self.pad_w else f"{self.pad_h}x{self.pad_w}"

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
        """Terms summed into one output: Cg*Kh*Kw products, plus the bias."""
        return self.Cg * self.taps + int(self.bias)

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.B, self.C, self.H, self.W)

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.M, self.Cg, self.Kh, self.Kw)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.B, self.M, self.Ho, self.Wo)

    @property
    def flops(self) -> int:
        """Two per multiply-add of the convolution (the bias adds are not counted)."""
        return 2 * self.B * self.M * self.Ho * self.Wo * self.Cg * self.taps

    @property
    def min_bytes(self) -> int:
        """Each input element some window reads, and each weight, bias and output element,
        crosses device memory exactly once (a strided 1x1 reads a quarter of its input)."""
        inputs = self.B * self.C * self._read(self.H, self.Ho, self.pad_h, self.Kh) \
            * self._read(self.W, self.Wo, self.pad_w, self.Kw)
        weights = self.M * self.Cg * self.taps + (self.M if self.bias else 0)
        outputs = self.B * self.M * self.Ho * self.Wo
        return FLOAT_BYTES * (inputs + weights + outputs)

    def _read(self, size: int, out: int, pad: int, taps: int) -> int:
        """Input rows (or columns) of `size` that some window reads."""
        return len({o * self.stride + t * self.dilation - pad for o in range(out)
                    for t in range(taps)} & set(range(size)))

    def features(self) -> frozenset[str]:
        """Which of FEATURES this layer uses."""
        used = {"stride": self.stride != 1, "pad": self.pad_h != 0 or self.pad_w != 0,
                "groups": self.groups != 1, "bias": self.bias,
                "rectangular": self.Kh != self.Kw or self.pad_h != self.pad_w,
                "dilation": self.dilation != 1}
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
        if self.pad_h or self.pad_w:
            extras.append(f"p{self.padding_text()}")
        if self.dilation != 1:
            extras.append(f"d{self.dilation}")
        if self.groups != 1:
            extras.append(f"g{self.groups}")
        if self.bias:
            extras.append("+b")
        return extras

    def describe(self) -> str:
        words = {"s": "stride", "p": "pad", "d": "dilation", "g": "groups"}
        extra = ", ".join("bias" if e == "+b" else f"{words[e[0]]} {e[1:]}" for e in self._extras())
        return (f"{self.B}x{self.C}x{self.H}x{self.W} -> {self.M}x{self.Ho}x{self.Wo}, "
                f"{self.kernel_text()}{', ' + extra if extra else ''}")

    def brief(self) -> str:
        """The layer without the batch: 'CxHxW->MxHoxWo KhxKw' plus s/p/d/g/+b where they
        apply."""
        extra = "".join(" " + e for e in self._extras())
        return f"{self.C}x{self.H}x{self.W}->{self.M}x{self.Ho}x{self.Wo} {self.kernel_text()}{extra}"

    def as_dict(self) -> dict:
        """The fields by name; Kw, pad_w and dilation only where the filter is not square and
        undilated, so that a square layer's records and cache entries read as they always
        have."""
        d = {
            "B": self.B, "C": self.C, "H": self.H, "W": self.W, "M": self.M, "K": self.K,
            "stride": self.stride, "pad": self.pad, "groups": self.groups, "bias": self.bias,
        }
        if not self.is_square:
            d.update(Kw=self.Kw, pad_w=self.pad_w, dilation=self.dilation)
        return d


LAYER_FIELDS = ("B", "C", "H", "W", "M", "K", "stride", "pad", "groups", "dilation")
LAYER_SYNTAX = "B,C,H,W,M,K[,stride,pad,groups,dilation]"
# Where a field may be a pair, KhxKw or ph x pw (1x7, 0x3).
PAIRED = {"K": "Kw", "pad": "pad_w"}


def _layer_value(spec: str, index: int, name: str, text: str) -> dict[str, int]:
    """One field of --layer: an integer, or for K and pad a pair 'AxB'."""
    pieces = text.lower().split("x") if name in PAIRED else [text]
    try:
        numbers = [int(piece) for piece in pieces]
    except ValueError:
        numbers = []
    if len(numbers) not in (1, 2) or len(numbers) != len(pieces):
        form = "an integer or a pair such as 1x7" if name in PAIRED else "an integer"
        raise ConvlabError(f"--layer '{spec}': {name} (number {index + 1} of {LAYER_SYNTAX}) "
                           f"must be {form}, got '{text}'")
    least = 0 if name == "pad" else 1
    for number in numbers:
        if number < least:
            raise ConvlabError(f"--layer '{spec}': {name} (number {index + 1} of "
                               f"{LAYER_SYNTAX}) must be {least} or more, got {number}")
    value = {name: numbers[0]}
    if len(numbers) == 2:
        value[PAIRED[name]] = numbers[1]
    return value


def parse_layer(spec: str, bias: bool = False) -> ConvShape:
    """'B,C,H,W,M,K[,stride,pad,groups,dilation]' (six to ten fields; left out: stride 1, pad
    0, one group, no dilation; K and pad may be pairs, Kh x Kw and rows x columns: 1x7, 0x3)
    -> ConvShape, with a bias if `bias`; ConvlabError for anything else, naming --layer."""
    parts = [p.strip() for p in spec.split(",")]
    if not 6 <= len(parts) <= len(LAYER_FIELDS):
        raise ConvlabError(f"--layer takes six to ten fields {LAYER_SYNTAX} (e.g. "
                           f"10000,1,28,28,50,5 or 128,96,27,27,256,5,1,2,2 or "
                           f"32,768,17,17,192,1x7,1,0x3); got '{spec}'")
    values: dict[str, int] = {}
    for i, (name, text) in enumerate(zip(LAYER_FIELDS, parts)):
        values.update(_layer_value(spec, i, name, text))
    try:
        return ConvShape(**values, bias=bias)
    except ConvlabError as exc:
        raise ConvlabError(f"--layer '{spec}': {exc}") from None
