"""Did a change to the kernel sources change any machine code? Compiles every cubin the CPU tests
compile (each variant and op on their layers, the wgmma schedules, the add-relu stores) and each
shipped tuning's build, with NVRTC on the CPU, in this checkout and in another git revision, and
compares them byte for byte. Identical cubins run as fast and as right as before: a refactor
that passes needs no GPU to show it changed nothing; one that does not needs timing.

Usage: python scripts/compare_cubins.py [REV]   (default HEAD: this checkout's uncommitted
       changes against the last commit; about ten minutes a tree on two cores)

NVRTC's output for a few tilings depends on what the same process compiled before (seen on
`wgmma-split-bf16` persistent tilings at bn 96), so every test whose cubins differ is compiled
again alone, in a fresh process, in both trees; only differences that stay are reported.
Exit status 0: identical; 1: some machine code changed.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent
SELECTION = ["-k", "compile or wgmma or nvrtc", "tests/"]


def start(tree: Path, out: Path, tests: list[str], shipped: bool) -> subprocess.Popen:
    """The tests in `tree` with the recording plugin, writing the cubins' hashes to `out`."""
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{HERE}", "CUBIN_RECORD": str(out),
           "CUBIN_RECORD_SHIPPED": "1" if shipped else "0",
           "CONVLAB_CACHE_DIR": str(out.with_suffix(".cache"))}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "cubin_record", "-p",
               "no:cacheprovider", *tests]
    return subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def records(trees: dict[str, Path], scratch: Path, tests: list[str], shipped: bool,
            tag: str) -> dict[str, dict]:
    """Both trees' records, their test runs side by side."""
    outs = {name: scratch / f"{name}-{tag}.json" for name in trees}
    runs = {name: start(tree, outs[name], tests, shipped) for name, tree in trees.items()}
    for name, run in runs.items():
        log = run.communicate()[0]
        if run.returncode not in (0, 5) or not outs[name].exists():
            sys.exit(f"the tests failed in {trees[name]}:\n{log[-3000:]}")
    return {name: json.loads(out.read_text()) for name, out in outs.items()}


def differing(old: dict, new: dict) -> list[str]:
    """Groups both trees compiled whose cubins differ."""
    return sorted(k for k in old.keys() & new.keys() if old[k] != new[k])


def main(rev: str) -> int:
    with tempfile.TemporaryDirectory(prefix="compare-cubins-") as scratch:
        scratch = Path(scratch)
        before = scratch / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), rev], cwd=CHECKOUT,
                       check=True, capture_output=True)
        try:
            trees = {"before": before, "after": CHECKOUT}
            found = records(trees, scratch, SELECTION, True, "all")
            changed = differing(found["before"], found["after"])
            tests = sorted({key.split(" | ")[0] for key in changed
                            if not key.startswith("shipped")})
            for i, test in enumerate(tests):
                again = records(trees, scratch, [test], False, f"again{i}")
                if not differing(again["before"], again["after"]):
                    changed = [k for k in changed if not k.startswith(f"{test} | ")]
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=CHECKOUT,
                           capture_output=True)
    old, new = found["before"], found["after"]
    both = old.keys() & new.keys()
    compiled = sum(len(new[k]) for k in both)
    print(f"{compiled} cubins in {len(both)} groups compiled by both trees; "
          f"{len(new.keys() - old.keys())} groups only after, {len(old.keys() - new.keys())} "
          f"only before (tests added or removed)")
    if not changed:
        print(f"identical machine code to {rev}")
        return 0
    print(f"{len(changed)} groups compiled different machine code from {rev}:")
    for key in changed:
        print(f"  {key}")
    return 1


if __name__ == "__main__":
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1].startswith("-")):
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1] if len(sys.argv) == 2 else "HEAD"))
