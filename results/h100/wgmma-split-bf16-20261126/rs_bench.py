"""Session 23: what bounds 3xTF32 on wgmma, with no copies at all. One block per SM of two MMA
warpgroups (as the persistent 128x128 tiling), a 'K-tile' of 4 k-steps read from a fixed shared
tile, for `iters` K-tiles; TFLOP/s of tensor FLOPs issued (3 products a step count 3x).
  ss1_256: one product, m64n256k8, A and B from shared memory (the ceiling's instruction)
  ss1_128: one product, m64n128k8 (3xTF32's tile width)
  ss3_part: 3 products a step into a K-tile partial sum, wait_group 0 and FP32 adds a K-tile (today's)
  ss3_chain: 3 products chained into one sum, wait_group 1 (no drains: the SS upper bound)
  rs1_128: one product, A from registers
  rs3_part: 3 products, A's big and small parts from registers, partial sum a K-tile
  rs3_lds: as rs3_part, A loaded from the swizzled shared tile and split in registers each K-tile
Usage: python rs_bench.py [--check]  (--check: compile only, print ptxas's notes)"""
import sys
import numpy as np

from convlab.gpu.hopper import WGMMA_PTX

HEAD = r"""
#define MF 1
#define NF (BN / 8)
#define MODE 0
__device__ __forceinline__ unsigned smem_u32(const void* p)
{ return (unsigned)__cvta_generic_to_shared(p); }
""" + WGMMA_PTX.replace("#ifndef WGMMA_N\n#define WGMMA_N BN\n#define WGMMA_TAIL 0\n#endif", "#define WGMMA_N BN\n#define WGMMA_TAIL 0") + r"""
__device__ __forceinline__ unsigned to_tf32(float x)
{ unsigned r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r; }
"""

def rs_function(n):
    regs = n // 2
    d = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[0][{i // 4}][{i % 4}])' for i in range(regs))
    return ("__device__ __forceinline__ void wgmma_rs(float (&d)[MF][NF][4], const unsigned (&a)[4], "
            "unsigned long long db, int scale_d = 1)\n{\n"
            '    asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, %' + str(regs + 5) + ', 0;\\n"\n'
            f'        "wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 "\n'
            f'        "{{{d}}}, {{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}, %{regs + 4}, p, 1, 1;\\n}}\\n"\n'
            f'        : {outs}\n'
            '        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));\n}\n')

BODY = r"""
extern "C" __global__ void __launch_bounds__(256, 1) bench(float* out, int iters)
{
    extern __shared__ __align__(1024) unsigned char raw[];
    unsigned* tile = (unsigned*)(((unsigned long long)raw + 1023) & ~1023ull);
    // A big (128 rows), A small (128), B big (BN rows), B small (BN), rows of 128 B
    const int words = (256 + 2 * BN) * 32;
    for (int i = threadIdx.x; i < words; i += 256)
        tile[i] = __float_as_uint(1.0f + (i % 7) * 0.125f + (i % 3) * 1e-5f);
    fence_proxy_async();
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const unsigned base = smem_u32(tile);
    const unsigned sa = base + (warp / 4) * 64 * 128, sal = sa + 128 * 128;
    const unsigned sb = base + 256 * 128, sbl = sb + BN * 128;
    float acc[MF][NF][4], part[MF][NF][4];
    for (int j = 0; j < NF; ++j) for (int e = 0; e < 4; ++e) acc[0][j][e] = part[0][j][e] = 0.0f;
    fence_operands(acc); fence_operands(part);
#if KIND >= 4
    // A fragments of the warp's 16 rows: (g, t), (g+8, t), (g, t+4), (g+8, t+4) of each k-step
    unsigned ahi[4][4], alo[4][4];
    const int r0 = (warp % 4) * 16 + g;
    auto load_a = [&]() {
#pragma unroll
        for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int m = r0 + (q & 1) * 8, k = s * 8 + t + (q >> 1) * 4;
                const unsigned addr = sa + m * 128 + ((((k * 4) >> 4) ^ (m % 8)) << 4) + (k * 4) % 16;
                float v;
                asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr));
                ahi[s][q] = to_tf32(v);
                alo[s][q] = to_tf32(v - __uint_as_float(ahi[s][q]));
            }
    };
    load_a();
#endif
    for (int it = 0; it < iters; ++it) {
#if KIND == 6
        load_a();
#endif
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s) {
#if KIND == 0 || KIND == 1
            wgmma_tile(acc, swizzle128_desc(sa + s * 32), swizzle128_desc(sb + s * 32));
#elif KIND == 2
            wgmma_tile(part, swizzle128_desc(sal + s * 32), swizzle128_desc(sb + s * 32), s > 0);
            wgmma_tile(part, swizzle128_desc(sa + s * 32), swizzle128_desc(sbl + s * 32));
            wgmma_tile(part, swizzle128_desc(sa + s * 32), swizzle128_desc(sb + s * 32));
#elif KIND == 3
            wgmma_tile(acc, swizzle128_desc(sal + s * 32), swizzle128_desc(sb + s * 32));
            wgmma_tile(acc, swizzle128_desc(sa + s * 32), swizzle128_desc(sbl + s * 32));
            wgmma_tile(acc, swizzle128_desc(sa + s * 32), swizzle128_desc(sb + s * 32));
#elif KIND == 4
            wgmma_rs(acc, ahi[s], swizzle128_desc(sb + s * 32));
#else
            wgmma_rs(part, alo[s], swizzle128_desc(sb + s * 32), s > 0);
            wgmma_rs(part, ahi[s], swizzle128_desc(sbl + s * 32));
            wgmma_rs(part, ahi[s], swizzle128_desc(sb + s * 32));
#endif
        }
        wgmma_commit();
#if KIND == 2 || KIND >= 5
        wgmma_wait<0>();
        fence_operands(part);
        for (int j = 0; j < NF; ++j) for (int e = 0; e < 4; ++e) acc[0][j][e] += part[0][j][e];
#else
        wgmma_wait<1>();
#endif
    }
    wgmma_wait<0>();
    fence_operands(acc);
    float sum = 0.0f;
    for (int j = 0; j < NF; ++j) for (int e = 0; e < 4; ++e) sum += acc[0][j][e];
    out[blockIdx.x * 256 + threadIdx.x] = sum;
}
"""
KINDS = {"ss1_256": (0, 256, 1), "ss1_128": (1, 128, 1), "ss3_part": (2, 128, 3),
         "ss3_chain": (3, 128, 3), "rs1_128": (4, 128, 1), "rs3_part": (5, 128, 3),
         "rs3_lds": (6, 128, 3)}


def source(kind, bn):
    return f"#define KIND {kind}\n#define BN {bn}\n" + HEAD + rs_function(bn) + BODY


if __name__ == "__main__":
    if "--check" in sys.argv:
        from convlab.gpu import jit
        for name, (kind, bn, _) in KINDS.items():
            r = jit.nvrtc_compile("b.cu", source(kind, bn), ("-std=c++17", "-Xptxas=-v"), "sm_90a")
            print(name, r.cubin is not None, [l for l in r.log.splitlines() if "C75" in l or "error" in l or "registers" in l][:3])
        sys.exit()
    import cupy
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    out = cupy.empty(sms * 256, dtype=cupy.float32)
    for name, (kind, bn, products) in KINDS.items():
        mod = cupy.RawModule(code=source(kind, bn), options=("-std=c++17", "-arch=sm_90a"))
        k = mod.get_function("bench")
        smem = (256 + 2 * bn) * 128 + 1024
        k.max_dynamic_shared_size_bytes = smem
        iters = 2048
        for _ in range(2):
            k((sms,), (256,), (out, np.int32(iters)), shared_mem=smem)
        times = []
        for _ in range(7):
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            a.record(); k((sms,), (256,), (out, np.int32(iters)), shared_mem=smem); b.record(); b.synchronize()
            times.append(cupy.cuda.get_elapsed_time(a, b))
        ms = float(np.median(times))
        flops = sms * 2 * iters * 4 * products * 2 * 64 * bn * 8
        print(f"BENCH {name:10} {ms:8.3f} ms  {flops / ms / 1e9:7.1f} TFLOP/s issued  "
              f"(per product-equivalent {flops / products / ms / 1e9:6.1f})", flush=True)
