"""ConvShape: one invocation of a convolution layer, and the arithmetic derived from it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import ConvlabError

FLOAT_BYTES = 4


@dataclass(frozen=True)
class ConvShape:
    """x[B][C][H][W] (*) k[M][C][K][K] -> y[B][M][Ho][Wo], a cross-correlation as in the course."""

    B: int
    C: int
    H: int
    W: int
    M: int
    K: int
    stride: int = 1
    pad: int = 0

    def __post_init__(self):
        for name in ("B", "C", "H", "W", "M", "K", "stride"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConvlabError(f"ConvShape.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.pad, int) or self.pad < 0:
            raise ConvlabError(f"ConvShape.pad must be a non-negative integer, got {self.pad!r}")
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
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.B, self.C, self.H, self.W)

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.M, self.C, self.K, self.K)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.B, self.M, self.Ho, self.Wo)

    @property
    def flops(self) -> int:
        return 2 * self.B * self.M * self.Ho * self.Wo * self.C * self.K * self.K

    @property
    def min_bytes(self) -> int:
        """Each input, weight and output element crosses device memory exactly once."""
        inputs = self.B * self.C * self.H * self.W
        weights = self.M * self.C * self.K * self.K
        outputs = self.B * self.M * self.Ho * self.Wo
        return FLOAT_BYTES * (inputs + weights + outputs)

    @property
    def is_plain(self) -> bool:
        """Stride 1 and no padding: the only form the course's kernels handle."""
        return self.stride == 1 and self.pad == 0

    def with_batch(self, B: int) -> "ConvShape":
        return replace(self, B=B)

    def describe(self) -> str:
        extra = ""
        if not self.is_plain:
            extra = f", stride {self.stride}, pad {self.pad}"
        return (
            f"{self.B}x{self.C}x{self.H}x{self.W} -> {self.M}x{self.Ho}x{self.Wo}, "
            f"{self.K}x{self.K}{extra}"
        )

    def brief(self) -> str:
        """The layer without the batch: 'CxHxW -> MxHoxWo KxK'."""
        extra = "" if self.is_plain else f" s{self.stride} p{self.pad}"
        return (f"{self.C}x{self.H}x{self.W}->{self.M}x{self.Ho}x{self.Wo} "
                f"{self.K}x{self.K}{extra}")

    def as_dict(self) -> dict:
        return {
            "B": self.B, "C": self.C, "H": self.H, "W": self.W, "M": self.M, "K": self.K,
            "stride": self.stride, "pad": self.pad,
        }
