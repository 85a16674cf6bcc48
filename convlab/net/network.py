"""A model's forward pass as a list of steps over fixed buffers, planned once per batch size.

Every layer becomes a step that launches one prepared kernel: conv layers the chosen variant's
Op, the others the lab's own kernels (convlab/ops). A variant that runs FC layers (`runs_dense`)
gets those too, as 1x1 convolutions. Buffers are allocated when the network is planned, never
in a forward pass, so a pass only launches kernels: it can be timed step by step and captured
into a CUDA graph whole. Where two layers fuse, they are one step: conv + ReLU, conv + tanh +
2x2 pool, or a residual block's last conv + its add + ReLU when the variant has that epilogue,
an activation into the max-pool that follows it, LRN + max-pool, FC + activation. Activations
are float32, except where the next thing done with them is a variant reading 16-bit
channels-last (fp16, or bf16 bits): then the step before writes them so and the variant reads
them as they are (what its own conversion would have given, bit for bit: only max-pools, ReLUs
and flattens may stand between, which commute with rounding). A residual block's shortcut is
the one exception: the add (or the conv that adds it) reads the block's input as the block's
first conv does, 16-bit, and a projection shortcut's conv writes 16-bit where that input was
(shortcut_as_half), where a float32 network would add them unrounded (the class's bound covers
it). Buffers share one arena: a step writes over bytes no later step reads any more, and a
residual add or an activation over its own input where nothing reads that after it. The cpu
variant runs the same plan with NumPy.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import numpy as np

from .. import ops, tuning
from ..ops.base import apply_activation
from ..gpu.elements import FLOAT32, HALF_TYPES, values
from ..kernels import ADD_RELU, RELU, TANH_POOL, Variant, takes_tunings
from ..kernels.base import StagedBuffer
from ..kernels.igemm.splitk import SplitKScratch, shared_split_k
from ..models import (LRN, AddKept, Conv, Dense, Flatten, GlobalAvgPool, Keep, MaxPool, ReLU,
                      Softmax, Swap, Tanh, Weights)
from ..oracle import reference
from ..shapes import LAYOUTS, NCHW, NHWC, ConvShape, channels_last, memory_view
from .plan import LayerDecision, NetworkPlan

ACTIVATIONS = {ReLU: "relu", Tanh: "tanh"}
CATEGORY_CONV = "conv"


@runtime_checkable
class StepOp(Protocol):
    """What a step launches, whichever of the three kinds it is: a conv variant's kernels.Op, a
    GPU layer's ops.LayerOp, or a HostOp (NumPy, for the cpu variant's network). The network
    asks nothing else of them."""

    output_shape: tuple
    compile_seconds: float
    capturable: bool  # only kernel launches on the given buffers: a CUDA graph can replay it
    layout: str  # the memory format (shapes.NCHW / NHWC) of its 4-D input and output
    output_dtype: np.dtype  # what it writes: float32, or 16-bit for a conv reading that after it

    def __call__(self, x, y) -> None: ...


@dataclass
class Step:
    """One launch (or fused group of layers) of the forward pass."""

    label: str  # "conv1", "conv1+relu1", "norm1+pool1", "fc6+relu6"
    category: str  # conv, pool, lrn, fc, softmax, activation (the profile's categories)
    kernel_label: str  # what profiles call the kernel: "register-tiled conv1", "max-pool pool1"
    op: StepOp
    layers: tuple = ()
    output: object = None  # this step's output buffer, allocated once
    input: object = None  # what it read in the last forward pass
    in_view: tuple | None = None  # reshape the input to this first (flatten before an FC)
    # The memory format its input arrives in (a flatten reads it in that order), and the one
    # the network converts it to first where the op reads another (None: no conversion).
    in_layout: str = NCHW
    convert_to: str | None = None
    arrays: dict | None = None  # the weights as its op reads them, where not the model's own
    # What the network does with its stack of kept activations before this step reads its
    # input (a residual block's Keep and Swap: "keep", "swap"), and whether the step adds the
    # top one (AddKept: popped into the op's `kept` before the launch).
    stack: tuple[str, ...] = ()
    adds_kept: bool = False
    kept: object = None  # what it added in the last forward pass
    convert_kept: str | None = None  # the layout the kept activation is converted to first
    # Computes each output element from the input's element there (and the kept one's) only:
    # it may write over its input (a residual add, an activation).
    elementwise: bool = False

    @property
    def is_conv(self) -> bool:
        return self.category == CATEGORY_CONV

    def result(self):
        """This step's output after a launch, as a logical NCHW (or 2-D) array."""
        if self.op.layout == NHWC and self.output.ndim == 4:
            return channels_last(self.output)
        return self.output

    @property
    def replayable(self) -> bool:
        """Whether a CUDA graph of the forward pass can hold this step (a layout conversion
        before it allocates)."""
        return self.op.capturable and self.convert_to is None and self.convert_kept is None


@dataclass
class ConvStep(Step):
    shape: ConvShape | None = None
    weights: np.ndarray | None = None
    bias: np.ndarray | None = None
    epilogue: str | None = None
    layer: Conv | Dense | None = None
    staged: object = None  # the input as the op reads it (Op.stage: fp16 variants convert it)
    # the variant that prepared the op, as the step needs it (writing fp16, adding a kept
    # activation): its tiling is the one that runs
    variant: Variant | None = None

    @property
    def is_conv(self) -> bool:
        """A conv layer's step, or an FC layer's that the conv variant runs (category fc)."""
        return True

    def result(self):
        return self.op.output(self.output)


@dataclass
class HostOp:
    """A layer computed with the NumPy reference in float32 (the cpu variant's network)."""

    name: str
    fn: Callable[..., np.ndarray]
    output_shape: tuple
    compile_seconds: float = 0.0
    kernel: str = "numpy"
    capturable: bool = False
    layout: str = NCHW
    output_dtype: np.dtype = FLOAT32
    kept: object = None  # a residual add's second operand, set by the network as for AddOp

    def __call__(self, x, y):
        y[...] = self.fn(x) if self.kept is None else self.fn(x, self.kept)


def flattened_columns(w: np.ndarray, flattened: tuple) -> np.ndarray:
    """An FC layer's weights (out, C*H*W) with the columns in (h, w, c) order: what a flatten
    of channels-last activations feeds it."""
    _, c, h, width = flattened
    return np.ascontiguousarray(
        w.reshape(w.shape[0], c, h, width).transpose(0, 2, 3, 1).reshape(w.shape[0], -1))


def convert(xp, a, layout: str):
    """a (logical NCHW, any strides; bf16 bits read as their values) as a dense float32 array
    in `layout`'s memory format."""
    a = values(a)
    if layout == NHWC:
        return xp.ascontiguousarray(a.transpose(0, 2, 3, 1), dtype=xp.float32).transpose(0, 3, 1, 2)
    return xp.ascontiguousarray(a, dtype=xp.float32)


def _suffix(name: str) -> str:
    match = re.search(r"(\d+)$", name)
    return match.group(1) if match else ""


def _unique(label: str, taken: set[str]) -> str:
    """`label`, or label#2, #3, ... where a step already has it (a model whose layer names do
    not tell its steps apart): per-step times and profiles are keyed by label."""
    found, k = label, 1
    while found in taken:
        k += 1
        found = f"{label}#{k}"
    taken.add(found)
    return found


def _tagger(name: str) -> Callable[[str], str]:
    """Labels for the steps after conv or FC layer `name`: "relu1" after conv1,
    "layer1.0.add3" after layer1.0.conv3 (the block's path kept, so labels stay unique)."""
    prefix = name.rpartition(".")[0]
    number = _suffix(name)
    return lambda kind: f"{prefix}.{kind}{number}" if prefix else f"{kind}{number}"


# Where arena_offsets may place a buffer: CuPy's own allocations start at multiples of 512
# bytes, which the kernels' 16-byte vector and TMA accesses rely on.
ARENA_ALIGNMENT = 512


def arena_offsets(sizes: list[int], lives: list[tuple[int, int]]) -> tuple[list[int], int]:
    """Byte offsets in one arena for buffers of `sizes` alive over the inclusive step ranges
    `lives`, and the arena's size: the largest first, each at the lowest aligned offset where
    it overlaps no placed buffer alive at the same time (the greedy-by-size planner of
    TensorFlow Lite's arena). Unlike whole buffers handed from step to step, a small buffer
    never keeps a large one's bytes from a later large one."""
    offsets = [0] * len(sizes)
    placed: list[int] = []
    for k in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
        first, last = lives[k]
        taken = sorted((offsets[p], offsets[p] + sizes[p]) for p in placed
                       if lives[p][0] <= last and first <= lives[p][1])
        offset = 0
        for lo, hi in taken:
            if offset + sizes[k] <= lo:
                break
            offset = max(offset, -(-hi // ARENA_ALIGNMENT) * ARENA_ALIGNMENT)
        offsets[k] = offset
        placed.append(k)
    total = max((o + n for o, n in zip(offsets, sizes)), default=0)
    return offsets, max(total, 1)


def filters_outweigh_activations(spec, batch: int) -> bool:
    """Whether a network's conv and FC filters outweigh two of its largest activations (about
    what its arena holds at its peak) at this batch: there a variant that can hold its filters
    once (Variant.holding_filters_once: the fp32 class on wgmma, whose packs otherwise hold a
    TF32 big part and a small one) does, trading time for the memory the second copy would be
    the bulk of. ResNet-50: 25.6 million filter weights against 0.8 million elements of its
    largest activation an image, so up to batch 15."""
    filters = sum(int(np.prod(shape)) for name, shape in spec.parameter_shapes().items()
                  if name.endswith(".weight") and len(shape) in (2, 4))
    largest = max(int(np.prod(out)) for _, _, out in spec.trace(batch))
    return filters > 2 * largest


def shortcut_as_half(block_input: tuple[str, np.dtype] | None, layout: str) -> np.dtype | None:
    """The 16-bit type a residual block's shortcut conv, writing `layout`, writes (None: it
    writes float32): the one the block's input, whose place in the kept stack its output takes,
    was kept as, where that was 16-bit channels-last (`block_input`: that one's layout and
    dtype; None: no Swap follows the conv). The add then reads both of its kept operands as a
    16-bit network holds them, as PyTorch's fp16 and bf16 forwards do, at half the bytes; the
    class's bound covers the rounding."""
    if block_input is None or layout != NHWC or block_input[0] != NHWC:
        return None
    return block_input[1] if block_input[1] in HALF_TYPES else None


# Layers that give the same bits on 16-bit-rounded input as on float32 input rounded after them
# (max and ReLU are monotonic and pick one of their inputs; a flatten is a view; Keep passes
# the activation on, and whatever adds it later reads it as it is): a 16-bit activation may
# pass them.
ROUNDING_TRANSPARENT = (MaxPool, ReLU, Flatten, Keep)


def half_next(layers: tuple, j: int, layout: str,
              variant_for: Callable[[Conv | Dense], Variant | None]) -> np.dtype | None:
    """The 16-bit type (fp16, or bf16 bits) an activation in `layout` that layers[j:] take next
    may be written as, or None (float32): where the first conv or FC layer it reaches, past
    rounding-transparent layers only, is run by a variant that reads that type channels-last
    as it is (`variant_for(layer)`: that variant; None for an FC layer our FC kernels run,
    which read float32)."""
    if layout != NHWC:
        return None
    for layer in layers[j:]:
        if isinstance(layer, (Conv, Dense)):
            variant = variant_for(layer)
            if variant is None or variant.layout != NHWC:
                return None
            dtype = np.dtype(variant.input_dtype())
            return dtype if dtype in HALF_TYPES else None
        if not isinstance(layer, ROUNDING_TRANSPARENT):
            return None
    return None


class Network:
    """Build once (compile every layer's kernel, allocate every buffer), then run forward
    passes. Who runs each conv and FC layer comes decided (net.plan); a plan with a layer
    nobody runs is refused here."""

    def __init__(self, weights: Weights, plan: NetworkPlan):
        plan.check()
        self.weights = weights.folded  # batch norm folded into the convs: plan.spec's weights
        self.plan = plan
        self.variant = plan.variant
        self.batch = plan.batch
        self.on_gpu = plan.variant.on_gpu
        if self.on_gpu:
            import cupy as xp
        else:
            xp = np
        self.xp = xp
        self.annotate: Callable[[str], contextlib.AbstractContextManager] | None = None
        self.steps: list[Step] = []
        self.fallback_layers = plan.fallback_layers
        spec = plan.spec
        self.input = xp.empty((self.batch, *spec.input_shape), dtype=xp.float32)
        self.filters_once = filters_outweigh_activations(spec, self.batch)
        # the steps launch one at a time: their split-K convs share one workspace, placed in
        # the arena with the buffers, not allocated at a launch a CUDA graph may be capturing
        self.split_k = SplitKScratch()
        with shared_split_k(self.split_k):
            self._plan(plan.spec.layers)

    # --- planning ---------------------------------------------------------------------------
    def _plan(self, layers: tuple) -> None:
        """Steps in order. The activations keep the memory format the last conv wrote (the
        images arrive NCHW; a channels-last variant's staging converts them once): pool, LRN
        and activations are prepared for it, a flatten reads it in that order and the FC after
        it gets its weight columns permuted to match. A residual block's Keep and Swap are no
        launches: the step after them does them to the network's stack of kept activations
        before reading its input (Step.stack)."""
        trace = self.plan.spec.trace(self.batch)
        tag = _tagger("")
        view = flattened = None
        layout = NCHW
        dtype = FLOAT32
        kept: list[tuple[str, np.dtype]] = []  # the kept activations' layouts and dtypes
        stack: list[str] = []
        labels: set[str] = set()
        i = 0
        while i < len(layers):
            layer, in_shape, _ = trace[i]
            if isinstance(layer, Flatten):
                view, flattened = (self.batch, int(np.prod(in_shape[1:]))), in_shape
                i += 1
                continue
            if isinstance(layer, Keep):
                kept.append((layout, dtype))
                stack.append("keep")
                i += 1
                continue
            if isinstance(layer, Swap):
                (layout, dtype), kept[-1] = kept[-1], (layout, dtype)
                stack.append("swap")
                i += 1
                continue
            if isinstance(layer, (Conv, Dense)):
                tag = _tagger(layer.name)
            dense = isinstance(layer, Dense) and self.plan.variant_for(layer) is not None
            if isinstance(layer, Conv):
                decision = self.plan.convs[layer.name]
                adds = kept.pop() if decision.epilogue == ADD_RELU else None
                after = decision.index + 1 + decision.absorbed
                swapped = after < len(layers) and isinstance(layers[after], Swap)
                step, used = self._conv_step(layers, decision, adds,
                                             kept[-1] if swapped else None)
                # A conv that stages its input converts any format itself.
                if step.op.stage_input is None and step.op.layout != layout:
                    step.convert_to = step.op.layout
            elif dense:
                step, used = self._dense_step(layers, self.plan.dense[layer.name], layout,
                                              flattened)
            elif isinstance(layer, AddKept):
                step, used = self._add_step(layers, i, in_shape, tag, layout, dtype, kept.pop())
            else:
                step, used = self._layer_step(layers, i, in_shape, tag, layout, flattened,
                                              dtype)
            # An FC layer the conv variant runs reads its input as a batch of 1x1 images of
            # in_features channels, and what follows reads its output as (batch, out_features).
            step.in_view = (self.batch, layer.in_features, 1, 1) if dense else view
            step.in_layout = layout
            step.stack, stack = tuple(stack), []
            view = (self.batch, layer.out_features) if dense else None
            flattened = None
            step.label = _unique(step.label, labels)
            self.steps.append(step)
            layout = step.op.layout if step.op.layout in LAYOUTS else NCHW
            dtype = step.op.output_dtype
            i += used
        self._allocate()

    def _last_reads(self) -> list[int]:
        """For each step, the last step that reads its output (as its input, or as the kept
        activation a residual add adds); the result is read after the pass."""
        return self._reads()[0]

    def _reads(self) -> tuple[list[int], list[int | None]]:
        """_last_reads, and for each step whose output it reads as its input (None: the
        network's input)."""
        last = list(range(len(self.steps)))
        source: list[int | None] = []
        current: int | None = None  # whose output the activation is (None: the network input)
        kept: list[int | None] = []
        for j, step in enumerate(self.steps):
            for action in step.stack:
                if action == "keep":
                    kept.append(current)
                else:
                    current, kept[-1] = kept[-1], current
            source.append(current)
            for read in (current, kept.pop() if step.adds_kept else None):
                if read is not None:
                    last[read] = max(last[read], j)
            current = j
        last[-1] = len(self.steps)
        return last, source

    def _writes_over_input(self, j: int, last: list[int], source: list[int | None],
                           sizes: list[int]) -> bool:
        """Whether step j may write its output over its input: it is elementwise, reads the
        output of an earlier step as it is (no view, no conversion) and is the last to read it,
        and writes as many bytes of the same element type."""
        step, k = self.steps[j], source[j]
        return (step.elementwise and k is not None and last[k] == j and sizes[k] == sizes[j]
                and step.in_view is None and step.convert_to is None
                and np.dtype(self.steps[k].op.output_dtype) == np.dtype(step.op.output_dtype))

    def _staged_buffers(self, source: list[int | None]) -> dict[int, StagedBuffer]:
        """The conv steps whose op converts its input before reading it (Op.stage), each with
        the buffer it converts into: the input as the step receives it, from the network's
        input (float32 NCHW) or the step whose output it is."""
        found = {}
        for j, step in enumerate(self.steps):
            if not step.is_conv or step.op.stage_input is None:
                continue
            k = source[j]
            dtype = self.input.dtype if k is None else np.dtype(self.steps[k].op.output_dtype)
            shape = step.in_view or (step.shape.B, step.shape.C, step.shape.H, step.shape.W)
            buffer = step.op.staging_buffer(dtype, shape, step.in_layout)
            if buffer is not None:
                found[j] = buffer
        return found

    def _allocate(self) -> None:
        """Every step's output buffer as a view of one arena, placed by arena_offsets: a step's
        bytes are reused by a later one once nothing reads them any more, so a forward holds
        about the largest set of activations alive at once, not all of them. An elementwise
        step that is the last to read its input writes over it (_writes_over_input): a
        residual add then holds two activations, not three. A conv's converted input (its
        op's staging buffer) lives in the arena for that step alone, and the split-K
        workspace from the first step that splits to the last. Each step's input therefore
        holds what it read only until a later step, or the step itself, overwrites it:
        forward(until=step) computes it again."""
        last, source = self._reads()
        sizes = [int(np.prod(s.op.output_shape)) * np.dtype(s.op.output_dtype).itemsize
                 for s in self.steps]
        owner = list(range(len(sizes)))  # the step whose buffer each step writes into
        for j in range(len(sizes)):
            if self._writes_over_input(j, last, source, sizes):
                owner[j] = owner[source[j]]
        buffers = sorted(set(owner))
        lives = [(b, max(last[j] for j in range(len(sizes)) if owner[j] == b)) for b in buffers]
        extents = [sizes[b] for b in buffers]
        staged = self._staged_buffers(source)
        for j, buffer in staged.items():
            extents.append(buffer.nbytes)
            lives.append((j, j))
        splitting = [j for j, step in enumerate(self.steps)
                     if step.is_conv and step.op.shares_split_k]
        if splitting:
            extents.append(self.split_k.floats * np.dtype(np.float32).itemsize)
            lives.append((splitting[0], splitting[-1]))
        offsets, total = arena_offsets(extents, lives)
        arena = self.xp.empty(total, dtype=np.uint8)
        at = dict(zip(buffers, offsets))
        for j, step in enumerate(self.steps):
            offset, dtype = at[owner[j]], np.dtype(step.op.output_dtype)
            step.output = arena[offset:offset + sizes[j]].view(dtype).reshape(
                step.op.output_shape)
        for (j, buffer), offset in zip(staged.items(), offsets[len(buffers):]):
            self.steps[j].op.stage_into(buffer.view(arena[offset:offset + buffer.nbytes]))
        if splitting:
            offset = offsets[-1]
            self.split_k.place(arena[offset:offset + extents[-1]].view(np.float32))

    def _add_step(self, layers, i, in_shape, tag, layout, dtype, kept) -> tuple[Step, int]:
        """A residual add, with the ReLU after it where there is one: on the GPU one kernel
        reading the activation as the step before wrote it and the kept one as it was kept."""
        kept_layout, kept_dtype = kept
        nxt = layers[i + 1] if i + 1 < len(layers) else None
        group = (layers[i], nxt) if type(nxt) in ACTIVATIONS else (layers[i],)
        activation = ACTIVATIONS[type(nxt)] if len(group) == 2 else None
        label = tag("add") + (f"+{activation}" if activation else "")
        if not self.on_gpu:
            def fn(x, other, activation=activation):
                return apply_activation(x + other, activation)

            op = HostOp(" + ".join(g.describe() for g in group), fn, tuple(in_shape))
            return Step(label=label, category="add", kernel_label=f"numpy {label}", op=op,
                        layers=group, adds_kept=True, elementwise=True), len(group)
        # Kept in another memory format (the shortcut's conv ran with a variant of the other
        # layout, a fallback): converted to this one, as float32, before the add, on every pass.
        convert_kept = layout if kept_layout != layout and len(in_shape) == 4 else None
        half = self._half_next(layers, i + len(group), layout)
        op = ops.prepare_add(in_shape, activation, layout, dtype,
                             FLOAT32 if convert_kept else kept_dtype, half or FLOAT32)
        return Step(label=label, category="add", kernel_label=f"{op.name} {label}", op=op,
                    layers=group, adds_kept=True, convert_kept=convert_kept,
                    elementwise=True), len(group)

    def _half_next(self, layers: tuple, j: int, layout: str) -> np.dtype | None:
        return half_next(layers, j, layout, self.plan.variant_for)

    def _conv_step(self, layers, decision: LayerDecision,
                   kept: tuple[str, np.dtype] | None = None,
                   shortcut: tuple[str, np.dtype] | None = None) -> tuple[ConvStep, int]:
        """`kept`: the layout and dtype of the kept activation an add-relu epilogue adds;
        `shortcut`: those of the block input whose place this conv's output takes (a Swap
        follows it), which it is then written as where it can be."""
        layer = layers[decision.index]
        w = self.weights.arrays[f"{layer.name}.weight"]
        b = self.weights.arrays.get(f"{layer.name}.bias") if layer.bias else None
        return self._gemm_step(layers, decision, w, b, CATEGORY_CONV, kept, shortcut)

    def _dense_step(self, layers, decision: LayerDecision, layout,
                    flattened) -> tuple[ConvStep, int]:
        """An FC layer as the conv variant's 1x1 convolution over a batch of 1x1 images, its
        weight columns permuted where a flatten of channels-last activations feeds it."""
        layer = layers[decision.index]
        w = self.weights.arrays[f"{layer.name}.weight"]
        if flattened is not None and layout == NHWC:
            w = flattened_columns(w, flattened)
        w = w.reshape(layer.out_features, layer.in_features, 1, 1)
        b = self.weights.arrays[f"{layer.name}.bias"]
        return self._gemm_step(layers, decision, w, b, "fc")

    def _gemm_step(self, layers, decision: LayerDecision, w, b, category,
                   kept: tuple[str, np.dtype] | None = None,
                   shortcut: tuple[str, np.dtype] | None = None) -> tuple[ConvStep, int]:
        i, shape, variant = decision.index, decision.shape, decision.variant
        if self.filters_once:
            variant = variant.holding_filters_once()
        layer, epilogue, absorbed = layers[i], decision.epilogue, decision.absorbed
        half = (self._half_next(layers, i + 1 + absorbed, variant.layout)
                or shortcut_as_half(shortcut, variant.layout))
        if half is not None and half in variant.output_dtypes:
            variant = variant.writing(half)
        convert_kept = None
        if epilogue == ADD_RELU:
            # Kept in the other memory format (a fallback of that layout ran the shortcut's
            # conv): converted to this one, as float32, before the launch, on every pass.
            kept_layout, kept_dtype = kept
            convert_kept = variant.layout if kept_layout != variant.layout else None
            variant = variant.adding(FLOAT32 if convert_kept else kept_dtype)
        if takes_tunings(epilogue):
            tuning.first_use(variant, shape, epilogue)
        op = variant.prepare(shape, w, epilogue, b)
        label = layer.name
        if epilogue == RELU:
            label += f"+relu{_suffix(layer.name)}"
        elif epilogue == TANH_POOL:
            label += "+tanh+pool"
        elif epilogue == ADD_RELU:
            label += f"+add{_suffix(layer.name)}+relu"
        return ConvStep(label=label, category=category, kernel_label=f"{variant.name} {label}",
                        op=op, layers=tuple(layers[i:i + 1 + absorbed]), shape=shape, weights=w,
                        bias=b, epilogue=epilogue, layer=layer, adds_kept=epilogue == ADD_RELU,
                        convert_kept=convert_kept, variant=variant), 1 + absorbed

    def _layer_step(self, layers, i, in_shape, tag, layout=NCHW, flattened=None,
                    dtype=FLOAT32) -> tuple[Step, int]:
        layer = layers[i]
        nxt = layers[i + 1] if i + 1 < len(layers) else None
        if self.on_gpu:
            def make(category, label, group, shape):
                half = self._half_next(layers, i + len(group), layout)
                return self._device_op(category, label, group, shape, layout, flattened, dtype,
                                       half or FLOAT32)
        else:
            make = self._host_op
        if type(layer) in ACTIVATIONS and isinstance(nxt, MaxPool):
            kind = ACTIVATIONS[type(layer)]
            label = f"{tag(kind)}+{tag('pool')}"
            return make("pool", label, (layer, nxt), in_shape), 2
        if isinstance(layer, LRN) and isinstance(nxt, MaxPool) and not nxt.pad:
            return make("lrn", f"{tag('norm')}+{tag('pool')}", (layer, nxt), in_shape), 2
        if isinstance(layer, Dense) and type(nxt) in ACTIVATIONS:
            kind = ACTIVATIONS[type(nxt)]
            return make("fc", f"{layer.name}+{tag(kind)}", (layer, nxt), in_shape), 2
        if isinstance(layer, Dense):
            return make("fc", layer.name, (layer,), in_shape), 1
        category, label = {
            ReLU: ("activation", tag("relu")), Tanh: ("activation", tag("tanh")),
            MaxPool: ("pool", tag("pool")), LRN: ("lrn", tag("norm")),
            GlobalAvgPool: ("pool", "avgpool"), Softmax: ("softmax", "prob"),
        }[type(layer)]
        step = make(category, label, (layer,), in_shape)
        step.elementwise = category == "activation"
        return step, 1

    def _device_op(self, category: str, label: str, group: tuple, in_shape: tuple,
                   layout: str = NCHW, flattened: tuple | None = None, in_dtype=FLOAT32,
                   out_dtype=FLOAT32) -> Step:
        """`layout`: the activations' memory format; `flattened`: the 4-D shape a flatten just
        before this step read in that format; `in_dtype`, `out_dtype`: the element types of
        its input and output (16-bit ones only for pools and activations, a 16-bit output
        only for those and LRN)."""
        first, last = group[0], group[-1]
        activation = next((ACTIVATIONS[type(g)] for g in group if type(g) in ACTIVATIONS), None)
        arrays = None
        if isinstance(first, Dense):
            w = self.weights.arrays[f"{first.name}.weight"]
            b = self.weights.arrays[f"{first.name}.bias"]
            if flattened is not None and layout == NHWC:
                w = flattened_columns(w, flattened)
                arrays = {**self.weights.arrays, f"{first.name}.weight": w}
            op = ops.prepare_dense(self.batch, w, b, activation)
        elif isinstance(first, LRN) and isinstance(last, MaxPool):
            op = ops.prepare_lrn_max_pool(in_shape, first.size, first.alpha, first.beta, first.k,
                                          last.size, last.step, layout, out_dtype)
        elif isinstance(first, LRN):
            op = ops.prepare_lrn(in_shape, first.size, first.alpha, first.beta, first.k, layout,
                                 out_dtype)
        elif isinstance(last, MaxPool):
            op = ops.prepare_max_pool(in_shape, last.size, last.step, activation, layout,
                                      in_dtype, out_dtype, last.pad)
        elif isinstance(first, GlobalAvgPool):
            op = ops.prepare_global_avg_pool(in_shape, layout, in_dtype, out_dtype)
        elif isinstance(first, Softmax):
            op = ops.prepare_softmax(in_shape[0], int(np.prod(in_shape[1:])))
        else:
            op = ops.prepare_activation(in_shape, activation, layout if len(in_shape) == 4
                                        else NCHW, in_dtype, out_dtype)
        return Step(label=label, category=category, kernel_label=f"{op.name} {label}", op=op,
                    layers=group, arrays=arrays)

    def _host_op(self, category: str, label: str, group: tuple, in_shape: tuple) -> Step:
        arrays = self.weights.arrays

        # An activation before a max-pool is applied after it, as the GPU op does: both are
        # monotonic, so the result is the same, at a quarter of the activations.
        swap = type(group[0]) in ACTIVATIONS and isinstance(group[-1], MaxPool)
        order = group[::-1] if swap else group

        def fn(x, order=order):
            for layer in order:
                x = reference.apply_layer(layer, x, arrays)
            return x

        probe = np.zeros((1, *in_shape[1:]), np.float32)
        out_shape = (in_shape[0], *fn(probe).shape[1:])
        name = " + ".join(layer.describe() for layer in group)
        return Step(label=label, category=category, kernel_label=f"numpy {label}",
                    op=HostOp(name, fn, out_shape), layers=group)

    # --- running ------------------------------------------------------------------------------
    @property
    def conv_steps(self) -> list[ConvStep]:
        return [s for s in self.steps if isinstance(s, ConvStep)]

    @property
    def compile_seconds(self) -> float:
        return sum(s.op.compile_seconds for s in self.steps)

    @property
    def capturable(self) -> bool:
        """Whether a forward pass is kernel launches on fixed buffers only (a CUDA graph can
        replay it): not for host ops, variants that return arrays of their own (cuDNN through
        PyTorch) or that convert their input on every pass (fp16 staging)."""
        if not self.on_gpu:
            return False
        return all(s.replayable for s in self.steps)

    def scope(self, label: str):
        """The annotation context for `label` (an NVTX range, a profiler's correlation id)."""
        return self.annotate(label) if self.annotate is not None else contextlib.nullcontext()

    def forward(self, x=None, on_step: Callable[[Step, str], None] | None = None,
                until: Step | None = None):
        """Class probabilities for the batch in `x` (default: the network's own input buffer).
        `on_step(step, "begin"|"end")` is called around each step's launch (the lab records CUDA
        events there). With `until`, the pass stops before that step's launch, its input (and a
        conv's staged input) in place: buffers are shared, so a step's input is only there
        until a later step writes over it."""
        a = self.input if x is None else x
        kept = []
        for step in self.steps:
            for action in step.stack:
                if action == "keep":
                    kept.append(a)
                else:
                    a, kept[-1] = kept[-1], a
            if step.adds_kept:
                other = kept.pop()
                if step.convert_kept is not None:
                    other = convert(self.xp, other, step.convert_kept)
                step.kept = step.op.kept = other
            if step.in_view is not None:
                a = memory_view(a, step.in_layout).reshape(step.in_view)
            elif step.convert_to is not None:
                a = convert(self.xp, a, step.convert_to)
            step.input = a
            if step is until:
                if step.is_conv:
                    step.staged = step.op.stage(a, reuse=True)
                return None
            with self.scope(step.label):
                if on_step:
                    on_step(step, "begin")
                if step.is_conv:
                    step.staged = step.op.stage(a, reuse=True)
                    step.op(step.staged, step.output)
                else:
                    step.op(a, step.output)
                if on_step:
                    on_step(step, "end")
            a = step.result()
            # cuDNN's rows return their own arrays, half or channels-last, from an op that
            # declares float32 NCHW: our layer kernels read what the op declares.
            if a.dtype != step.output.dtype or (step.op.layout == NCHW
                                                and not a.flags.c_contiguous):
                a = self.xp.ascontiguousarray(a, dtype=step.output.dtype)
        return a

    def predict(self, images: np.ndarray) -> np.ndarray:
        """Host images in, host class predictions out, unpipelined (lab/pipeline.py has the
        pinned, graph-replayed path)."""
        xp = self.xp
        with self.scope("input copy"):
            if self.on_gpu:
                self.input.set(np.ascontiguousarray(images, dtype=np.float32))
            else:
                self.input[...] = images
        predictions = self.forward().argmax(axis=1)
        with self.scope("output copy"):
            return xp.asnumpy(predictions) if self.on_gpu else predictions

