"""Split-K inside one launch: each split writes its partial tile, the last to arrive adds them
in split order (so the result does not depend on arrival order) and goes on to the epilogue."""

SPLIT_K_REDUCE = r"""
#if SPLIT_K > 1
    {
        // Each split writes its partial tile (thread-private order: coalesced, and read back by
        // the same thread of whichever block finishes last), then counts itself in. The last
        // one adds the partials in split order, so the result does not depend on arrival order.
        __shared__ int last;
        const long long tile_id = (long long)group * (gridDim.x / SPLIT_K) + tile;
        float* parts = ws + tile_id * (SPLIT_K * BM * BN);
        float* flat = &acc[0][0][0];
#pragma unroll
        for (int e = 0; e < MF * NF * 4; ++e)
            __stcg(parts + split * (BM * BN) + e * THREADS + tid, flat[e]);
        __threadfence();
        __syncthreads();
        if (tid == 0) last = atomicAdd(counters + tile_id, 1) == SPLIT_K - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
#pragma unroll
        for (int e = 0; e < MF * NF * 4; ++e) {
            float sum = 0.0f;
#pragma unroll
            for (int s = 0; s < SPLIT_K; ++s)
                sum += s == split ? flat[e] : __ldcg(parts + s * (BM * BN) + e * THREADS + tid);
            flat[e] = sum;
        }
        if (tid == 0) counters[tile_id] = 0;
    }
#endif
"""
