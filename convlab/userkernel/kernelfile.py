"""Kernel files: a user's own convolution kernel, loaded into a Variant like the built-ins.

A kernel file is one of two things.

1. A `.cu` file holding an `extern "C" __global__` kernel and a header of comment lines that
   say how to launch it. Every header line reads `// convlab: KEY = VALUE` (`:` works in place
   of `=`, keys are case-insensitive, lines may sit anywhere in the file). The keys:

       // convlab: block = 256                          threads per block: 1 to 3 expressions
       // convlab: grid = ceil(B*M*Ho*Wo / 256)         blocks: 1 to 3 expressions
       // convlab: defines = TILE=16, K=K               -D constants, each NAME=expression
       // convlab: args = x, w, bias, y, B, C, H, W, M, K
       // convlab: shared = 4*TILE*TILE                 dynamic shared memory, bytes (default 0)
       // convlab: precision = fp32                     what it computes in (fp32, tf32, fp16, bf16)
       // convlab: features = stride, pad, groups, bias which general layers it handles (default none)
       // convlab: epilogues = relu                     it applies a ReLU when RELU is defined to 1
       // convlab: requires = K <= 7                    a layer it cannot run is skipped (repeatable)
       // convlab: kernel = conv_forward                the entry point (default conv_forward)
       // convlab: summary = one line for tables        (default: the file's first comment line)
       // convlab: launch = mine.py                     launch code in a .py file instead (below)

   Expressions are arithmetic over the layer: B, C, H, W, M, K, Ho, Wo, stride, pad, groups,
   Cg (=C/groups), Mg (=M/groups), bias and relu (1 or 0), and the defines; with + - * / // %
   **, comparisons, and/or/not and ceil, floor, min, max, abs (`/` is exact: ceil(Ho/16) is
   right). `args` lists what each kernel parameter gets: x, w (or k), bias, y (float32 device
   arrays; bias is a dummy of one float when the layer has none) or an expression, passed as
   the parameter's declared C type (int, long long, unsigned, float). Without an `args` line
   the parameters are matched by name, which covers the course's signature
   conv_forward(x, k, bias, y, B, C, H, W, M, K) that the shipped naive kernel uses.

2. A `.py` file defining a Variant like the modules in convlab/kernels (full control: several
   kernels, workspaces, epilogues): either a module attribute `VARIANT` or exactly one Variant
   subclass defined in the file, constructible without arguments (a family's subclass,
   `Pipelined` or `Wgmma`, needs its Form: `convlab new --from` writes it as VARIANT). A class
   attribute `source_path` (a Path) names the .cu file its source was read from, so compiler
   messages point into it. A .cu whose header says `launch = NAME.py` is loaded through that module.
   Such a .cu may include the library's device code (`#include <convlab/wgmma>`, expanded by
   userkernel.library.source_of) and define only what that leaves to it.

Every kernel file compiles with -lineinfo (compute-sanitizer and profilers then name source
lines). A loaded file carries its text and a content hash for result records.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib.util
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConvlabError
from ..gpu.hardware import H100
from ..gpu.jit import build_options
from ..kernels import VARIANTS
from ..kernels.base import (RELU, SUPPORTED, Op, Support, Variant, check_inputs, device_weights,
                            missing_features)
from ..kernels.general import device_bias
from ..oracle.verify import UNIT_ROUNDOFF
from ..shapes import FEATURES, SQUARE_FEATURES, ConvShape
from . import expressions

DEFAULT_KERNEL = "conv_forward"
LINEINFO = "-lineinfo"
SHAPE_NAMES = ("B", "C", "H", "W", "M", "K", "Kh", "Kw", "Ho", "Wo", "stride", "pad", "pad_h",
               "pad_w", "dilation", "groups", "Cg", "Mg", "bias", "relu")
ARRAYS = {"x": "x", "w": "w", "k": "w", "weights": "w", "bias": "bias", "y": "y"}
# Parameter names matched without an args line: the arrays, and the layer's sizes.
PARAMETER_NAMES = {**ARRAYS, "input": "x", "output": "y", "out": "y", "filter": "w"}
KEYS = ("block", "grid", "defines", "args", "shared", "precision", "features", "epilogues",
        "requires", "kernel", "summary", "launch")
WITH_LAUNCH = ("launch", "summary")  # the keys a header that hands launching to a .py may have
ALIASES = {"define": "defines", "arg": "args", "arguments": "args", "feature": "features",
           "epilogue": "epilogues", "require": "requires", "smem": "shared",
           "dynamic_shared": "shared", "threads": "block", "blocks": "grid", "entry": "kernel"}
REPEATABLE = {"requires"}
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIMS = (1024, 1024, 64)
MAX_GRID_DIMS = (2**31 - 1, 65535, 65535)
MAX_SHARED_PER_BLOCK = H100.limits.shared_per_block_optin  # sm_90's opt-in limit
DEFAULT_SHARED_LIMIT = H100.limits.shared_per_block_default  # above it a kernel must opt in
SCALAR_TYPES = (("long long", np.int64), ("int64_t", np.int64), ("size_t", np.uint64),
                ("unsigned", np.uint32), ("double", np.float64), ("float", np.float32),
                ("int", np.int32))
INT_RANGES = {np.int32: (-2**31, 2**31 - 1), np.int64: (-2**63, 2**63 - 1),
              np.uint32: (0, 2**32 - 1), np.uint64: (0, 2**64 - 1)}
# How NVRTC's log names the program CuPy compiled: a temporary <hash>.cubin.cu (kern.cu in
# older CuPy), or default_program when CuPy caches in memory. A kernel file is one program.
CUPY_PROGRAM_LINE = re.compile(r"(?m)^[^\n(]*?(?:\.cu|default_program)\((\d+)\)")
HEADER_LINE = re.compile(r"^\s*//\s*convlab\s*:(?P<rest>.*)$", re.IGNORECASE)
ENTRY = re.compile(r"^\s*(?P<key>[A-Za-z_][\w-]*)\s*[=:]\s*(?P<value>.*?)\s*$")


class KernelFileError(ConvlabError):
    """A kernel file that cannot be loaded: the message starts with file:line."""


def _located(path: Path, line: int | None, message: str) -> KernelFileError:
    where = f"{path}:{line}" if line else f"{path}"
    return KernelFileError(f"{where}: {message}")


# --- the header --------------------------------------------------------------------------

@dataclass
class Entry:
    key: str
    value: str
    line: int


@dataclass
class Parameter:
    name: str
    ctype: str
    pointer: bool

    def scalar_type(self):
        for word, dtype in SCALAR_TYPES:
            if re.search(rf"\b{word}\b", self.ctype):
                return dtype
        return None


@dataclass
class Argument:
    """What one kernel parameter gets: an array (x, w, bias, y) or an expression's value."""

    text: str
    line: int
    array: str | None = None
    tree: ast.Expression | None = None
    dtype: type | None = None


@dataclass
class Header:
    path: Path
    entries: dict[str, list[Entry]] = field(default_factory=dict)

    def get(self, key: str) -> Entry | None:
        found = self.entries.get(key)
        return found[0] if found else None


def split_top_level(text: str) -> list[str]:
    """Split at commas outside parentheses; empty pieces (a trailing comma) are dropped."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def parse_header(path: Path, text: str) -> Header:
    header = Header(path)
    for number, line in enumerate(text.splitlines(), start=1):
        match = HEADER_LINE.match(line)
        if not match:
            continue
        entry = ENTRY.match(match.group("rest"))
        if not entry:
            raise _located(path, number, "a convlab header line reads `// convlab: KEY = VALUE`, "
                                         f"got '{line.strip()}'")
        key = entry.group("key").lower().replace("-", "_")
        key = ALIASES.get(key, key)
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (keys: {', '.join(KEYS)})"
            raise _located(path, number, f"unknown header key '{entry.group('key')}'{hint}")
        if key in header.entries and key not in REPEATABLE:
            first = header.entries[key][0].line
            raise _located(path, number, f"'{key}' is given twice (first on line {first})")
        value = entry.group("value")
        if not value:
            raise _located(path, number, f"'{key}' has no value")
        header.entries.setdefault(key, []).append(Entry(key, value, number))
    return header


def find_parameters(path: Path, source: str, kernel: str, line: int | None) -> list[Parameter]:
    """The parameter list of `extern "C" __global__ ... kernel(...)` in the source."""
    match = re.search(r"__global__[^;{}]*?\b" + re.escape(kernel) + r"\s*\(([^)]*)\)", source)
    if not match:
        raise _located(path, line, f"no __global__ function named '{kernel}' in the file"
                                   + ("" if line else " (name it with `// convlab: kernel = NAME`)"))
    params = []
    for raw in split_top_level(match.group(1)):
        words = re.findall(r"[A-Za-z_]\w*", raw)
        if raw.strip() == "void" or not words:
            continue
        params.append(Parameter(words[-1], raw[:raw.rfind(words[-1])].strip(), "*" in raw))
    return params


@dataclass
class Launch:
    """The launch of one layer, evaluated from the header."""

    grid: tuple[int, ...]
    block: tuple[int, ...]
    shared: int
    defines: dict[str, int | float]

    @property
    def threads(self) -> int:
        return int(np.prod(self.block))


class KernelFileVariant(Variant):
    """A .cu kernel file launched as its header says."""

    def __init__(self, path: Path, text: str):
        self.path = path
        self.source_path = path
        self.name = path.stem
        self.source = text
        if not text.strip():
            raise _located(path, None, "the file is empty: `convlab new NAME` writes a kernel "
                                       "file to start from")
        self.header = header = parse_header(path, text)
        if not header.entries:
            raise _located(path, None, "no `// convlab: KEY = VALUE` header lines, so this is "
                                       "not a kernel file: `convlab new NAME` writes one to "
                                       "start from")
        self.kernel = self._word("kernel") or DEFAULT_KERNEL
        self.kernels = (self.kernel,)
        summary = header.get("summary")
        self.summary = summary.value if summary else opening_comment(text) or f"kernel file {path.name}"
        self.precision = self._precision()
        self.general = self._features()
        self.epilogues = self._epilogues()
        self.define_trees = self._defines()
        known = set(SHAPE_NAMES) | set(self.define_trees)
        for key in ("block", "grid"):
            if header.get(key) is None:
                raise _located(path, None, f"the header states no {key}: add "
                                           f"`// convlab: {key} = ...` (e.g. {_EXAMPLES[key]})")
        self.block = self._dims("block", known)
        self.grid = self._dims("grid", known)
        shared = header.get("shared")
        self.shared = (self._expression(shared, known), shared.line) if shared else None
        self.requires = [(self._expression(e, known), e) for e in header.entries.get("requires", [])]
        kernel_line = header.get("kernel").line if header.get("kernel") else None
        self.parameters = find_parameters(path, text, self.kernel, kernel_line)
        self.arguments = self._arguments(known)

    # --- reading the header ---------------------------------------------------------------
    def _word(self, key: str) -> str | None:
        entry = self.header.get(key)
        if entry is None:
            return None
        if not re.fullmatch(r"[A-Za-z_]\w*", entry.value):
            raise _located(self.path, entry.line, f"'{key}' must be a C identifier, got "
                                                  f"'{entry.value}'")
        return entry.value

    def _precision(self) -> str:
        entry = self.header.get("precision")
        if entry is None:
            return "fp32"
        value = entry.value.lower()
        if value not in UNIT_ROUNDOFF:
            raise _located(self.path, entry.line, f"precision '{entry.value}' is none of "
                                                  f"{', '.join(UNIT_ROUNDOFF)}")
        return value

    def _list(self, key: str, allowed: tuple[str, ...],
              every: frozenset[str] | None = None) -> frozenset[str]:
        """The header's list under `key`, each of `allowed`; "all" is `every` (default: all
        of `allowed`)."""
        entry = self.header.get(key)
        if entry is None:
            return frozenset()
        words = [w.lower() for w in split_top_level(entry.value)]
        if words in (["none"], []):
            return frozenset()
        if words == ["all"]:
            return frozenset(allowed) if every is None else every
        unknown = [w for w in words if w not in allowed]
        if unknown:
            raise _located(self.path, entry.line, f"{key}: '{unknown[0]}' is none of "
                                                  f"{', '.join(allowed)}")
        return frozenset(words)

    def _features(self) -> frozenset[str]:
        # "all" keeps meaning what it meant before filters could be rectangular or dilated: a
        # kernel that indexes its taps with K alone must not be handed a 1x7 layer
        return self._list("features", FEATURES, SQUARE_FEATURES)

    def _epilogues(self) -> tuple[str, ...]:
        return tuple(self._list("epilogues", (RELU,)))

    def _expression(self, entry: Entry, known: set[str], text: str | None = None):
        text = entry.value if text is None else text
        try:
            tree = expressions.parse(text)
        except expressions.ExpressionError as exc:
            raise _located(self.path, entry.line, f"{entry.key}: {exc}") from None
        unknown = sorted(expressions.names(tree) - known)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise _located(self.path, entry.line, f"{entry.key}: unknown name '{unknown[0]}'"
                                                  f"{hint}; known: {', '.join(sorted(known))}")
        return tree

    def _defines(self) -> dict[str, ast.Expression]:
        entry = self.header.get("defines")
        trees: dict[str, ast.Expression] = {}
        if entry is None:
            return trees
        for item in split_top_level(entry.value):
            name, eq, value = item.partition("=")
            name = name.strip()
            if not eq or not re.fullmatch(r"[A-Za-z_]\w*", name) or not value.strip():
                raise _located(self.path, entry.line, f"defines: '{item}' should read NAME=expression")
            trees[name] = self._expression(entry, set(SHAPE_NAMES) | set(trees), value)
        return trees

    def _dims(self, key: str, known: set[str]) -> list[ast.Expression]:
        entry = self.header.get(key)
        parts = split_top_level(entry.value)
        if not 1 <= len(parts) <= 3:
            raise _located(self.path, entry.line, f"{key} takes 1 to 3 expressions (x, y, z), "
                                                  f"got {len(parts)}")
        return [self._expression(entry, known, p) for p in parts]

    def _arguments(self, known: set[str]) -> list[Argument]:
        entry = self.header.get("args")
        params = self.parameters
        if entry is None:
            texts, line = [], None
            for p in params:
                name = PARAMETER_NAMES.get(p.name) if p.pointer else p.name
                if name is None or (not p.pointer and p.name not in known):
                    raise _located(self.path, None, f"cannot tell what to pass for parameter "
                                   f"'{p.name}' of {self.kernel}: add `// convlab: args = ...` "
                                   "(without it, parameters are matched by name: x, k/w, bias, y "
                                   f"and {', '.join(SHAPE_NAMES)})")
                texts.append(name)
        else:
            texts, line = split_top_level(entry.value), entry.line
        if len(texts) != len(params):
            listed = ", ".join(p.name for p in params)
            raise _located(self.path, line, f"{self.kernel} takes {len(params)} parameters "
                                            f"({listed}) but args lists {len(texts)}")
        arguments = []
        for text, param in zip(texts, params):
            array = ARRAYS.get(text)
            if param.pointer:
                if array is None:
                    raise _located(self.path, line, f"parameter '{param.name}' is a pointer: pass "
                                                    f"one of x, w, bias, y, not '{text}'")
                arguments.append(Argument(text, line or 0, array=array))
                continue
            if array is not None:
                raise _located(self.path, line, f"parameter '{param.name}' is a {param.ctype}, "
                                                f"not a pointer: '{text}' is an array")
            dtype = param.scalar_type()
            if dtype is None:
                raise _located(self.path, line, f"parameter '{param.name}' has type "
                                                f"'{param.ctype}'; scalars may be int, unsigned, "
                                                "long long, size_t, float or double")
            probe = Entry("args", text, line or 0)
            arguments.append(Argument(text, line or 0, tree=self._expression(probe, known), dtype=dtype))
        return arguments

    # --- per layer ------------------------------------------------------------------------
    def environment(self, shape: ConvShape, epilogue: str | None = None) -> dict[str, int]:
        env = {"B": shape.B, "C": shape.C, "H": shape.H, "W": shape.W, "M": shape.M, "K": shape.K,
               "Kh": shape.Kh, "Kw": shape.Kw, "Ho": shape.Ho, "Wo": shape.Wo,
               "stride": shape.stride, "pad": shape.pad, "pad_h": shape.pad_h,
               "pad_w": shape.pad_w, "dilation": shape.dilation, "groups": shape.groups,
               "Cg": shape.Cg, "Mg": shape.Mg, "bias": int(shape.bias),
               "relu": int(epilogue == RELU)}
        for name, tree in self.define_trees.items():
            env[name] = self._evaluate(tree, env, self.header.get("defines"), f"define {name}")
        return env

    def _evaluate(self, tree, env, entry: Entry, what: str, whole: bool = True):
        try:
            if whole:
                return expressions.evaluate_int(tree, env, what)
            return expressions.as_plain(expressions.evaluate(tree, env))
        except expressions.ExpressionError as exc:
            raise _located(self.path, entry.line, f"{entry.key}: {exc}") from None

    def defines(self, shape, epilogue=None):
        env = self.environment(shape, epilogue)
        return {name: expressions.as_plain(env[name]) for name in self.define_trees}

    def compile_options(self, shape, epilogue=None):
        return build_options(self.defines(shape, epilogue)) + (LINEINFO,)

    def launch(self, shape: ConvShape, epilogue: str | None = None) -> Launch:
        env = self.environment(shape, epilogue)
        grid = tuple(self._evaluate(t, env, self.header.get("grid"), "the grid") for t in self.grid)
        block = tuple(self._evaluate(t, env, self.header.get("block"), "the block") for t in self.block)
        shared = 0
        if self.shared is not None:
            shared = self._evaluate(self.shared[0], env, self.header.get("shared"), "shared")
        return Launch(grid, block, shared, self.defines(shape, epilogue))

    def launch_resources(self, shape, epilogue=None) -> tuple[int, int]:
        """Threads per block and dynamic shared memory bytes (what `convlab check` needs)."""
        launch = self.launch(shape, epilogue)
        return launch.threads, launch.shared

    def supports(self, shape):
        base = missing_features(shape, self.general)
        if not base:
            return base
        for tree, entry in self.requires:
            env = self.environment(shape)
            if not self._evaluate(tree, env, entry, "requires", whole=False):
                return Support(False, f"requires {entry.value} ({self.path.name}:{entry.line})")
        launch = self.launch(shape)
        return launch_limits(launch)

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)
        support = self.supports(shape)
        if not support:
            raise ConvlabError(f"kernel file {self.path.name} cannot run {shape.describe()}: "
                               f"{support.reason}")
        launch = self.launch(shape, epilogue)
        env = self.environment(shape, epilogue)
        compiled = self.compile(shape, epilogue)
        kernel = compiled.module.get_function(self.kernel)
        if launch.shared > DEFAULT_SHARED_LIMIT:
            kernel.max_dynamic_shared_size_bytes = launch.shared
        arrays = {"w": device_weights(weights), "bias": device_bias(bias)}
        template = [arg.array if arg.array in ("x", "y") else arrays[arg.array] if arg.array
                    else self._scalar(arg, env) for arg in self.arguments]
        slots = [(i, a) for i, a in enumerate(template) if isinstance(a, str)]
        grid, block, shared = launch.grid, launch.block, launch.shared

        def run(x, y):
            values = list(template)
            for i, which in slots:
                values[i] = x if which == "x" else y
            kernel(grid, block, tuple(values), shared_mem=shared)

        return Op(run, self.output_shape(shape, epilogue), compiled.seconds, epilogue)

    def _scalar(self, arg: Argument, env):
        entry = Entry("args", arg.text, arg.line)
        integer = np.issubdtype(arg.dtype, np.integer)
        value = self._evaluate(arg.tree, env, entry, f"argument '{arg.text}'", whole=integer)
        if integer:
            low, high = INT_RANGES[arg.dtype]
            if not low <= value <= high:
                raise _located(self.path, arg.line, f"argument '{arg.text}' is {value}, outside "
                                                    f"the range of its C type "
                                                    f"({np.dtype(arg.dtype).name})")
        return arg.dtype(value)


_EXAMPLES = {"block": "256", "grid": "ceil(B*M*Ho*Wo / 256)"}


def launch_limits(launch: Launch) -> Support:
    """Whether a launch of this geometry can run on sm_90 (CUDA C Programming Guide, table 24)."""
    if any(d < 1 for d in launch.grid + launch.block):
        return Support(False, f"grid {launch.grid} and block {launch.block} must be positive")
    if launch.threads > MAX_THREADS_PER_BLOCK:
        return Support(False, f"a block of {launch.threads} threads exceeds "
                              f"{MAX_THREADS_PER_BLOCK}")
    for axis, (d, limit) in enumerate(zip(launch.block, MAX_BLOCK_DIMS)):
        if d > limit:
            return Support(False, f"block dimension {'xyz'[axis]} = {d} exceeds {limit}")
    for axis, (d, limit) in enumerate(zip(launch.grid, MAX_GRID_DIMS)):
        if d > limit:
            return Support(False, f"grid dimension {'xyz'[axis]} = {d} exceeds {limit}")
    if launch.shared > MAX_SHARED_PER_BLOCK:
        return Support(False, f"{launch.shared} bytes of dynamic shared memory exceed "
                              f"{MAX_SHARED_PER_BLOCK} per block")
    return SUPPORTED


def opening_comment(text: str) -> str:
    """The first line of the file's opening comment that is not a convlab header line."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or HEADER_LINE.match(line):
            continue
        if stripped.startswith("//"):
            words = stripped.lstrip("/").strip()
            if words:
                return words
            continue
        return ""
    return ""


# --- loading files ---------------------------------------------------------------------------

@dataclass
class KernelFile:
    """A loaded kernel file: its Variant, and every file that defines it (for records)."""

    path: Path
    kind: str  # "cu" or "py"
    variant: Variant
    files: dict[str, str]  # path as given -> text

    @property
    def sha256(self) -> str:
        h = hashlib.sha256()
        for name in sorted(self.files):
            h.update(Path(name).name.encode() + b"\0" + self.files[name].encode() + b"\0")
        return h.hexdigest()

    def record(self) -> dict:
        """What a result record stores about the kernel: the files' names, hashes and texts."""
        return {"path": str(self.path), "kind": self.kind, "variant": self.variant.name,
                "sha256": self.sha256,
                "files": [{"path": name, "sha256": hashlib.sha256(text.encode()).hexdigest(),
                           "text": text} for name, text in sorted(self.files.items())]}

    def changed(self, sha256: str) -> str | None:
        """Why a result computed from a file of hash `sha256` (a child process loads the file
        again) is not this file's, or None when it is."""
        if sha256 == self.sha256:
            return None
        return (f"{self.path} changed while convlab ran it (sha256 {self.sha256[:12]} when it was "
                f"read, {sha256[:12]} in the run): the result would not belong to the recorded "
                "text; run it again")

    def source_location(self) -> tuple[str, int]:
        """(file, line offset) that lines of the compiled source map to: compiler messages and
        sanitizer reports name `file:line + offset`."""
        return source_location(self.variant, self.files)

    def locate(self, log: str) -> str:
        """A message of CuPy's compiler with its lines named in the user's file."""
        display, offset = self.source_location()
        return CUPY_PROGRAM_LINE.sub(lambda m: f"{display}:{int(m.group(1)) + offset}", log)


def source_location(variant: Variant, files: dict[str, str]) -> tuple[str, int]:
    path = getattr(variant, "source_path", None)
    if path is not None:
        return str(path), 0
    for name, text in files.items():
        at = text.find(variant.source.strip("\n")) if variant.source else -1
        if at >= 0:
            leading = len(variant.source) - len(variant.source.lstrip("\n"))
            return name, text.count("\n", 0, at) - leading
    return f"<source of {variant.name}>", 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise KernelFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KernelFileError(f"{path}: cannot read it ({exc})") from None


def load_kernel_file(path: str | Path) -> KernelFile:
    """Load a .cu or .py kernel file; errors are KernelFileErrors that name file and line."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".cu", ".py"):
        raise KernelFileError(f"{path}: a kernel file is a .cu file (with a convlab header) or a "
                              ".py file defining a Variant")
    text = _read(path)
    if suffix == ".py":
        kernel = _load_python(path, text)
        kernel.files.update(_source_file(kernel.variant))
    else:
        header = parse_header(path, text)
        launch = header.get("launch")
        if launch is not None:
            extra = [k for k in header.entries if k not in WITH_LAUNCH]
            if extra:
                first = header.get(extra[0])
                raise _located(path, first.line, f"the header hands launching to {launch.value} "
                                                 f"(line {launch.line}), so '{extra[0]}' has no "
                                                 f"effect here: set it in {launch.value}")
            module_path = path.parent / launch.value
            if module_path.suffix != ".py":
                raise _located(path, launch.line, f"launch names '{launch.value}', not a .py file")
            if not module_path.exists():
                raise _located(path, launch.line, f"launch code {module_path} does not exist")
            kernel = _load_python(module_path, _read(module_path))
            kernel.files[str(path)] = text
            kernel = KernelFile(path, "cu", kernel.variant, kernel.files)
        else:
            kernel = KernelFile(path, "cu", KernelFileVariant(path, text), {str(path): text})
    name = kernel.variant.name
    if name in VARIANTS:
        raise KernelFileError(f"{path}: the kernel is named '{name}' like a built-in variant; "
                              "rename the file (or the Variant's name)")
    return kernel


def _source_file(variant: Variant) -> dict[str, str]:
    path = getattr(variant, "source_path", None)
    return {str(path): _read(Path(path))} if path is not None else {}


def _load_python(path: Path, text: str) -> KernelFile:
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    module_name = f"convlab_kernel_file_{stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ConvlabError:
        raise
    except Exception as exc:  # noqa: BLE001 - any error in user code becomes a located message
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if Path(f.filename).resolve() == path.resolve()]
        line = frames[-1].lineno if frames else getattr(exc, "lineno", None)
        raise _located(path, line, f"{type(exc).__name__}: {exc}") from None
    variant = getattr(module, "VARIANT", None)
    if variant is None:
        classes = [obj for obj in vars(module).values()
                   if isinstance(obj, type) and issubclass(obj, Variant)
                   and obj.__module__ == module_name]
        if len(classes) != 1:
            found = ", ".join(c.__name__ for c in classes) or "none"
            raise KernelFileError(f"{path}: define exactly one Variant subclass (found: {found}) "
                                  "or a module attribute VARIANT")
        try:
            variant = classes[0]()
        except Exception as exc:  # noqa: BLE001 - user code
            raise KernelFileError(f"{path}: {classes[0].__name__}() failed: "
                                  f"{type(exc).__name__}: {exc}") from None
    if not isinstance(variant, Variant):
        raise KernelFileError(f"{path}: VARIANT is a {type(variant).__name__}, not a Variant")
    if not variant.name:
        raise KernelFileError(f"{path}: the Variant has no name")
    _with_lineinfo(variant)
    return KernelFile(path, "py", variant, {str(path): text})


def _with_lineinfo(variant: Variant) -> None:
    """Make the variant compile with -lineinfo, like every kernel file (an instance attribute
    in front of its class's compile_options)."""
    options = variant.compile_options

    def compile_options(shape, epilogue=None):
        chosen = tuple(options(shape, epilogue))
        return chosen if LINEINFO in chosen else chosen + (LINEINFO,)

    variant.compile_options = compile_options
