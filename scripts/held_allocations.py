"""What a network holds on the device, array by array: builds MODEL's network with KERNEL at
BATCH (the variants' own choice, shipped and cached tunings ignored), loads its input, runs one
forward, and lists the CuPy pool's live allocations by the convlab line that made them and
their size, largest total first. `convlab run --pytorch` compares the same held bytes (the
pool's used bytes) with PyTorch eager's peak: this says where each of ours goes.

Usage: python scripts/held_allocations.py MODEL KERNEL BATCH [ROWS]"""

import collections
import os
import sys
import traceback

os.environ.setdefault("CONVLAB_IGNORE_TUNINGS", "1")

import cupy  # noqa: E402

from convlab.bench import lab  # noqa: E402
from convlab.models import get_model, load_weights  # noqa: E402


class LiveAllocations(cupy.cuda.MemoryHook):
    """Every allocation the pool hands out and has not taken back, with the innermost convlab
    frame that asked for it."""

    name = "LiveAllocations"

    def __init__(self):
        self.live = {}

    def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
        frames = [f for f in traceback.extract_stack() if "/convlab/" in f.filename]
        site = (f"{frames[-1].filename.split('/convlab/')[-1]}:{frames[-1].lineno}"
                if frames else "outside convlab")
        self.live[mem_ptr] = (site, size, mem_size)

    def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
        self.live.pop(mem_ptr, None)


def main(model: str, kernel: str, batch: int, rows: int = 40) -> None:
    spec = get_model(model)
    weights = load_weights(spec.name)
    x = lab.load_input(spec, batch)
    pool = cupy.get_default_memory_pool()
    cupy.cuda.Device().synchronize()
    before = pool.used_bytes()
    hook = LiveAllocations()
    with hook:
        network = lab.build_network(spec, kernel, batch, weights)
        network.input.set(x)
        network.forward()
        cupy.cuda.Device().synchronize()
    held = pool.used_bytes() - before
    groups = collections.defaultdict(lambda: [0, 0, 0])
    for site, size, mem_size in hook.live.values():
        entry = groups[(site, mem_size)]
        entry[0] += 1
        entry[1] += size
        entry[2] += mem_size
    print(f"{model} {kernel} batch {batch}: {held:,} bytes held ({held / 2**20:,.2f} MiB), "
          f"{len(hook.live)} live arrays")
    print(f"{'site':<44} {'arrays':>6} {'each (pool)':>14} {'asked':>15} {'held':>15}")
    ranked = sorted(groups.items(), key=lambda item: -item[1][2])
    for (site, each), (count, asked, total) in ranked[:rows]:
        print(f"{site:<44} {count:>6} {each:>14,} {asked:>15,} {total:>15,}")
    rounding = sum(total - asked for _, asked, total in groups.values())
    print(f"pool rounding: {rounding:,} bytes; arrays of at most 512 bytes: "
          f"{sum(c for (_, each), (c, _, _) in groups.items() if each <= 512)}")
    del network


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *map(int, sys.argv[4:]))
