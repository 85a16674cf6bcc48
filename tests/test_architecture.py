"""The package's shape: every module imports on a machine without a GPU, and no chain of imports
(module level or inside functions) leads from a module back to itself."""

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import convlab

PACKAGE = Path(convlab.__file__).parent


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The convlab modules `name` imports, wherever in the file the import stands."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[:len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if not target.startswith("convlab"):
            continue
        named = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
        out.update(named or [target])
    out.discard(name)
    return out


@pytest.mark.parametrize("name", [m.name for m in pkgutil.walk_packages(convlab.__path__, "convlab.")])
def test_every_module_imports_without_a_gpu(no_gpu, name):
    importlib.import_module(name)


def test_no_import_leads_back_to_where_it_started():
    known = modules()
    graph = {name: imports(name, path, known) & set(known) for name, path in known.items()}
    # A package's __init__ importing its own modules is how a package is built, not a cycle.
    graph = {n: {t for t in targets if not n.startswith(t + ".")} for n, targets in graph.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            assert cycle is None, " -> ".join(cycle)


# The layers of the package, bottom first: a module imports only from its own part or below.
LAYERS = [
    ("errors",),
    ("shapes", "tables", "plot"),
    ("models", "gpu"),
    ("tuning", "oracle"),
    ("kernels", "ops"),
    ("net",),
    ("userkernel",),
    ("bench",),
    ("profile",),
    ("report", "stream_report"),
    ("cli",),
]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def part_of(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_every_part_of_the_package_has_a_layer():
    parts = {part_of(name) for name in modules()} - {""}
    assert parts == set(RANK)


def test_imports_point_down_the_layers():
    known = modules()
    upward = []
    for name, path in known.items():
        for target in imports(name, path, known):
            if target == "convlab":  # the package itself: its version, nothing else
                continue
            if part_of(name) != part_of(target) and RANK[part_of(target)] >= RANK[part_of(name)]:
                upward.append(f"{name} -> {target}")
    assert not upward, "imports that do not point down the layers:\n" + "\n".join(upward)


def test_the_package_root_stays_small():
    root = [p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "cli")]
    assert len(root) <= 8, sorted(root)


def test_no_convlab_import_hides_in_a_function():
    """Imports inside functions are for optional dependencies (CuPy, torch, matplotlib, cupti,
    Pillow, nvtx) only; convlab's own modules are imported at the top, where the layers show."""
    hidden = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (
                        inner.level or (inner.module or "").split(".")[0] == "convlab"):
                    hidden.append(f"{name}:{inner.lineno}")
    assert not hidden, hidden


def test_every_kind_of_step_op_keeps_the_one_contract():
    """kernels.Op (conv variants), ops.LayerOp (the other layers on the GPU) and net's HostOp
    (NumPy) are what a network step launches; the network reads nothing else of them."""
    import numpy as np

    from convlab.kernels import get_variant
    from convlab.net.network import HostOp, StepOp
    from convlab.ops import LayerOp
    from convlab.shapes import ConvShape

    shape = ConvShape(2, 1, 8, 8, 3, 3)
    conv = get_variant("cpu").prepare(shape, np.ones((3, 1, 3, 3), np.float32))
    layer = LayerOp("relu", "activation", "relu_forward", lambda x, y: None, (2, 3))
    host = HostOp("relu", lambda x: x, (2, 3))
    for op in (conv, layer, host):
        assert isinstance(op, StepOp), type(op)
    assert conv.capturable and layer.capturable and not host.capturable


def test_the_tuned_cache_sits_below_the_variants():
    known = modules()
    assert "convlab.bench.tune" not in imports("convlab.tuning", known["convlab.tuning"], known)
    for name, path in known.items():
        if name.startswith("convlab.kernels"):
            assert "convlab.bench.tune" not in imports(name, path, known), name


def test_run_options_are_checked_by_the_lab_not_the_cli(no_gpu):
    """`convlab run`'s option rules live in lab.plan_run: a script gets the same errors."""
    from convlab.bench import lab
    from convlab.errors import ConvlabError

    plan = lab.plan_run("ece408", batches="10,2")
    assert plan.batches == [2, 10] and plan.variant.name == "cpu" and "no usable GPU" in plan.note
    with pytest.raises(ConvlabError, match="--kernel or --kernel-file"):
        lab.plan_run("ece408", kernel="tiled", kernel_file="mine.cu")
    with pytest.raises(ConvlabError, match="--timeout goes with"):
        lab.plan_run("ece408", kernel="tiled", timeout_s=5.0)
    with pytest.raises(ConvlabError, match="leave out --cold"):
        lab.plan_run("ece408", kernel="tiled", cold=True, sanitize="memcheck")


def test_no_variant_is_more_than_two_classes_below_variant():
    """A registered variant's class is Variant's child or grandchild: a family is one class,
    its members rows of a table (kernels.IGEMM_FORMS) rather than subclasses that set
    attributes (`wgmma-split-bf16` was five deep: Wgmma3xTF32, Wgmma, ChannelsLast,
    Pipelined)."""
    from convlab.kernels import IGEMM_FORMS, VARIANTS, Variant

    depth = {name: type(v).__mro__.index(Variant) for name, v in VARIANTS.items()}
    assert max(depth.values()) <= 2, {n: d for n, d in depth.items() if d > 2}
    assert [form.name for _, _, form in IGEMM_FORMS] == [
        name for name, v in VARIANTS.items() if getattr(v, "form", None) is not None]


def test_a_family_member_class_that_sets_what_its_form_holds_is_refused():
    """A subclass's `name = "mine"` was silently replaced by its Form's name."""
    from convlab.kernels.wgmma import Wgmma

    with pytest.raises(TypeError, match="takes them from its Form"):
        type("Mine", (Wgmma,), {"name": "mine", "summary": "mine"})
    type("Fine", (Wgmma,), {"source": "// mine"})  # anything else is the subclass's own


PREPROCESSOR_SWITCH = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif)\b", re.M)
CODE_NOISE = re.compile(r'//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')


def device_pieces() -> dict[str, str]:
    """Every piece of CUDA source the package holds, functions and bare statements alike (a
    schedule's COMPUTE is statements): its modules' upper-case string constants. Those that
    are not code (names, messages) hold no braces, or balanced ones."""
    pieces = {}
    for name in modules():
        module = importlib.import_module(name)
        for attribute, value in vars(module).items():
            if attribute.isupper() and isinstance(value, str):
                pieces[f"{name}.{attribute}"] = value
    return pieces


def test_no_device_piece_opens_a_brace_another_closes(no_gpu):
    """A piece is whole statements or declarations: a schedule's kernel template holds its
    slots (`mainloop.filled`), so what one piece opens it closes."""
    pieces = device_pieces()
    assert "convlab.kernels.igemm.wgmma.COMPUTE" in pieces and len(pieces) > 100
    unbalanced = []
    for name, source in pieces.items():
        code = CODE_NOISE.sub("", source)
        if code.count("{") != code.count("}"):
            unbalanced.append(name)
    assert not unbalanced


def test_the_mma_sync_mainloop_picks_its_maths_by_if_constexpr():
    """The mma.sync mainloop (fp16/bf16, tf32, 3xTF32; either layout) holds no preprocessor
    conditional: every branch is compiled, and checked, in every build."""
    from convlab.kernels.igemm import mainloop

    assert "if constexpr (MODE == 1)" in mainloop.COMPUTE
    assert not PREPROCESSOR_SWITCH.findall(mainloop.COMPUTE)


def test_the_wgmma_kernel_is_chosen_by_types_not_switches():
    """The assembled wgmma source (every schedule, maths and element type) holds at most 20
    preprocessor conditionals; the rest is templates and `if constexpr`. Its one __global__
    function runs the tiling's schedule, a template: no conditional picks a schedule (HALO,
    PERSISTENT, PINGPONG, or VECTOR_STORE, which reads HALO) or the persistent kernel's gather
    outside that function's signature."""
    from convlab.kernels.igemm import mainloop
    from convlab.kernels.wgmma import SOURCE

    assert len(PREPROCESSOR_SWITCH.findall(SOURCE)) <= 20
    assert SOURCE.count("__global__") == 1 and SOURCE.count(mainloop.ENTRY) == 1
    conditions = re.findall(r"^\s*#\s*(?:if|ifdef|ifndef|elif)\b(.*)$",
                            SOURCE.replace(mainloop.ENTRY, ""), re.M)
    assert conditions
    assert not [c for c in conditions
                if re.search(r"\b(HALO|PERSISTENT|PINGPONG|GATHER_TMA|VECTOR_STORE)\b", c)]


def test_the_implicit_gemm_kernels_take_their_tiles_from_a_tile_walk():
    """Which tile a block computes is the schedule's walk's (igemm.tile_walks): no other piece of
    the implicit-GEMM families' sources reads blockIdx or gridDim, so the gather, the split-K
    meeting and the epilogue serve every schedule alike. The one exception is the grid
    schedule's pipelines, which reckon their K range from the block's index (their comment says
    why)."""
    from convlab.kernels import channels_last, pipelined, wgmma
    from convlab.kernels.igemm import mainloop, tile_walks
    from convlab.kernels.igemm import wgmma as wgmma_pieces

    for source in (pipelined.SOURCE, channels_last.SOURCE, wgmma.SOURCE):
        assert tile_walks.SOURCE in source
        for allowed in (tile_walks.SOURCE, mainloop.PIPELINE, wgmma_pieces.PIPELINE):
            source = source.replace(allowed, "")
        assert not re.findall(r"\b(blockIdx|gridDim)\b", CODE_NOISE.sub("", source))
    for pipeline in (mainloop.PIPELINE, wgmma_pieces.PIPELINE):
        assert re.findall(r"\bblockIdx\b", CODE_NOISE.sub("", pipeline)) == ["blockIdx"]


def test_one_cost_model_ranks_every_implicit_gemm_family():
    """The tiling cost model is igemm.cost's alone: a family (mma.sync, wgmma) gives its
    candidates and schedules, and no other module of the package models a tiling's time or
    orders tilings itself; every tunable variant ranks through it."""
    import inspect
    from unittest import mock

    from convlab.kernels import VARIANTS
    from convlab.kernels.igemm import cost, mma_sync, wgmma
    from convlab.shapes import ConvShape

    for name in modules():
        if not name.startswith("convlab.kernels") or name == "convlab.kernels.igemm.cost":
            continue
        module = importlib.import_module(name)
        own = [attribute for attribute, value in vars(module).items()
               if attribute in ("estimate", "ranked", "candidates") and callable(value)
               and inspect.isfunction(inspect.unwrap(value))
               and inspect.unwrap(value).__module__ == name]
        assert not own, (name, own)
    families = [*mma_sync.FAMILIES.values(), wgmma.FAMILY]
    assert all(isinstance(f, cost.Family) for f in families)
    schedules = [*wgmma.SCHEDULES.values(), *(f.schedule for f in mma_sync.FAMILIES.values())]
    assert all(isinstance(s, cost.Schedule) for s in schedules)
    tunable = [v for v in VARIANTS.values() if hasattr(v, "ranked")]
    assert len(tunable) >= 13
    shape = ConvShape(8, 64, 14, 14, 64, 3, pad=1)
    with mock.patch.object(cost, "estimate", wraps=cost.estimate) as estimate:
        for variant in tunable:
            cost.ranked.cache_clear()  # variants of one maths share rankings
            before = estimate.call_count
            assert variant.ranked(shape)
            assert estimate.call_count > before, variant.name
    assert {id(call.args[3]) for call in estimate.call_args_list} == set(map(id, families))
