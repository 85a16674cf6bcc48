"""The convlab command line: click commands that call the lab and print rich tables."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax

from . import __version__, report, stream_report
from . import tuning
from .bench import (autotune, compare, lab, records, results as results_io, saved_runs, streaming,
                    suites, tune)
from .bench.guard import VERIFY_MODES
from .errors import ConvlabError, GPUUnavailable, UnsupportedLayers
from .gpu import gpu_available, hardware, peaks, timer, unavailable_reason
from .gpu.isolate import DEFAULT_TIMEOUT_S
from .kernels import VARIANTS, get_variant
from .models import DEFAULT_MODEL, MODELS, get_model, load_weights
from .net import imagenet
from .net.importer import import_weights, importable_models
from .net.train import TRAINABLE, train as train_model
from .plot import plot_comparison, require_pyplot
from .profile import tables as profile_report, trace as profile
from .shapes import parse_layer
from .userkernel import sanitize
from .userkernel.check import check_file, report_dict, report_table
from .userkernel.sanitize import (DEFAULT_BATCH as DEFAULT_SANITIZE_BATCH, SANITIZER_TIMEOUT_S,
                                  TOOLS as SANITIZER_TOOLS)
from .userkernel.scaffold import scaffold

WIDE_COLUMNS = 10_000
WIDE_HELP = "Show every column, however wide the table gets (default: what fits the terminal)."


def console(wide: bool = False) -> Console:
    """A console for this call: rich reads the terminal width (or COLUMNS) when it is made.
    With --wide, tables show every column and lines run as long as they must: nothing is cut
    at the terminal's width."""
    return Console(width=WIDE_COLUMNS) if wide else Console()


def err_console() -> Console:
    return Console(stderr=True)


def progress_bar(quiet: bool = False) -> Progress:
    """A progress bar on stderr while a terminal watches; none when stderr is a pipe or a file
    (a stopped bar would leave an empty line before what follows, an error included)."""
    err = err_console()
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=True,
                    disable=quiet or not err.is_terminal)


class StatusLine:
    """What a long step is doing now, on one line of stderr that the next line of output
    replaces: only while a terminal watches stderr (never in a pipe, a file or with --json)."""

    def __init__(self, quiet: bool = False, stream=None):
        self.stream = stream or sys.stderr
        self.on = not quiet and self.stream.isatty()
        self.shown = False

    def show(self, text: str) -> None:
        if self.on:
            self.stream.write(f"\r\x1b[K{text}...")
            self.stream.flush()
            self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


class OneLineUsageError(click.ClickException):
    """A usage mistake click found (a value out of range, a missing file, an unknown option):
    one line and exit status 1, as convlab's own checks of a value give, instead of click's
    usage block and status 2."""


# click's "no arguments: show the help" is a UsageError too, and stays as click shows it.
NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def one_line(exc: click.UsageError) -> OneLineUsageError:
    where = exc.ctx.command_path if exc.ctx is not None else "convlab"
    return OneLineUsageError(f"{exc.format_message()} (see '{where} --help')")


class ConvlabGroup(click.Group):
    """Every mistake is one line and exit status 1, whether convlab's check (ConvlabError) or
    click's (a usage error) found it: never a traceback, never a usage block."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except NO_ARGS_IS_HELP:
            raise
        except click.UsageError as exc:
            raise one_line(exc) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ConvlabError as exc:
            raise click.ClickException(str(exc)) from None
        except NO_ARGS_IS_HELP:
            raise
        except click.UsageError as exc:
            raise one_line(exc) from None


@click.group(cls=ConvlabGroup)
@click.version_option(__version__, prog_name="convlab")
def main():
    """convlab: a JIT kernel lab for the forward pass of a CNN's convolution layer."""


def renamed(value, old_value, old: str, new: str):
    """An option's value, given by its name or by the old spelling it replaced (kept, hidden,
    for a release, with a note). Options of one name mean one thing in every command: compare,
    tune and check's --layer is a shape, new's --from a variant."""
    if old_value is None:
        return value
    if value is not None:
        raise ConvlabError(f"{new} is the new spelling of {old.split()[-1]}: give one of them")
    err_console().print(f"[yellow]note: {old} is now {new}; the old spelling goes in a later "
                        f"release[/yellow]")
    return old_value


def choice_options(command):
    """--ignore-tunings, --autotune and --autotune-budget, for run and compare."""
    command = click.option(
        "--autotune-budget", type=float, default=autotune.DEFAULT_BUDGET_S, show_default=True,
        envvar="CONVLAB_AUTOTUNE_BUDGET",
        help="With --autotune: seconds a layer's autotune may take, compiling included "
             "(env CONVLAB_AUTOTUNE_BUDGET).")(command)
    command = click.option(
        "--autotune", "autotune_on", is_flag=True, envvar=tuning.AUTOTUNE_ENV,
        help="A layer whose variant has no tuning entry for it: compile its cost model's best "
             f"{autotune.DEFAULT_CANDIDATES} tilings in parallel, time them, keep the fastest "
             f"in this GPU's cache and run it (env {tuning.AUTOTUNE_ENV}=1).")(command)
    return click.option(
        "--ignore-tunings", is_flag=True, envvar=tuning.IGNORE_ENV,
        help="Run the variants' own choice of tiling: shipped and cached tunings are not read "
             f"(env {tuning.IGNORE_ENV}=1). With --autotune: autotune every layer afresh.")(command)


def apply_choice(ignore_tunings: bool, autotune_on: bool, budget: float, progress=None) -> None:
    """Set up where tilings come from for this command: child processes inherit the ignore
    (an environment variable); autotune reports each layer on stderr, one line."""
    if ignore_tunings:
        os.environ[tuning.IGNORE_ENV] = "1"
    if not autotune_on:
        return
    if not budget > 0:
        raise ConvlabError(f"--autotune-budget must be a positive number of seconds, got {budget:g}")
    err = err_console()
    task = None

    def report(event, outcome):
        nonlocal task
        if progress is not None and event == "start":
            task = progress.add_task(f"autotune {outcome.variant} {outcome.shape.brief()}",
                                     total=None)
        elif progress is not None and event == "compiled" and task is not None:
            progress.update(task, description=f"autotune {outcome.variant}: timing "
                                              f"{outcome.offered} tilings")
        elif event == "done":
            if progress is not None and task is not None:
                progress.remove_task(task)
            err.print(escape(outcome.summary()), highlight=False)

    autotune.enable(budget_s=budget, report=report)


def _variant_choice(ctx, param, value):
    if value is not None:
        get_variant(value)  # unknown names list the valid ones
    return value


def _cpu_hint(exc: GPUUnavailable) -> ConvlabError:
    """For commands with --kernel: the no-GPU message, plus the way to run without one."""
    return ConvlabError(f"{exc} Use --kernel cpu to run on the CPU.")


def _fallback_hint(exc: UnsupportedLayers) -> ConvlabError:
    """For commands with --fallback: the refused layers, plus the variant that runs them."""
    if exc.stand_in is None:
        return exc
    return ConvlabError(f"{exc}. Use --fallback {exc.stand_in} to run those layers with it.")


@main.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--wide", is_flag=True, help=WIDE_HELP)
def list_variants(as_json, wide):
    """Every registered variant: name, precision, summary."""
    variants = list(VARIANTS.values())
    if as_json:
        click.echo(json.dumps([{"name": v.name, "summary": v.summary, "precision": v.precision,
                                "gpu": v.on_gpu, "epilogues": list(v.epilogues),
                                "general": sorted(v.general)} for v in variants], indent=2))
    else:
        out = console(wide)
        out.print(report.variants_table(variants, out.width, wide))


@main.command()
@click.argument("name")
@click.option("--raw", is_flag=True,
              help="Plain source, no highlighting or line numbers (what a pipe gets).")
def show(name, raw):
    """A variant's CUDA C source."""
    variant = get_variant(name)
    if not variant.source:
        raise ConvlabError(f"'{name}' has no CUDA source of its own: {variant.summary}")
    if raw or not console().is_terminal:  # a pipe or a file gets the source as it is
        click.echo(variant.source.strip("\n"))
    else:
        # Long lines wrap under their number: code is never cut at the terminal's width.
        console().print(Syntax(variant.source.strip("\n"), "cuda", line_numbers=True,
                               word_wrap=True))


KERNEL_FILE_HELP = ("Your own kernel: a .cu file with a convlab header or a .py file defining a "
                    "Variant (see `convlab new`); it runs in a child process, so a fault or a "
                    "hang ends its run, not convlab.")
HANG_HELP = "seconds a wait on the device may last before the run counts as a hang and is killed"
VERIFY_HELP = ("Which outputs of each conv layer's last timed run are checked against float64: a "
               "sample drawn at random (32 whole images, every image's first and last rows) or "
               "all of them.")


@main.command()
@click.option("--kernel", callback=_variant_choice,
              help="Variant for the conv layers (default: tiled for the ECE408 models and the "
                   "fastest general fp32 variant for alexnet on a GPU machine, else cpu).")
@click.option("--kernel-file", type=click.Path(dir_okay=False, path_type=Path),
              help=KERNEL_FILE_HELP)
@click.option("--model", default=DEFAULT_MODEL, show_default=True,
              help=f"One of: {', '.join(MODELS)}.")
@click.option("--batch", "batches", default=None,
              help="Images per forward pass, or a comma-separated list to run each; "
                   "interrupted, the batches that ended are shown and saved (default: 10000 "
                   "for the ECE408 models, 128 for the ImageNet models; "
                   f"{DEFAULT_SANITIZE_BATCH} with --sanitize).")
@click.option("--weights", "weights_path", type=click.Path(dir_okay=False, path_type=Path),
              help="A weights file for the model (ImageNet models: from `convlab import-weights`).")
@click.option("--fallback", callback=_variant_choice,
              help="Variant for the conv layers --kernel (or --kernel-file) does not support "
                   "(default: none, an error).")
@click.option("--repeat", type=click.IntRange(1), default=None,
              help="Timed runs per conv layer at least (default 10 on GPU, 3 on CPU); more are "
                   "taken until the median is known to 1%.")
@click.option("--cold", is_flag=True, help="Flush the L2 cache before every timed run.")
@click.option("--pytorch", is_flag=True,
              help="Also time the same network in PyTorch, in the run's precision class: NCHW and "
                   "channels-last, eager, CUDA-graphed and torch.compile'd; the fastest is the "
                   "baseline. With --images: the same stream in PyTorch.")
@click.option("--no-graph", is_flag=True,
              help="Launch every step of the end-to-end pass instead of replaying a CUDA graph.")
@click.option("--verify", type=click.Choice(VERIFY_MODES), default=None,
              help=VERIFY_HELP + " [default: sample]")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=None,
              help=f"With --kernel-file or --sanitize: {HANG_HELP} (default "
                   f"{DEFAULT_TIMEOUT_S:g}; {SANITIZER_TIMEOUT_S:g} with --sanitize).")
@click.option("--sanitize", type=click.Choice(SANITIZER_TOOLS), is_flag=False, flag_value="memcheck",
              default=None,
              help="Instead of timing: one checked launch per conv layer under NVIDIA's "
                   "compute-sanitizer (memcheck when no tool is named), its first errors at your "
                   "file and line.")
@click.option("--images", type=click.IntRange(1), default=None,
              help="Stream this many images through the model in batches of --batch: 8-bit "
                   "uploads, each batch's copy overlapping the pass before it; reports images/s "
                   "and per-batch times, saved under results/<gpu>/.")
@click.option("--image-dir", "from_dir", type=click.Path(path_type=Path),
              help="With --images, alexnet: stream the JPEG/PNG files of this folder (default: "
                   "seeded random 8-bit images).")
@click.option("--from", "old_from_dir", type=click.Path(path_type=Path), hidden=True)
@click.option("--upload", type=click.Choice(streaming.UPLOADS), default=None,
              help="With --images: how images cross to the device: uint8 (default; converted "
                   "by our ingest kernel) or float32 (normalised on the host).")
@click.option("--workers", type=click.IntRange(1, 256), default=None,
              help="With --images: host threads that decode images and gather a batch that "
                   "wraps the dataset's end (default: the CPU count, at most 16).")
@click.option("--save", "save_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the run's record (JSON and markdown, read back by `convlab results "
                   "show`) in this folder. With --images the record is always kept, by default "
                   "under results/<gpu>/.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="With --images: write the timeline of copies and passes as a PNG "
                   "(needs matplotlib).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON records instead of tables.")
@click.option("--wide", is_flag=True, help=WIDE_HELP)
@choice_options
def run(kernel, kernel_file, model, batches, weights_path, fallback, repeat, cold, pytorch,
        no_graph, verify, timeout, sanitize, images, from_dir, old_from_dir, upload, workers,
        save_dir, plot_path, as_json, wide, ignore_tunings, autotune_on, autotune_budget):
    """Run a model's forward pass with a chosen conv kernel: on the Fashion-MNIST test set for
    the ECE408 models, on a fixed random batch for the ImageNet models. With --images, stream a dataset
    through it instead."""
    from_dir = renamed(from_dir, old_from_dir, "--from", "--image-dir")
    streaming.check_options(images, dict(zip(streaming.STREAM_ONLY, (
        from_dir is not None, upload is not None, plot_path is not None,
        workers is not None))), {
        "--kernel-file": kernel_file is not None, "--fallback": fallback is not None,
        "--repeat": repeat is not None, "--cold": cold, "--no-graph": no_graph,
        "--verify": verify is not None, "--timeout": timeout is not None,
        "--sanitize": sanitize is not None})
    if images is not None:
        _stream_run(model, kernel, batches, images, upload or "uint8", from_dir, pytorch,
                    workers, weights_path, save_dir, plot_path, as_json, wide)
        return
    try:
        plan = lab.plan_run(model, kernel, kernel_file, batches, weights_path, fallback, repeat,
                            cold, pytorch, not no_graph, verify, timeout, sanitize,
                            save_dir is not None)
    except UnsupportedLayers as exc:
        raise _fallback_hint(exc) from None
    apply_choice(ignore_tunings, autotune_on, autotune_budget)
    out = console(wide)
    if plan.note and not as_json:
        out.print(f"[yellow]{escape(plan.note)}[/yellow]")
    if sanitize is not None:
        _sanitize_run(out, plan, sanitize, timeout, as_json)
        return
    if save_dir is not None:
        streaming.check_writable(save_dir, "folder")

    status = StatusLine(quiet=as_json)

    def on_event(name, payload=None):
        if as_json:
            return
        if name == "working":
            status.show(payload)
            return
        status.clear()
        if name == "isolated":
            click.echo(f"Running {kernel_file} at batch {payload} in a child process...")
        elif name == "loading-data":
            what = ("fashion-mnist data" if plan.spec.task == "fashion-mnist"
                    else "random input batch")
            click.echo(f"Loading {what}...", nl=False)
        elif name == "loading-model" and tuning.autotuning():
            click.echo("Loading model (autotuning the layers without a tuning)...")
        elif name == "loaded-model" and tuning.autotuning():
            click.echo("Model loaded")
        elif name == "loading-model":
            click.echo("Loading model...", nl=False)
        elif name in ("loaded-data", "loaded-model"):
            click.echo(" done")
        elif name == "layer":
            click.echo(report.op_time_line(payload))
        elif name == "done":
            click.echo(report.course_line(payload))

    interrupted = None
    try:
        results = lab.execute_run(plan, on_event)
    except GPUUnavailable as exc:
        raise _cpu_hint(exc) from None
    except lab.RunInterrupted as exc:
        results, interrupted = exc.results, exc
    finally:
        status.clear()
    if as_json:
        records = [r.as_dict() for r in results]
        click.echo(json.dumps(records[0] if len(records) == 1 else records, indent=2))
    else:
        _print_runs(out, results, wide)
    if save_dir is not None:
        record = saved_runs.to_record(results, "convlab " + " ".join(sys.argv[1:]))
        paths = saved_runs.save(record, save_dir,
                                report.run_markdown(record, saved_runs.runs(record)))
        err_console().print(f"saved {paths[0]} and {paths[1]}")
    if interrupted is not None:
        err_console().print(f"{interrupted}: the batches above ended and are shown"
                            f"{' and saved' if save_dir is not None else ''}")
        raise SystemExit(130)
    if not all(r.passed for r in results):
        raise SystemExit(1)


def _stream_run(model, kernel, batches, images, upload, from_dir, pytorch, workers,
                weights_path, save_dir, plot_path, as_json, wide):
    streaming.check_outputs(save_dir, plot_path)
    if plot_path is not None:
        require_pyplot()  # before the run, not after it
    spec = get_model(model)
    batch_list = lab.parse_batches(str(lab.default_batch(spec)) if batches is None else batches,
                                   spec)

    def on_event(name, payload=None):
        if as_json:
            return
        if name == "loading-data":
            click.echo("Loading images...")
        elif name == "loaded-data":
            click.echo(f"Streaming from {payload.description}")
        elif name == "row":
            click.echo(f"batch {payload['batch']}: {payload['images_per_s']:,.0f} images/s, "
                       f"{payload['ratio']:.2f}x max(copy, pass) per batch")
        elif name == "pytorch":
            click.echo(f"batch {payload}: the same stream in PyTorch...")

    try:
        record = streaming.stream(model, kernel, batch_list, images, upload, from_dir, pytorch,
                                  workers, weights_path, on_event)
    except GPUUnavailable as exc:
        raise ConvlabError(f"--images streams through a GPU: {exc}") from None
    record.command = "convlab " + " ".join(sys.argv[1:])
    out = console(wide)
    if as_json:
        click.echo(json.dumps(record.as_dict(), indent=2))
    else:
        stream_report.render(out, record, wide)
    paths = streaming.save(record, save_dir, stream_report.markdown(record))
    err_console().print(f"saved {paths[0]} and {paths[1]}")
    if plot_path is not None:
        try:
            err_console().print(f"wrote {stream_report.plot_timeline(record, plot_path)}")
        except OSError as exc:
            raise ConvlabError(f"{plot_path}: cannot write the plot ({exc.strerror or exc}); "
                               f"the record is saved") from None
    if not record.passed:
        raise SystemExit(1)


def _print_runs(out, results, wide):
    """Run results; a kernel file's run that ended without one (records.FailedRun) is a FAIL line."""
    finished = [r for r in results if not isinstance(r, records.FailedRun)]
    if len(results) == 1 and finished:
        result = results[0]
        out.print(report.run_table(result, out.width, wide))
        for extra in (report.steps_table(result, out.width, wide),
                      report.torch_table(result, out.width, wide)):
            if extra is not None:
                out.print(extra)
    elif finished:
        out.print(report.sweep_table(finished, out.width, wide))
    for result in results:
        lines = [result.reason] if isinstance(result, records.FailedRun) else report.failure_lines(result)
        for line in lines:
            out.print(f"[bold red]FAIL[/bold red] batch {result.batch}: {escape(line)}")
    if len(results) == 1 and finished:
        out.print(report.run_summary(results[0], out.width))
    else:
        for note in dict.fromkeys(n for r in results for n in r.notes):
            out.print(f"note: {escape(note)}")


def _sanitize_run(out, plan, tool, timeout, as_json):
    variant, model = plan.variant, plan.spec.name
    if not variant.on_gpu:
        raise ConvlabError(f"--sanitize watches GPU kernels; '{variant.name}' runs on the CPU")
    timeout = SANITIZER_TIMEOUT_S if timeout is None else timeout
    file = None if plan.kernel_file is None else plan.kernel_file.path
    runs = {network.batch: sanitize.sanitize_model(network, file, tool, timeout)
            for network in plan.networks}
    if as_json:
        click.echo(json.dumps([{"model": model, "kernel": variant.name, "batch": batch,
                                "tool": tool, "layers": [layer.as_dict() for layer in layers]}
                               for batch, layers in runs.items()], indent=2))
    else:
        for batch, layers in runs.items():
            out.print(f"{model}, kernel '{escape(variant.name)}', batch {batch}:")
            for layer in layers:
                for line in layer.lines():
                    out.print(escape(line), soft_wrap=True)
    if not all(layer.clean for layers in runs.values() for layer in layers):
        raise SystemExit(1)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--wide", is_flag=True, help=WIDE_HELP)
def models(as_json, wide):
    """The models, their layers and expected accuracies."""
    rows = []
    for name, spec in MODELS.items():
        try:
            rows.append((spec, load_weights(name), None))
        except ConvlabError as exc:
            rows.append((spec, None, str(exc)))
    if as_json:
        click.echo(json.dumps(report.models_json(rows), indent=2))
        return
    out = console(wide)
    out.print(report.models_table(rows, out.width, wide))
    if not wide:
        for line in report.models_layers(rows):
            out.print(escape(line), soft_wrap=False)


@main.command()
@click.option("--model", "names", multiple=True, help="Model to train (repeatable; default: all).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              default="/usr/share/datasets/fashion-mnist", show_default=True,
              help="Folder with train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz.")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to write <model>.npz (default: the weights shipped in the package).")
def train(names, data_dir, output):
    """Train the Fashion-MNIST models with PyTorch and save their weights."""
    for name in names or TRAINABLE:
        get_model(name)
        if name not in TRAINABLE:
            raise ConvlabError(f"model '{name}' is not trained here (trainable: {', '.join(TRAINABLE)})")
    for name in names or TRAINABLE:
        train_model(name, data_dir, output, log=click.echo)


@main.command()
@click.option("--ceilings/--no-ceilings", default=True, show_default=True,
              help="Show the measured copy bandwidth and FP32/TF32 rates (measured once, cached).")
@click.option("--refresh", is_flag=True, help="Measure the ceilings again.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def device(ceilings, refresh, as_json):
    """The GPU convlab would use, and its measured ceilings."""
    if not gpu_available():
        message = f"no GPU: {unavailable_reason()}. The cpu variant still runs (convlab run --kernel cpu)."
        if as_json:
            click.echo(json.dumps({"gpu": None, "reason": unavailable_reason()}))
        else:
            click.echo(message)
        return
    info = hardware.device_info()
    ceil = peaks.ceilings(refresh) if ceilings else None
    if as_json:
        click.echo(json.dumps({"gpu": info, "ceilings": ceil.as_dict() if ceil else None}, indent=2))
    else:
        out = console()
        out.print(report.device_table(info, ceil, out.width))


@main.command("compare")
@click.option("--kernels", default="all", show_default=True,
              help="Comma-separated variants, or 'all' (every variant supporting the layers). "
                   "The reference rows of the precisions present (cuDNN in both layouts; cuBLAS's "
                   "GEMM on 1x1 layers) are always added.")
@click.option("--kernel-file", "kernel_files", multiple=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help=KERNEL_FILE_HELP[:-1] + " (repeatable).")
@click.option("--model", default=None, help=f"Model whose conv layers to compare (default {DEFAULT_MODEL}).")
@click.option("--layer", default=None,
              help="A single layer instead: B,C,H,W,M,K[,stride,pad,groups,dilation] (random "
                   "inputs; K and pad may be pairs, 1x7 and 0x3).")
@click.option("--suite", default=None,
              help=f"A public layer suite instead: {', '.join(suites.NAMES)} (every distinct "
                   "conv layer at its batches, random inputs), with a summary per class.")
@click.option("--classes", default=None,
              help="With --suite: the precision classes to compare, e.g. fp16,tf32 (default: "
                   "fp32, tf32, fp16, bf16).")
@click.option("--bias", is_flag=True, help="With --layer: the layer adds a bias.")
@click.option("--weights", "weights_path", type=click.Path(dir_okay=False, path_type=Path),
              help="A weights file for --model (ImageNet models: from `convlab import-weights`).")
@click.option("--batch", "batches", default=None,
              help="Comma-separated batch sizes (default: the --layer's B; 128 for the ImageNet "
                   "models; else 10,100,1000,10000).")
@click.option("--cold", is_flag=True, help="Flush the L2 cache before every timed run.")
@click.option("--budget", type=float, default=timer.DEFAULT_BUDGET_S, show_default=True,
              help="Seconds of timing per row at most, once 10 runs are in.")
@click.option("--timing", type=click.Choice(timer.TIMING_METHODS), default=timer.QUEUED,
              show_default=True,
              help="queued: back-to-back launches between two events, queued behind a spin "
                   "kernel, so the host's dispatch is not timed; single: one launch between two "
                   "events on an idle GPU (dispatch included), to see what it adds. It applies "
                   "to the per-layer rows; whole-pass times are always queued.")
@click.option("--verify", type=click.Choice(VERIFY_MODES), default="sample", show_default=True,
              help=VERIFY_HELP)
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=None,
              help=f"With --kernel-file: {HANG_HELP} (default {DEFAULT_TIMEOUT_S:g}).")
@click.option("--save", "save_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write the JSON record and a markdown table into this folder.")
@click.option("--baseline", type=click.Path(dir_okay=False, path_type=Path),
              help="An earlier JSON record: print each row's ratio to it, flag regressions.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG: Op Time vs batch, and speedup over cuDNN.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON record instead of tables.")
@click.option("--wide", is_flag=True, help=WIDE_HELP)
@choice_options
def compare_cmd(kernels, kernel_files, model, layer, suite, classes, bias, weights_path, batches,
                cold, budget, timing, verify, timeout, save_dir, baseline, plot_path, as_json,
                wide, ignore_tunings, autotune_on, autotune_budget):
    """Verify, then time, variants side by side with cuDNN and the roofline floor."""


    if classes is not None and suite is None:
        raise ConvlabError("--classes goes with --suite")
    if suite is not None:
        given = [name for name, value in (("--model", model), ("--layer", layer),
                                          ("--kernel-file", kernel_files), ("--bias", bias),
                                          ("--weights", weights_path)) if value]
        if given:
            raise ConvlabError(f"--suite names its own layers: leave out {', '.join(given)}")
        plan = compare.suite_plan(suite, kernels, batches, classes, verify)
    else:
        weights = load_weights(model, weights_path) if weights_path is not None else None
        if weights_path is not None and model is None:
            raise ConvlabError("--weights goes with --model")
        if timeout is not None and not kernel_files:
            raise ConvlabError("--timeout goes with --kernel-file (the built-in kernels run in "
                               "this process)")
        plan = compare.plan(kernels, model, layer, batches, bias, weights, kernel_files,
                            weights_path, verify, timeout)
    base = results_io.from_record(results_io.load_record(baseline)) if baseline else None
    if plot_path is not None:
        require_pyplot()  # a missing matplotlib is reported before minutes of timing, not after
    policy = timer.TimingPolicy(cold=cold, budget_s=budget, method=timing)
    with progress_bar(as_json) as progress:
        apply_choice(ignore_tunings, autotune_on, autotune_budget, progress)
        task = progress.add_task("compare", total=None)

        def on_step(what, done, total):
            progress.update(task, description=what, completed=done - 1, total=total)

        comparison = compare.execute(plan, policy, on_step)
    record = results_io.to_record(comparison, "convlab " + " ".join(sys.argv[1:]))
    out = console(wide)
    if as_json:
        click.echo(json.dumps(record, indent=1))
    else:
        _print_comparison(out, comparison, wide)
    if comparison.interrupted:
        # The rows measured are kept where --save asks (a time limit cost three AlexNet
        # records), under a name and a first line that say the record is partial.
        if save_dir is not None:
            paths = results_io.save(record, save_dir, report.compare_markdown(comparison),
                                    results_io.record_name(record) + "-interrupted")
            kept = f"saved as {paths[0]} and {paths[1]}"
        else:
            kept = "nothing was saved"
        err_console().print(f"compare {comparison.interrupted}: the rows above are what was "
                            f"measured; {kept}")
        raise SystemExit(comparison.stop_status)
    if base is not None:
        out.print(report.diff_table(results_io.diff(comparison, base), out.width, wide))
    if save_dir is not None:
        paths = results_io.save(record, save_dir, report.compare_markdown(comparison))
        err_console().print(f"saved {paths[0]} and {paths[1]}")
    if plot_path is not None:
        err_console().print(f"plot written to {plot_comparison(comparison, plot_path)}")


def _print_comparison(out, comparison, wide):
    out.print(escape(report.compare_header(comparison)))
    if comparison.interrupted:
        out.print(f"[bold yellow]{escape(report.interrupted_line(comparison))}[/bold yellow]")
    if comparison.other_gpus:
        out.print(escape(report.other_gpus_line(comparison.other_gpus)))
    for table, notes in report.compare_tables(comparison, out.width, wide):
        out.print(table)
        for note in notes:
            out.print(escape(note))
    if comparison.suite:
        out.print(report.suite_summary_table(comparison, out.width, wide))


@main.group(cls=ConvlabGroup)
def results():
    """Saved comparison records."""


@results.command("show")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--markdown", is_flag=True, help="Print the markdown table instead.")
@click.option("--ladder", is_flag=True,
              help="Print a markdown summary: each variant's time at the largest batch and its "
                   "speed relative to cuDNN.")
@click.option("--wide", is_flag=True, help=WIDE_HELP)
def results_show(path, markdown, ladder, wide):
    """Re-render a saved `convlab compare`, `convlab profile` or `convlab run` record."""
    if ladder and markdown:
        raise ConvlabError("--ladder and --markdown are two different markdown renderings: give "
                           "one of them")
    if results_io.record_kind(path) == "stream":
        if ladder:
            raise ConvlabError("--ladder summarises compare records; this is a streamed run")
        record = streaming.load_record(path)
        if markdown:
            click.echo(stream_report.markdown(record))
        else:
            stream_report.render(console(wide), record, wide)
        return
    if results_io.record_kind(path) == "run":
        if ladder:
            raise ConvlabError("--ladder summarises compare records; this is a timed run")
        record = saved_runs.load_record(path)
        if markdown:
            click.echo(report.run_markdown(record, saved_runs.runs(record)))
        else:
            _print_runs(console(wide), saved_runs.runs(record), wide)
        return
    if results_io.record_kind(path) == "profile":
        record = profile.load_record(path)
        if ladder:
            raise ConvlabError("--ladder summarises compare records; this is a profile")
        if markdown:
            click.echo(profile_report.markdown(record))
        else:
            profile_report.render(record, console(wide), wide)
        return
    comparison = results_io.from_record(results_io.load_record(path))
    if ladder:
        click.echo(report.ladder_markdown(comparison), nl=False)
    elif markdown:
        click.echo(report.compare_markdown(comparison))
    else:
        _print_comparison(console(wide), comparison, wide)


@main.command("import-weights")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--model", type=click.Choice(importable_models()), default="alexnet",
              show_default=True, help="The model the weights are for.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write convlab's weights (.npz) [default: MODEL.npz].")
def import_weights_cmd(source, model, out):
    """Convert published weights into convlab's: alexnet from bvlc_alexnet.npy, resnet50 and
    vgg16 from a PyTorch state dict (torchvision's checkpoint files, torch.save's format).

    For alexnet, SOURCE is the caffe-tensorflow conversion of Caffe's bvlc_alexnet, a pickled
    dict {layer: [weights, biases]} with channel-last (HWIO) conv filters. A pickle runs code
    stored in the file when it is loaded: import only a file from a source you trust. The .npy
    header is read first, so a file that is not a pickled array is refused before anything is
    unpickled. A state dict is read without PyTorch, by an unpickler that builds tensors and
    refuses anything else.
    """
    out = out or Path(f"{model}.npz")
    weights = import_weights(source, out, model)
    count = sum(array.size for array in weights.arrays.values())
    click.echo(f"wrote {out}: {model}, {len(weights.arrays)} arrays, {count:,} parameters "
               f"from {source.name} (sha256 {weights.meta['source_sha256']})")
    click.echo(f"converted: {weights.meta['conversion']}")
    click.echo(f"use it with: convlab classify --model {model} --weights {out} IMAGE...")


@main.command()
@click.argument("images", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--model", default="alexnet", show_default=True,
              help=f"An ImageNet model: {', '.join(importable_models())}.")
@click.option("--weights", "weights_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Weights from `convlab import-weights` (default: the model's deterministic "
                   "random weights, whose classes mean nothing).")
@click.option("--kernel", callback=_variant_choice,
              help="Variant for the conv layers (default: run's, the fastest general fp32 "
                   "variant on a GPU machine, else cpu).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--wide", is_flag=True, help=WIDE_HELP)
def classify(images, model, weights_path, kernel, as_json, wide):
    """Top-5 ImageNet classes of IMAGES: JPEG/PNG files (needs Pillow), or .npy files of
    preprocessed input, float32 (N, 3, 227, 227), BGR, mean subtracted."""
    weights = load_weights(model, weights_path)
    notes = []
    if kernel is None:
        kernel, note = lab.default_kernel(weights.spec)
        if note:
            notes.append(note)
    if weights_path is None:
        notes.append(f"{model} ran on its deterministic random weights, so these classes mean "
                     "nothing: import the published ones with `convlab import-weights` and pass "
                     "--weights")
    classified = lab.classify(kernel, list(images), weights)
    if as_json:
        click.echo(json.dumps([item.as_dict() for item in classified], indent=2))
    else:
        out = console(wide)
        for item in classified:
            click.echo(item.input)
            out.print(imagenet.predictions_table(item, out.width, wide))
    for note in notes:
        err_console().print(f"[yellow]note: {escape(note)}[/yellow]")


@main.command("profile")
@click.option("--model", default=DEFAULT_MODEL, show_default=True,
              help=f"One of: {', '.join(MODELS)}.")
@click.option("--kernel", callback=_variant_choice,
              help="Variant for the conv layers (default: run's: tiled for the ECE408 models, "
                   "the fastest general fp32 variant for alexnet).")
@click.option("--batch", "batches", default=None,
              help="Batch size, or comma-separated sizes for the batch breakdown "
                   "(e.g. 1,10,100,1000,10000; default: run's, 10000 or 128 for the ImageNet models).")
@click.option("--passes", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="Forward passes traced per batch size, after the warm-up pass.")
@click.option("--threshold", type=click.FloatRange(0, 100, min_open=True), default=90.0,
              show_default=True, help="Mark the rows that together make up this percent of the time.")
@click.option("--save", "save_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write the JSON record and its markdown into this folder.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG: time against batch size, and where a forward pass's time goes.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON record instead of tables.")
@click.option("--wide", is_flag=True, help="Show every column, whatever the terminal's width.")
@click.option("--ncu", is_flag=True,
              help="Print the ncu command line that profiles the kernel launch of --ncu-layer "
                   "(one --batch size).")
@click.option("--ncu-layer", "layer",
              help="With --ncu: the layer whose kernel to profile, by name, e.g. conv2.")
@click.option("--layer", "old_layer", hidden=True)
def profile_cmd(model, kernel, batches, passes, threshold, save_dir, plot_path, as_json, wide,
                ncu, layer, old_layer):
    """Where the time goes: nvprof's tables from a CUPTI trace of the forward pass (warm-up
    shown apart), and with several batch sizes the per-category breakdown."""
    layer = renamed(layer, old_layer, "profile --layer", "--ncu-layer")
    spec = get_model(model)
    if kernel is None:
        kernel = lab.default_kernel(spec)[0]
        if kernel == "cpu":  # no GPU: profile's own check says so, naming a GPU kernel
            kernel = profile.DEFAULT_KERNEL
    batches = str(lab.default_batch(spec)) if batches is None else batches
    profile.check_options(ncu, layer)
    if ncu:
        targets = profile.find_ncu_targets(model, kernel, batches, layer)
        if as_json:
            click.echo(json.dumps([t.as_dict() for t in targets], indent=2))
        else:
            for line in profile_report.ncu_lines(targets):
                click.echo(line)
        return
    if plot_path is not None:
        require_pyplot()  # a missing matplotlib is reported before the profile runs, not after
    out = err_console()

    def on_batch(batch):
        if not as_json:
            out.print(f"profiling batch {batch}: warm-up, {passes} traced passes, "
                      f"{passes} untraced")

    record = profile.run_profile(model, kernel, batches, passes, threshold,
                                 "convlab " + " ".join(sys.argv[1:]), on_batch)
    if as_json:
        click.echo(json.dumps(record, indent=1))
    else:
        profile_report.render(record, console(wide), wide)
    if save_dir is not None:
        paths = profile.save(record, save_dir, profile_report.markdown(record))
        out.print(f"saved {paths[0]} and {paths[1]}")
    if plot_path is not None:
        out.print(f"plot written to {profile_report.plot(record, plot_path)}")


@main.command("tune")
@click.option("--layer", default=None,
              help="The layer: B,C,H,W,M,K[,stride,pad,groups,dilation] (random inputs; K and "
                   "pad may be pairs, 1x7 and 0x3).")
@click.option("--suite", default=None,
              help=f"Every layer of a public suite instead ({', '.join(suites.NAMES)}), one "
                   "sweep each, with the network's ReLU where the kernel fuses it.")
@click.option("--batch", "batches", default=None,
              help="With --suite: these batch sizes (default: each layer's own).")
@click.option("--kernel", required=True, callback=_variant_choice,
              help="The variant whose tiling space to search.")
@click.option("--bias", is_flag=True, help="The layer adds a bias.")
@click.option("--epilogue", type=click.Choice(["relu"]), default=None,
              help="Fuse a ReLU after the conv (and bias).")
@click.option("--budget", type=float, default=timer.DEFAULT_BUDGET_S, show_default=True,
              help="Seconds of timing per configuration at most, once 10 runs are in.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG: Op Time of every configuration tried.")
@click.option("--jobs", type=click.IntRange(1), default=tune.default_jobs(), show_default=True,
              help="Compile the candidates on this many processes first (1: each as it is "
                   "timed).")
@click.option("--json", "as_json", is_flag=True, help="Print the sweep as JSON instead of a table.")
@click.option("--wide", is_flag=True, help=WIDE_HELP)
def tune_cmd(layer, suite, batches, kernel, bias, epilogue, budget, plot_path, jobs, as_json,
             wide):
    """Try every tiling of a variant on one layer (compiled, verified, timed) and keep the
    fastest verified one for this GPU, where run and compare find it."""


    if (layer is None) == (suite is None):
        raise ConvlabError("give --layer or --suite (one of them)")
    if suite is not None:
        given = [n for n, v in (("--bias", bias), ("--epilogue", epilogue), ("--plot", plot_path))
                 if v]
        if given:
            raise ConvlabError(f"--suite sets each layer's bias and epilogue: leave out "
                               f"{', '.join(given)}")
        _tune_suite(suite, batches, kernel, budget, jobs, as_json, wide)
        return
    if batches is not None:
        raise ConvlabError("--batch goes with --suite (--layer names its batch)")
    shape = parse_layer(layer, bias)
    if plot_path is not None:
        require_pyplot()  # a missing matplotlib is reported before the sweep, not after
    policy = timer.TimingPolicy(budget_s=budget)
    with progress_bar(as_json) as progress:
        task = progress.add_task("tune", total=None)

        def on_step(done, total, config):
            what = tune.config_text(config) if config is not None else "done"
            progress.update(task, description=what, completed=done, total=total)

        result = tune.tune(shape, kernel, epilogue, policy, on_step, jobs=jobs)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=1))
    else:
        out = console(wide)
        out.print(tune.sweep_table(result, out.width, wide))
        for line in tune.failure_lines(result):
            out.print(f"[bold red]FAIL[/bold red] {escape(line)}")
        out.print(escape(tune.summary(result)))
    if result.cache_error:
        err_console().print(f"[yellow]{escape(result.cache_error)}[/yellow]")
    if result.interrupted:
        raise SystemExit(result.stop_status)
    if plot_path is not None:
        err_console().print(f"plot written to {tune.plot_sweep(result, plot_path)}")
    if result.best is None:
        raise SystemExit(1)


def _tune_suite(suite, batches, kernel, budget, jobs, as_json, wide):
    cells = tune.suite_cells(suite, kernel, lab.parse_batches(batches, None) if batches else None)
    policy = timer.TimingPolicy(budget_s=budget)
    done = []
    with progress_bar(as_json) as progress:
        task = progress.add_task("tune", total=len(cells))
        for i, (label, shape, epilogue) in enumerate(cells):
            progress.update(task, description=f"{kernel}: {label}", completed=i)
            result = tune.tune(shape, kernel, epilogue, policy, jobs=jobs)
            done.append((label, result))
            if result.interrupted:
                break
    if as_json:
        click.echo(json.dumps([{"cell": label, **result.as_dict()} for label, result in done],
                              indent=1))
    else:
        out = console(wide)
        out.print(tune.suite_table(done, out.width, wide))
        out.print(escape(tune.suite_summary(done)))
    if done and done[-1][1].interrupted:
        err_console().print(f"tune stopped at {done[-1][0]}: "
                            f"{done[-1][1].interrupted}; the cells before it were stored")
        raise SystemExit(done[-1][1].stop_status)


@main.command("new")
@click.argument("name")
@click.option("--from", "origin", default="naive", show_default=True, callback=_variant_choice,
              help="The shipped rung whose source NAME.cu starts from.")
def new_kernel(name, origin):
    """Write NAME.cu (and NAME.py where the rung needs launch code) to start a kernel of your own."""
    made = scaffold(name, origin)
    for path in made.files:
        click.echo(f"wrote {path}")
    click.echo("next:")
    for command in made.next_commands:
        click.echo(f"  {command}")


@main.command("check")
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--model", default=DEFAULT_MODEL, show_default=True,
              help=f"Compile for this model's conv layers; one of: {', '.join(MODELS)}.")
@click.option("--layer", default=None,
              help="A single layer instead: B,C,H,W,M,K[,stride,pad,groups].")
@click.option("--batch", default=1000, show_default=True, type=click.IntRange(1),
              help="Batch size the launch geometry is evaluated for.")
@click.option("--arch", default=None, help="Target architecture, e.g. sm_90 (default: the GPU's, "
                                           "else sm_90).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--wide", is_flag=True, help=WIDE_HELP)
def check_kernel(path, model, layer, batch, arch, as_json, wide):
    """Compile a kernel file (.cu or .py) with NVRTC and show its errors, warnings, registers,
    shared memory, spills and occupancy. Needs no GPU."""
    shapes = {"layer": parse_layer(layer)} if layer else get_model(model).conv_shapes(batch)
    result = check_file(path, shapes, arch)
    if as_json:
        click.echo(json.dumps(report_dict(result), indent=1))
    else:
        for message in result.messages:
            err_console().print(escape(message))
        out = console(wide)
        table, notes = report_table(result, out.width, wide)
        out.print(table)
        for note in notes:
            out.print(escape(note))
        if not result.runnable:
            err_console().print(f"no layer can run {escape(str(path))}: each one is refused above")
    if not result.ok:
        raise SystemExit(1)
