"""Hopper's warpgroup MMA (`wgmma`, sm_90a) as CUDA C helpers: shared-memory descriptors for the
128-byte swizzle, the fences and group waits, and `wgmma_tile` for each N and element type. The
wgmma conv mainloop (kernels/igemm/wgmma.py) and the ceiling that measures the instruction's
rate (peaks.py) both include them. The tile helpers take the accumulators as an
[MF][NF][4] array (MF = 1, NF = N/8): what a warp of the group holds, laid out as a 16xN
mma.sync warp tile; scale_d 0 starts a fresh sum (D = A*B) instead of accumulating.

WGMMA_N (default BN) picks the tile's N; an N that is not a multiple of 32 (the halo schedule's)
is WGMMA_N + WGMMA_TAIL, the tail (8, 16 or 24) a second instruction, `wgmma_tail`, into the
accumulators' last WGMMA_TAIL columns: the 24 functions of every N in 8s would be 185 KB of
source for the compiler to read each time."""

WGMMA_NS = tuple(range(32, 257, 32))
WGMMA_TAILS = (8, 16, 24)
WGMMA_TYPES = {0: ("tf32", 8), 2: ("f16", 16), 3: ("bf16", 16)}


def wgmma_function(n: int, mode: int, tail: bool = False, cross: bool = False) -> str:
    """wgmma_tile for an m64nNk(8|16) product of MODE's type (TF32 also serves 3xTF32, MODE 1),
    or with `tail` wgmma_tail, the same into the last N/8 accumulator fragments, or with
    `cross` wgmma_cross, the BF16 product of 3xTF32's cross terms under CROSS_BF16."""
    kind, k = WGMMA_TYPES[mode]
    modes = "(MODE == 0 || MODE == 1)" if kind == "tf32" else f"MODE == {mode}"
    if cross:
        modes = "MODE == 1 && CROSS_BF16"
    regs = n // 2
    d = ", ".join(f"%{i}" for i in range(regs))
    immediates = "1, 1" if kind == "tf32" else "1, 1, 0, 0"  # scales; K-major A and B
    first = f"NF - {n // 8} + " if tail else ""
    outputs = ", ".join(f'"+f"(d[0][{first}{i // 4}][{i % 4}])' for i in range(regs))
    name, which = ("wgmma_tail", "WGMMA_TAIL") if tail else ("wgmma_tile", "WGMMA_N")
    if cross:
        name = "wgmma_cross"
    return (f"#if {which} == {n} && {modes}\n"
            f"__device__ __forceinline__ void {name}(float (&d)[MF][NF][4], "
            "unsigned long long da, unsigned long long db, int scale_d = 1)\n{\n"
            '    asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, %' + str(regs + 2) + ', 0;\\n"\n'
            f'        "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{kind}.{kind} "\n'
            f'        "{{{d}}}, %{regs}, %{regs + 1}, p, {immediates};\\n}}\\n"\n'
            f'        : {outputs}\n'
            '        : "l"(da), "l"(db), "r"(scale_d));\n}\n#endif\n')


WGMMA_PTX = r"""
#ifndef WGMMA_N
#define WGMMA_N BN
#define WGMMA_TAIL 0
#endif
#ifndef CROSS_BF16
#define CROSS_BF16 0
#endif
// A shared-memory matrix descriptor for a K-major operand in 128-byte-swizzle layout: start
// address, leading-byte offset (unused by this layout: 1), stride-byte offset 1024 (from one
// 8-row group of 128-byte rows to the next), swizzle mode 1 (128 B) in bits 62-63.
__device__ __forceinline__ unsigned long long swizzle128_desc(unsigned addr)
{
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16)
           | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

// Orders this thread's register accesses to the accumulators before the wgmmas that follow.
__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}

// cp.async fills shared memory through the generic proxy; wgmma reads it through the async
// proxy: each writing thread fences before the barrier that publishes the tile.
__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Keeps the compiler from moving accumulator reads or writes across a wgmma wait.
__device__ __forceinline__ void fence_operands(float (&d)[MF][NF][4])
{
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[0][j][e]) :: "memory");
}
""" + "".join(wgmma_function(n, mode) for mode in WGMMA_TYPES for n in WGMMA_NS) + "".join(
    wgmma_function(n, mode, tail=True) for mode in WGMMA_TYPES for n in WGMMA_TAILS) + "".join(
    wgmma_function(n, 3, cross=True) for n in WGMMA_NS)
