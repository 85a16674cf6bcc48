"""Which variant runs each conv and FC layer of a network at one batch size, and with which
epilogue, decided once before anything compiles: one support check per layer.

`convlab run` refuses a network with it (every layer the variant cannot compute, named at
once), the Network builds its steps from it, compare takes its SKIP rows and the fused
epilogues from it, and the sanitizer and a kernel file's lone launches walk its layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedLayers
from ..kernels import ADD_RELU, RELU, TANH_POOL, Support, Variant, kernel_variants
from ..models import AddKept, Conv, Dense, MaxPool, ModelSpec, ReLU, Tanh
from ..shapes import ConvShape


def fusable(layers: tuple, i: int) -> bool:
    """conv, tanh, 2x2/2 max-pool: the ECE408 block the `fused` variant computes in one kernel."""
    rest = layers[i + 1:i + 3]
    return (len(rest) == 2 and isinstance(rest[0], Tanh) and isinstance(rest[1], MaxPool)
            and rest[1].size == 2 and rest[1].step == 2 and not rest[1].pad)


def conv_epilogue(variant: Variant, layers: tuple, i: int, shape: ConvShape,
                  fuse_adds: bool = True) -> tuple[str | None, int]:
    """The epilogue the network hands this conv layer's variant, and how many layers it absorbs
    (a residual add and its ReLU only with `fuse_adds`)."""
    nxt, after = (tuple(layers[i + 1:i + 3]) + (None, None))[:2]
    if isinstance(nxt, ReLU) and variant.supports_epilogue(shape, RELU):
        return RELU, 1
    if (fuse_adds and variant.fuses_adds and isinstance(nxt, AddKept) and isinstance(after, ReLU)
            and variant.supports_epilogue(shape, ADD_RELU)):
        return ADD_RELU, 2
    if variant.fuses_in_network and fusable(layers, i) and variant.supports_epilogue(shape, TANH_POOL):
        return TANH_POOL, 2
    return None, 0


def dense_shape(layer: Dense, batch: int) -> ConvShape:
    """An FC layer as a conv variant runs it: a 1x1 convolution over a batch of 1x1 images."""
    return ConvShape(batch, layer.in_features, 1, 1, layer.out_features, 1, bias=True)


@dataclass(frozen=True)
class LayerDecision:
    """One conv or FC layer: the asked variant's verdict on it, who runs it and how."""

    name: str
    index: int  # its place in the model's layers
    shape: ConvShape
    support: Support  # the asked variant's verdict (its reason where it refuses)
    variant: Variant | None  # the asked variant, the fallback, or None: refused, or for an
    # FC layer, run by the lab's own FC kernels
    epilogue: str | None = None  # what the running variant fuses: RELU, TANH_POOL, ADD_RELU
    absorbed: int = 0  # the layers after it that the epilogue takes in

    @property
    def lone_epilogue(self) -> str | None:
        """The epilogue the layer runs with alone (a kernel file's lone launches, the
        sanitizer): the network's, but for a residual add, which needs the block's kept
        activation: that conv runs plain."""
        return None if self.epilogue == ADD_RELU else self.epilogue


REFUSALS_SHOWN = 3


@dataclass(frozen=True)
class NetworkPlan:
    """A model at one batch size with one variant (and the fallback, where it takes layers the
    variant refuses): the decision for each conv layer, and for each FC layer the variant could
    run."""

    spec: ModelSpec
    batch: int
    variant: Variant
    fallback: Variant | None
    convs: dict[str, LayerDecision]
    dense: dict[str, LayerDecision]  # FC layers a variant that runs them (runs_dense) takes

    @property
    def refused(self) -> list[LayerDecision]:
        return [d for d in self.convs.values() if d.variant is None]

    @property
    def fallback_layers(self) -> list[str]:
        return [d.name for d in self.convs.values()
                if d.variant is not None and d.variant is not self.variant]

    def variant_for(self, layer: Conv | Dense) -> Variant | None:
        """Who runs the layer: a conv's decided variant; for an FC layer the conv variant where
        it takes it, else None (the lab's FC kernels)."""
        table = self.convs if isinstance(layer, Conv) else self.dense
        decision = table.get(layer.name)
        return None if decision is None else decision.variant

    def check(self) -> "NetworkPlan":
        """The plan, or an UnsupportedLayers naming every layer nobody runs (the first
        REFUSALS_SHOWN with why), with the variant that could stand in for it there
        (stand_in)."""
        if self.refused:
            # The first few in full; a deep network's dozens would bury the line's end.
            shown, rest = self.refused[:REFUSALS_SHOWN], self.refused[REFUSALS_SHOWN:]
            detail = "; ".join(f"{d.name} ({d.shape.brief()}): {d.support.reason}"
                               for d in shown)
            if rest:
                detail += f"; and {len(rest)} more: {', '.join(d.name for d in rest)}"
            # --fallback takes one variant: the stand-in must run every layer the asked one
            # refuses, those a given fallback took included
            found = stand_in(self.variant,
                             [d.shape for d in self.convs.values() if not d.support])
            raise UnsupportedLayers(f"kernel '{self.variant.name}' does not support {detail}",
                                    found and found.name)
        return self


def stand_in(variant: Variant, shapes: list[ConvShape]) -> Variant | None:
    """A registered variant of `variant`'s precision class, on the same device, that supports
    every shape, or None: the nearest to it in the registry's ladder order, those before it
    first (a form's refusals are the newer form's: wgmma-split-bf16's short reductions go to
    wgmma-3xtf32), the newest first for a variant outside the registry (a kernel file)."""
    ladder = kernel_variants()
    names = [v.name for v in ladder]
    if variant.name in names:
        at = names.index(variant.name)
        order = ladder[:at][::-1] + ladder[at + 1:]
    else:
        order = ladder[::-1]
    return next((v for v in order if v.precision == variant.precision
                 and v.on_gpu == variant.on_gpu and all(v.supports(s) for s in shapes)), None)


def plan_network(spec: ModelSpec, variant: Variant, batch: int,
                 fallback: Variant | None = None, fuse_adds: bool = True) -> NetworkPlan:
    """Decide every conv layer (the variant where it supports the layer, else the fallback,
    else refused) and every FC layer the variant runs as a 1x1 convolution, in the model's
    inference form (batch norm folded: the plan's spec). `fuse_adds`: a residual block's add
    and ReLU go into its last conv where the variant has that epilogue."""
    spec = spec.inference()
    shapes = spec.conv_shapes(batch)
    convs, dense = {}, {}
    for i, layer in enumerate(spec.layers):
        if isinstance(layer, Conv):
            table, shape, instead = convs, shapes[layer.name], fallback
        elif isinstance(layer, Dense) and variant.runs_dense:
            table, shape, instead = dense, dense_shape(layer, batch), None
        else:
            continue
        support = variant.supports(shape)
        runner = variant if support else instead
        epilogue, absorbed = (None, 0) if runner is None else conv_epilogue(
            runner, spec.layers, i, shape, fuse_adds)
        table[layer.name] = LayerDecision(layer.name, i, shape, support, runner, epilogue,
                                          absorbed)
    if all(d.support for d in convs.values()):
        fallback = None  # the plan names a fallback only where it runs a layer
    return NetworkPlan(spec, batch, variant, fallback, convs, dense)
