"""Did a kernel-source change move the shipped tilings' times? Every shipped tuning's build
(convlab/assets/tunings.json: its variant, layer, epilogue and tiling, whatever GPU it was
tuned on) in this checkout and in another git revision, timed back to back on this GPU: each
tree in a process of its own, in turns (old, new, old, new, ...), each turn timing every tiling
on the same seeded problem (timer.time_device through lab.run_layer) and verifying it against
float64. A tiling's time in a tree is the least of its turns' medians; the report is new over
old. For a change whose cubins are not byte-identical (scripts/compare_cubins.py says which),
the check that the shipped tilings stay within 2% (--tolerance).

Usage: python scripts/time_against_revision.py REV OUT.jsonl [--only TEXT ...] [--rounds N]
       (--only, repeatable: the tunings whose line holds any TEXT, a line reading as
       compare_cubins.py names a shipped build: 'VARIANT | SHAPE | EPILOGUE | TILING', e.g.
       --only 'channels-last | {"B": 128, "C": 9216'; every shipped tuning without it;
       rounds default 2; --tolerance 0.02)
Exit status 0: every tiling passed in both trees, new within the tolerance of old; 1: one
failed its check or its build, or ran slower than that; 2: no comparison (no such revision, no
tuning selected, a worker that stopped).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from revision_tree import NoSuchRevision, unpack

HERE = Path(__file__).resolve()
CHECKOUT = HERE.parent.parent
TUNINGS = CHECKOUT / "convlab" / "assets" / "tunings.json"


def line(entry: dict) -> str:
    return (f"{entry['variant']} | {json.dumps(entry['shape'], sort_keys=True)} | "
            f"{entry['epilogue']} | {json.dumps(entry['config'], sort_keys=True)}")


def shipped(only: list[str]) -> list[dict]:
    entries = json.loads(TUNINGS.read_text())["entries"].values()
    chosen = {line(e): e for e in entries if not only or any(text in line(e) for text in only)}
    return [{k: chosen[key][k] for k in ("variant", "shape", "epilogue", "config")}
            for key in sorted(chosen)]


def worker(tasks_file: str) -> None:
    """In the tree on PYTHONPATH: one JSON line per task, its median and verdict."""
    from convlab.bench import lab
    from convlab.gpu.timer import TimingPolicy
    from convlab.kernels import get_variant
    from convlab.shapes import ConvShape

    policy = TimingPolicy(warmup=3, min_runs=20, max_runs=400, target_rse=0.005, budget_s=1.0)
    for index, task in enumerate(json.loads(Path(tasks_file).read_text())):
        try:
            variant = get_variant(task["variant"]).configured(task["config"])
            result = lab.run_layer(ConvShape(**task["shape"]), variant, policy, task["epilogue"],
                                   seed=1)
            row = {"index": index, "median_ms": result.timing.median_ms,
                   "passed": bool(result.check.passed)}
        except Exception as exc:  # noqa: BLE001 - a build that fails is a result
            row = {"index": index, "error": f"{type(exc).__name__}: {exc}"[:300]}
        print(json.dumps(row), flush=True)


class NoComparison(Exception):
    """The trees could not be compared; the message says why."""


def run_tree(tree: Path, tasks_file: Path, count: int) -> dict[int, dict]:
    """The worker's row for each task index, in the tree `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "CONVLAB_IGNORE_TUNINGS": "1"}
    done = subprocess.run([sys.executable, str(HERE), "--worker", str(tasks_file)], cwd=tree,
                          env=env, capture_output=True, text=True, check=False)
    rows = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rows[row["index"]] = row
    if done.returncode or sorted(rows) != list(range(count)):
        raise NoComparison(f"{tree}: the worker stopped after {len(rows)} of {count} tilings\n"
                           f"{done.stderr[-2000:]}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("rev", nargs="?")
    parser.add_argument("out", nargs="?")
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--worker")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    if not args.rev or not args.out:
        parser.error("REV and OUT.jsonl are required")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    tasks = shipped(args.only)
    if not tasks:
        print("no shipped tuning matches --only", file=sys.stderr)
        return 2
    try:
        turns = time_both(args.rev, tasks, args.rounds)
    except NoComparison as exc:
        print(exc, file=sys.stderr)
        return 2
    return report(args, tasks, turns)


def time_both(rev: str, tasks: list[dict], rounds: int) -> dict[str, list[dict[int, dict]]]:
    with tempfile.TemporaryDirectory(prefix="time-against-") as scratch:
        try:
            old = unpack(rev, Path(scratch) / "old")
        except NoSuchRevision as exc:
            raise NoComparison(str(exc)) from exc
        tasks_file = Path(scratch) / "tasks.json"
        tasks_file.write_text(json.dumps(tasks))
        turns = {"old": [], "new": []}
        for _ in range(rounds):
            for name, tree in (("old", old), ("new", CHECKOUT)):
                turns[name].append(run_tree(tree, tasks_file, len(tasks)))
    return turns


def verdict(row: dict, tolerance: float) -> str:
    if not (row["old_passed"] and row["new_passed"]):
        return "FAILED"
    return "SLOWER" if row.get("new_over_old", 1.0) > 1 + tolerance else "ok"


def report(args, tasks: list[dict], turns: dict[str, list[dict[int, dict]]]) -> int:
    failed = False
    with open(args.out, "w") as out:
        for index, task in enumerate(tasks):
            row = {**task, "rev": args.rev}
            for name in ("old", "new"):
                results = [turn[index] for turn in turns[name]]
                errors = [r["error"] for r in results if "error" in r]
                row[f"{name}_ms"] = min((r["median_ms"] for r in results if "median_ms" in r),
                                        default=None)
                row[f"{name}_passed"] = not errors and all(r["passed"] for r in results)
                row[f"{name}_error"] = errors[0] if errors else None
                failed |= not row[f"{name}_passed"]
            if row["old_ms"] and row["new_ms"]:
                row["new_over_old"] = row["new_ms"] / row["old_ms"]
                failed |= row["new_over_old"] > 1 + args.tolerance
            out.write(json.dumps(row) + "\n")
            config = task["config"]
            print(f"{task['variant']:18s} {json.dumps(task['shape']['B'])}x{task['shape']['C']}"
                  f"x{task['shape']['H']}x{task['shape']['W']}->{task['shape']['M']} "
                  f"k{task['shape']['K']} {config.get('schedule', 'grid'):10s} "
                  f"old {row['old_ms'] or 0:.4f} new {row['new_ms'] or 0:.4f} ms  "
                  f"{row.get('new_over_old', 0):.3f}  "
                  f"{verdict(row, args.tolerance)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
