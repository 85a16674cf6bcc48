"""Hopper's warpgroup MMA (`wgmma`, sm_90a) as CUDA C pieces that compile alone: shared-memory
descriptors for the 128-byte swizzle, the fences and group waits, and `WgmmaOp<N, Element>`, one
m64nNk(8|16) product of an element type (`Tf32`, `F16`, `Bf16`) into a warp's accumulators. The
wgmma conv mainloop (kernels/igemm/wgmma.py) and the ceiling that measures the instruction's rate
(peaks.py) both include them. Accumulators are an [MF][NF][4] array (MF = 1, NF = N/8): what a
warp of the group holds, laid out as a 16xN mma.sync warp tile; `mma<First>` writes fragments
First..First + N/8 - 1 (a halo tile's tail goes after its multiple of 32); scale_d 0 starts a
fresh sum (D = A*B) instead of accumulating.

Every N in 32s from 32 to 256, and the tails 8, 16 and 24 (the halo schedule's N is any multiple
of 8: a multiple of 32 and a tail), is a specialisation: the 24 of every N in 8s would be 185 KB
of source for the compiler to read each time."""

WGMMA_NS = tuple(range(32, 257, 32))
WGMMA_TAILS = (8, 16, 24)
WGMMA_ELEMENTS = {"tf32": ("Tf32", 8), "f16": ("F16", 16), "bf16": ("Bf16", 16)}


def wgmma_specialisation(n: int, kind: str) -> str:
    """WgmmaOp<n, Element>: the m64nNk(8|16) product of `kind`'s operands (PTX's type name)."""
    element, k = WGMMA_ELEMENTS[kind]
    regs = n // 2
    d = ", ".join(f"%{i}" for i in range(regs))
    immediates = "1, 1" if kind == "tf32" else "1, 1, 0, 0"  # scales; K-major A and B
    outputs = ", ".join(f'"+f"(d[0][First + {i // 4}][{i % 4}])' for i in range(regs))
    return (f"template <> struct WgmmaOp<{n}, {element}> {{\n"
            "    template <int First, int MFrags, int NFrags>\n"
            "    __device__ __forceinline__ static void mma(float (&d)[MFrags][NFrags][4], "
            "unsigned long long da, unsigned long long db, int scale_d)\n    {\n"
            '        asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, %' + str(regs + 2)
            + ', 0;\\n"\n'
            f'            "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{kind}.{kind} "\n'
            f'            "{{{d}}}, %{regs}, %{regs + 1}, p, {immediates};\\n}}\\n"\n'
            f'            : {outputs}\n'
            '            : "l"(da), "l"(db), "r"(scale_d));\n    }\n};\n')


WGMMA_PTX = r"""
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
template <int MFrags, int NFrags>
__device__ __forceinline__ void fence_operands(float (&d)[MFrags][NFrags][4])
{
#pragma unroll
    for (int j = 0; j < NFrags; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[0][j][e]) :: "memory");
}

// The operands' element types, and the one each MODE multiplies in (3xTF32, MODE 1, in TF32).
struct Tf32 {};
struct F16 {};
struct Bf16 {};
template <int Mode> struct ModeElement { using type = Tf32; };
template <> struct ModeElement<2> { using type = F16; };
template <> struct ModeElement<3> { using type = Bf16; };

template <int N, class Element> struct WgmmaOp;
""" + "".join(wgmma_specialisation(n, kind) for kind in WGMMA_ELEMENTS
              for n in WGMMA_TAILS + WGMMA_NS)
