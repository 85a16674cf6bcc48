"""Split-K inside one launch: each split writes its partial tile, the last to arrive adds them
in split order (so the result does not depend on arrival order) and goes on to the epilogue.
One meeting point (SPLIT_K_LAST) for the grid schedule, whose blocks each hold one split and
meet on __syncthreads, and the persistent one, whose MMA threads walk the splits as units of
work and meet on a named barrier the loaders do not take part in. SplitKScratch is their
workspace, one for all the ops of a network."""

import contextlib
import contextvars

SPLIT_K_LAST = r"""
// Each split writes its partial tile (thread-private order: coalesced, and read back by the
// same thread of whichever split finishes last, its own included), then counts itself in;
// `sync` is a barrier of the THREADS threads that hold the tile's accumulators, `arrivals` a
// shared word. The last split to arrive adds the partials in split order into `flat` and
// returns true; the others return false and leave the tile to it. Every count is back at
// zero when the tile is done.
template <typename Sync>
__device__ __forceinline__ bool split_k_last(float* flat, float* __restrict__ ws,
                                             int* __restrict__ counters, long long tile_id,
                                             int split, int tid, Sync sync, int* arrivals)
{
    float* parts = ws + tile_id * (SPLIT_K * BM * BN);
#pragma unroll
    for (int e = 0; e < MF * NF * 4; ++e)
        __stcg(parts + split * (BM * BN) + e * THREADS + tid, flat[e]);
    __threadfence();
    sync();
    if (tid == 0) *arrivals = atomicAdd(counters + tile_id, 1);
    sync();
    if (*arrivals != SPLIT_K - 1) return false;
    __threadfence();
    // A split at a time, its own partial read back too, in a loop the compiler keeps: the
    // splits' loads unrolled beside the sum spilled the wide tiles' registers.
#pragma unroll
    for (int e = 0; e < MF * NF * 4; ++e) flat[e] = 0.0f;
#pragma unroll 1
    for (int s = 0; s < SPLIT_K; ++s) {
#pragma unroll
        for (int e = 0; e < MF * NF * 4; ++e)
            flat[e] += __ldcg(parts + s * (BM * BN) + e * THREADS + tid);
    }
    if (tid == 0) counters[tile_id] = 0;
    return true;
}
"""

SPLIT_K_REDUCE = r"""
    if constexpr (SPLIT_K > 1) {
        __shared__ int arrivals;
        if (!split_k_last(&acc[0][0][0], ws, counters, Walk::slot(unit), unit.split, tid,
                          [] { __syncthreads(); }, &arrivals))
            return;
    }
"""


class SplitKScratch:
    """The partial tiles and arrival counts (SPLIT_K_LAST's ws and counters) of every op
    prepared while it is installed (shared_split_k). A network's ops launch one after another
    on one stream, so one workspace the size of the largest serves them all, where each op's
    own add up (ResNet-50's fp16 network at batch 1: 30.6 MiB over 26 ops, the largest 1.75
    MiB). The last split of a tile sets its count back to zero, so each launch finds them as it
    needs them. The arrays are allocated at the first launch, for every op reserved by then (a
    Network places the partial tiles in its arena instead, `place`); an op reserved later that
    needs more gets larger ones, and the smaller stay alive for whatever captured them (a CUDA
    graph)."""

    def __init__(self):
        self.floats = 0
        self.tiles = 0
        self._arrays: tuple | None = None
        self._retired: list[tuple] = []
        self._placed = False

    def reserve(self, floats: int, tiles: int) -> None:
        if self._placed:
            # a placed workspace's bytes are other buffers' outside the steps it was placed for
            raise RuntimeError("a split-K workspace placed in an arena serves only the ops "
                               "reserved before it was placed")
        self.floats, self.tiles = max(self.floats, floats), max(self.tiles, tiles)

    def place(self, ws) -> None:
        """Take `ws` (float32, at least `floats` of them: a view of a network's arena, alive
        over the steps that split) as the partial tiles; the counters stay arrays of their
        own, zeroed once, since the last split leaves them at zero and nothing else writes
        them."""
        import cupy

        if ws.size < self.floats:
            raise ValueError(f"a split-K workspace of {ws.size} floats for ops that reserved "
                             f"{self.floats}")
        if self._arrays is not None:
            self._retired.append(self._arrays)
        self._arrays = (ws, cupy.zeros(max(self.tiles, 1), dtype=cupy.int32))
        self._placed = True

    def arrays(self) -> tuple:
        """(ws, counters) on the device, large enough for every op reserved so far (asked at
        every launch: allocated only when they are not)."""
        found = self._arrays
        if found is None or found[0].size < self.floats or found[1].size < self.tiles:
            import cupy

            if found is not None:
                self._retired.append(found)
            found = self._arrays = (cupy.empty(max(self.floats, 1), dtype=cupy.float32),
                                    cupy.zeros(max(self.tiles, 1), dtype=cupy.int32))
        return found


_installed: contextvars.ContextVar[SplitKScratch | None] = contextvars.ContextVar(
    "split_k_scratch", default=None)


@contextlib.contextmanager
def shared_split_k(scratch: SplitKScratch):
    """Ops prepared inside take their split-K workspace from `scratch`."""
    token = _installed.set(scratch)
    try:
        yield scratch
    finally:
        _installed.reset(token)


def installed_scratch() -> SplitKScratch | None:
    return _installed.get()
