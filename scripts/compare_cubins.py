"""Did a change to the kernel sources change any machine code? Compiles the cubins of the CPU
compile tests (those -k "compile or wgmma or nvrtc" selects: each variant and op on their
layers, the wgmma schedules, the add-relu stores) and each shipped tuning's build, with NVRTC on
the CPU, in this checkout and in another git revision, and compares them byte for byte.
Identical cubins run as fast and as right as before: a refactor that passes needs no GPU to show
it changed nothing; one that does not needs timing.

Usage: python scripts/compare_cubins.py [REV]   (default HEAD: this checkout's uncommitted
       changes against the last commit; about ten minutes a tree on two cores)

NVRTC's output for a few tilings depends on what the same process compiled before (seen on
`wgmma-split-bf16` persistent tilings at bn 96), so every test whose cubins differ is compiled
again alone, in a fresh process, in both trees; a difference is dropped only when both trees
compile that group again, to the same cubins.

A group compiled in one tree only is a difference too when its test compiled something in both
trees (the same test compiled different things); a test that compiled in one tree only was
added or removed, and is listed without failing the comparison.

Exit status 0: identical; 1: some machine code changed; 2: no comparison (the tests failed, no
such revision, wrong usage).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from revision_tree import NoSuchRevision, unpack

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent
SELECTION = ["-k", "compile or wgmma or nvrtc", "tests/"]
# Groups that no single test compiled, so none can be compiled again alone.
NOT_TESTS = {"shipped", "(collection)"}


class Failed(Exception):
    """The comparison could not be made; the message says why."""


def test_of(key: str) -> str:
    return key.split(" | ")[0]


def start(tree: Path, out: Path, tests: list[str], shipped: bool) -> subprocess.Popen:
    """The tests in `tree` with the recording plugin, writing the cubins' hashes to `out` and
    pytest's output next to it."""
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{HERE}", "CUBIN_RECORD": str(out),
           "CUBIN_RECORD_SHIPPED": "1" if shipped else "0",
           "CONVLAB_CACHE_DIR": str(out.with_suffix(".cache"))}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "cubin_record", "-p",
               "no:cacheprovider", *tests]
    with open(out.with_suffix(".log"), "w") as log:
        return subprocess.Popen(command, cwd=tree, env=env, stdout=log,
                                stderr=subprocess.STDOUT)


def records(trees: dict[str, Path], scratch: Path, tests: list[str], shipped: bool,
            tag: str) -> dict[str, dict]:
    """Both trees' records, their test runs side by side; when one run fails the other is
    stopped, as its record could not be compared with anything."""
    outs = {name: scratch / f"{name}-{tag}.json" for name in trees}
    runs = {name: start(tree, outs[name], tests, shipped) for name, tree in trees.items()}
    pending = dict(runs)
    try:
        while pending:
            time.sleep(1)
            for name in [name for name, run in pending.items() if run.poll() is not None]:
                check(trees[name], outs[name], pending.pop(name).returncode)
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
                run.wait()
    return {name: json.loads(out.read_text()) for name, out in outs.items()}


def check(tree: Path, out: Path, returncode: int) -> None:
    """Failed unless pytest passed (or selected nothing) and wrote its record."""
    if returncode not in (0, 5) or not out.exists():
        log = out.with_suffix(".log").read_text(errors="replace")
        raise Failed(f"the tests failed in {tree}:\n{log[-3000:]}")


def differing(old: dict, new: dict) -> list[str]:
    """Groups both trees compiled whose cubins differ."""
    return sorted(k for k in old.keys() & new.keys() if old[k] != new[k])


def one_sided(old: dict, new: dict) -> list[str]:
    """Groups one tree compiled and the other did not, of tests that compiled in both trees."""
    in_both = {test_of(k) for k in old} & {test_of(k) for k in new}
    return sorted(k for k in old.keys() ^ new.keys() if test_of(k) in in_both)


def still_differing(keys: list[str], old: dict, new: dict) -> list[str]:
    """Those of `keys` that a re-run (`old`, `new`) did not compile to the same cubins in both
    trees; a group the re-run did not compile keeps its difference, as nothing disproved it."""
    return [k for k in keys if k not in old or k not in new or old[k] != new[k]]


def main(rev: str) -> int:
    with tempfile.TemporaryDirectory(prefix="compare-cubins-") as scratch:
        scratch = Path(scratch)
        try:
            before = unpack(rev, scratch / "before")
        except NoSuchRevision as exc:
            raise Failed(str(exc)) from exc
        trees = {"before": before, "after": CHECKOUT}
        found = records(trees, scratch, SELECTION, True, "all")
        changed = differing(found["before"], found["after"])
        tests = sorted({test_of(k) for k in changed} - NOT_TESTS)
        for i, test in enumerate(tests):
            again = records(trees, scratch, [test], False, f"again{i}")
            of_test = [k for k in changed if test_of(k) == test]
            kept = still_differing(of_test, again["before"], again["after"])
            changed = [k for k in changed if k not in of_test or k in kept]
    old, new = found["before"], found["after"]
    both = old.keys() & new.keys()
    unmatched = one_sided(old, new)
    old_tests, new_tests = {test_of(k) for k in old}, {test_of(k) for k in new}
    compiled = sum(len(new[k]) for k in both)
    print(f"{compiled} cubins in {len(both)} groups compiled by both trees")
    for label, tests in (("added (compiled only after)", new_tests - old_tests),
                         ("removed (compiled only before)", old_tests - new_tests)):
        if tests:
            print(f"{len(tests)} tests {label}:")
            for test in sorted(tests):
                print(f"  {test}")
    if unmatched:
        print(f"{len(unmatched)} groups compiled by one tree only, in tests that compiled in "
              f"both:")
        for key in unmatched:
            print(f"  {'after' if key in new else 'before'} only: {key}")
    if changed:
        print(f"{len(changed)} groups compiled different machine code from {rev}:")
        for key in changed:
            print(f"  {key}")
    if changed or unmatched:
        return 1
    print(f"identical machine code to {rev}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1].startswith("-")):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(main(sys.argv[1] if len(sys.argv) == 2 else "HEAD"))
    except Failed as failure:
        print(failure, file=sys.stderr)
        sys.exit(2)
    except Exception:
        traceback.print_exc()
        sys.exit(2)
