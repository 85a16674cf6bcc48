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
of source for the compiler to read each time. `WgmmaRegA<N, Element>` is the same product with A
from registers (N in 32s; TF32 and BF16 only), for the fp32 class's filters split in the MMA
threads."""

WGMMA_NS = tuple(range(32, 257, 32))
WGMMA_TAILS = (8, 16, 24)
WGMMA_ELEMENTS = {"tf32": ("Tf32", 8), "f16": ("F16", 16), "bf16": ("Bf16", 16)}
# The element types whose products also take A from registers (WgmmaRegA): the fp32 class's,
# whose filters are split into TF32 and BF16 parts in the MMA threads' registers.
REGISTER_A_ELEMENTS = ("tf32", "bf16")


def wgmma_specialisation(n: int, kind: str, a_in_registers: bool = False) -> str:
    """WgmmaOp<n, Element>: the m64nNk(8|16) product of `kind`'s operands (PTX's type name), both
    by descriptor; a_in_registers, WgmmaRegA<n, Element>: A from registers (four 32-bit
    registers a thread, its warp's 16 rows of the 64 as an mma.sync m16n8k(8|16) A fragment)."""
    element, k = WGMMA_ELEMENTS[kind]
    regs = n // 2
    d = ", ".join(f"%{i}" for i in range(regs))
    outputs = ", ".join(f'"+f"(d[0][First + {i // 4}][{i % 4}])' for i in range(regs))
    if a_in_registers:
        name, a_type, a_inputs = "WgmmaRegA", "const unsigned (&a)[4]", 4
        a = "{" + ", ".join(f"%{regs + i}" for i in range(4)) + "}"
        inputs = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), '
        transposes = "" if kind == "tf32" else ", 0"  # K-major B
    else:
        name, a_type, a_inputs = "WgmmaOp", "unsigned long long da", 1
        a = f"%{regs}"
        inputs = '"l"(da), '
        transposes = "" if kind == "tf32" else ", 0, 0"  # K-major A and B
    return (f"template <> struct {name}<{n}, {element}> {{\n"
            "    template <int First, int MFrags, int NFrags>\n"
            "    __device__ __forceinline__ static void mma(float (&d)[MFrags][NFrags][4], "
            f"{a_type}, unsigned long long db, int scale_d)\n    {{\n"
            '        asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, %'
            + str(regs + a_inputs + 1) + ', 0;\\n"\n'
            f'            "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{kind}.{kind} "\n'
            f'            "{{{d}}}, {a}, %{regs + a_inputs}, p, 1, 1{transposes};\\n}}\\n"\n'
            f'            : {outputs}\n'
            f'            : {inputs}"l"(db), "r"(scale_d));\n    }}\n}};\n')


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
template <int N, class Element> struct WgmmaRegA;
""" + "".join(wgmma_specialisation(n, kind) for kind in WGMMA_ELEMENTS
              for n in WGMMA_TAILS + WGMMA_NS) + "".join(
    wgmma_specialisation(n, kind, a_in_registers=True) for kind in REGISTER_A_ELEMENTS
    for n in WGMMA_NS)
