"""The convlab command line: click commands that call the lab and print rich tables."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.syntax import Syntax

from . import __version__, lab, measure, report
from .errors import ConvlabError
from .gpu import gpu_available, unavailable_reason
from .kernels import VARIANTS, get_variant
from .models import MODELS, get_model, load_weights


def console() -> Console:
    """A console for this call: rich reads the terminal width (or COLUMNS) when it is made."""
    return Console()


def err_console() -> Console:
    return Console(stderr=True)


class ConvlabGroup(click.Group):
    """Turns ConvlabError into one clear message and exit status 1, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ConvlabError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=ConvlabGroup)
@click.version_option(__version__, prog_name="convlab")
def main():
    """convlab: a JIT kernel lab for the forward pass of a CNN's convolution layer."""


def _variant_choice(ctx, param, value):
    if value is not None:
        get_variant(value)  # unknown names list the valid ones
    return value


@main.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def list_variants(as_json):
    """Every registered variant: name, precision, summary."""
    variants = list(VARIANTS.values())
    if as_json:
        click.echo(json.dumps([{"name": v.name, "summary": v.summary, "precision": v.precision,
                                "gpu": v.on_gpu, "epilogues": list(v.epilogues)}
                               for v in variants], indent=2))
    else:
        console().print(report.variants_table(variants))


@main.command()
@click.argument("name")
@click.option("--raw", is_flag=True, help="Plain source, no highlighting.")
def show(name, raw):
    """A variant's CUDA C source."""
    variant = get_variant(name)
    if not variant.source:
        raise ConvlabError(f"'{name}' has no CUDA source of its own: {variant.summary}")
    if raw:
        click.echo(variant.source.strip("\n"))
    else:
        console().print(Syntax(variant.source.strip("\n"), "cuda", line_numbers=True))


@main.command()
@click.option("--kernel", callback=_variant_choice,
              help="Variant for the conv layers (default: tiled on a GPU machine, else cpu).")
@click.option("--model", default="ece408-high", show_default=True,
              help=f"One of: {', '.join(MODELS)}.")
@click.option("--batch", default=lab.MAX_BATCH, show_default=True, type=int,
              help=f"Number of test images, 1..{lab.MAX_BATCH}.")
@click.option("--repeat", type=click.IntRange(1), default=None,
              help="Timed runs per conv layer at least (default 10 on GPU, 3 on CPU); more are "
                   "taken until the median is known to 1%.")
@click.option("--cold", is_flag=True, help="Flush the L2 cache before every timed run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON record instead of tables.")
def run(kernel, model, batch, repeat, cold, as_json):
    """Run a model on the Fashion-MNIST test set with a chosen conv kernel."""
    get_model(model)
    lab.check_batch(batch)
    note = None
    if kernel is None:
        if gpu_available():
            kernel = "tiled"
        else:
            kernel = "cpu"
            note = f"no usable GPU ({unavailable_reason()}): running the cpu variant"
    on_gpu = get_variant(kernel).on_gpu
    policy = measure.TimingPolicy(min_runs=repeat or (10 if on_gpu else 3), cold=cold)
    if note and not as_json:
        console().print(f"[yellow]{escape(note)}[/yellow]")

    def on_event(name, payload=None):
        if as_json:
            return
        if name == "loading-data":
            click.echo("Loading fashion-mnist data...", nl=False)
        elif name == "loading-model":
            click.echo("Loading model...", nl=False)
        elif name in ("loaded-data", "loaded-model"):
            click.echo(" done")
        elif name == "layer":
            mark = "" if payload.check.passed else "  (FAIL: output does not match the reference)"
            click.echo(f"Op Time: {payload.timing.median_ms / 1e3:.6f}{mark}")
        elif name == "done":
            click.echo(f"Correctness: {payload.accuracy:.4f} Model: {payload.model}")

    result = lab.run(model, kernel, batch, policy, on_event)
    if note:
        result.notes.append(note)
    if cold:
        result.notes.append("L2 cache flushed before every timed run (--cold)")
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    else:
        console().print(report.run_table(result))
        for line in report.failure_lines(result):
            console().print(f"[bold red]FAIL[/bold red] {escape(line)}")
        console().print(report.run_summary(result))
    if not result.passed:
        raise SystemExit(1)


@main.command()
def models():
    """The models, their layers and expected accuracies."""
    rows = []
    for name, spec in MODELS.items():
        try:
            rows.append((spec, load_weights(name), None))
        except ConvlabError as exc:
            rows.append((spec, None, str(exc)))
    console().print(report.models_table(rows))


@main.command()
@click.option("--model", "names", multiple=True, help="Model to train (repeatable; default: all).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              default="/usr/share/datasets/fashion-mnist", show_default=True,
              help="Folder with train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz.")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to write <model>.npz (default: the weights shipped in the package).")
def train(names, data_dir, output):
    """Train models with PyTorch on the Fashion-MNIST training set and save their weights."""
    from .train import train as train_model

    for name in names or tuple(MODELS):
        get_model(name)
    for name in names or tuple(MODELS):
        train_model(name, data_dir, output, log=click.echo)


@main.command()
@click.option("--ceilings/--no-ceilings", default=True, show_default=True,
              help="Show the measured copy bandwidth and FP32/TF32 rates (measured once, cached).")
@click.option("--refresh", is_flag=True, help="Measure the ceilings again.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def device(ceilings, refresh, as_json):
    """The GPU convlab would use, and its measured ceilings."""
    if not gpu_available():
        message = f"no GPU: {unavailable_reason()}. The cpu variant still runs (--kernel cpu)."
        if as_json:
            click.echo(json.dumps({"gpu": None, "reason": unavailable_reason()}))
        else:
            click.echo(message)
        return
    info = measure.device_info()
    ceil = measure.ceilings(refresh) if ceilings else None
    if as_json:
        click.echo(json.dumps({"gpu": info, "ceilings": ceil.as_dict() if ceil else None}, indent=2))
    else:
        console().print(report.device_table(info, ceil))


@main.command("compare")
@click.option("--kernels", default="all", show_default=True,
              help="Comma-separated variants, or 'all' (every variant supporting the layers). "
                   "cudnn and cudnn-tf32 are always added as reference rows.")
@click.option("--model", default=None, help="Model whose conv layers to compare (default ece408-high).")
@click.option("--layer", default=None, help="A single layer instead: B,C,H,W,M,K (random inputs).")
@click.option("--batch", "batches", default="10,100,1000,10000", show_default=True,
              help="Comma-separated batch sizes.")
@click.option("--cold", is_flag=True, help="Flush the L2 cache before every timed run.")
@click.option("--budget", type=float, default=measure.DEFAULT_BUDGET_S, show_default=True,
              help="Seconds of timing per row at most, once 10 runs are in.")
@click.option("--save", "save_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write the JSON record and a markdown table into this folder.")
@click.option("--baseline", type=click.Path(dir_okay=False, path_type=Path),
              help="An earlier JSON record: print each row's ratio to it, flag regressions.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG: Op Time vs batch, and speedup over cuDNN.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON record instead of tables.")
def compare_cmd(kernels, model, layer, batches, cold, budget, save_dir, baseline, plot_path, as_json):
    """Verify, then time, variants side by side with cuDNN and the roofline floor."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import compare, results

    plan = compare.plan(kernels, model, layer, batches)
    base = results.from_record(results.load_record(baseline)) if baseline else None
    if plot_path is not None:
        from .plot import _pyplot

        _pyplot()  # a missing matplotlib is reported before minutes of timing, not after
    policy = measure.TimingPolicy(cold=cold, budget_s=budget)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console(), transient=True,
                  disable=as_json) as progress:
        task = progress.add_task("compare", total=None)

        def on_step(what, done, total):
            progress.update(task, description=what, completed=done - 1, total=total)

        comparison = compare.execute(plan, policy, on_step)
    record = results.to_record(comparison, "convlab " + " ".join(sys.argv[1:]))
    if as_json:
        click.echo(json.dumps(record, indent=1))
    else:
        _print_comparison(comparison)
    if base is not None:
        console().print(report.diff_table(results.diff(comparison, base)))
    if save_dir is not None:
        paths = results.save(record, save_dir, report.compare_markdown(comparison))
        err_console().print(f"saved {paths[0]} and {paths[1]}")
    if plot_path is not None:
        from .plot import plot_comparison

        err_console().print(f"plot written to {plot_comparison(comparison, plot_path)}")


def _print_comparison(comparison):
    console().print(escape(report.compare_header(comparison)))
    for table in report.compare_tables(comparison):
        console().print(table)


@main.group(cls=ConvlabGroup)
def results():
    """Saved comparison records."""


@results.command("show")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--markdown", is_flag=True, help="Print the markdown table instead.")
@click.option("--ladder", is_flag=True,
              help="Print a markdown summary: each variant's time at the largest batch and its "
                   "speed relative to cuDNN.")
def results_show(path, markdown, ladder):
    """Re-render a saved `convlab compare` record."""
    from . import results as results_io

    comparison = results_io.from_record(results_io.load_record(path))
    if ladder:
        click.echo(report.ladder_markdown(comparison), nl=False)
    elif markdown:
        click.echo(report.compare_markdown(comparison))
    else:
        _print_comparison(comparison)
