"""The element types kernels read and write between the network's layers, as CUDA C.

Activations are float32, or fp16 where the next consumer is an fp16 convolution that reads them
as they are: the op (or conv) before it writes fp16 and no conversion pass runs between them.
"""

import numpy as np

# What a kernel reads and writes, as its IN_HALF / OUT_HALF compile-time switches.
FLOAT32, FLOAT16 = np.dtype(np.float32), np.dtype(np.float16)
ELEMENT_TYPES = (FLOAT32, FLOAT16)

# The fragment every op and the implicit-GEMM epilogue include. The arithmetic stays float32;
# PTX cvt converts (no header needed), rounding to nearest even as NumPy's and CuPy's astype do.
ELEMENT_SOURCE = r"""
#if IN_HALF
typedef unsigned short in_t;  // IEEE fp16 bits
#else
typedef float in_t;
#endif
#if OUT_HALF
typedef unsigned short out_t;
#else
typedef float out_t;
#endif

// fp16 bits as float32: the input's, and any other fp16 operand's (a residual add's kept one).
__device__ __forceinline__ float half_bits_to_float(unsigned short h)
{
    float v;
    asm("cvt.f32.f16 %0, %1;" : "=f"(v) : "h"(h));
    return v;
}

__device__ __forceinline__ float to_float(in_t e)
{
#if IN_HALF
    return half_bits_to_float(e);
#else
    return e;
#endif
}

__device__ __forceinline__ float load_in(const in_t* __restrict__ p)
{
    return to_float(__ldg(p));
}

// OUT_TF32 (a kernel whose float32 output a next tf32 wgmma may read): the output rounded to
// TF32, to nearest. wgmma drops an operand's low 13 bits, which errs toward zero on every
// input; a rounded operand is read exact, its rounding unbiased. On ResNet-50 in tf32 at batch
// 128, 3 of 128 images' top-1 differed from float64 with the truncation, none rounded (H200,
// 2026-11-28, results/h200/resnet50-tf32-fused-adds-20261128/). The rounding adds at most
// 2^-11 |y|, and |y| is at most the check's magnitude (sum|x*w|, plus |b| and the kept
// activation's where the epilogue adds them): under 1/8 of the tf32 bound at any n.
__device__ __forceinline__ out_t to_out(float v)
{
#if OUT_HALF
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
#elif OUT_TF32
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return __uint_as_float(r);
#else
    return v;
#endif
}
"""


def element_defines(in_dtype=FLOAT32, out_dtype=FLOAT32) -> dict[str, int]:
    """IN_HALF / OUT_HALF for a kernel reading `in_dtype` and writing `out_dtype`."""
    for dtype in (in_dtype, out_dtype):
        if np.dtype(dtype) not in ELEMENT_TYPES:
            raise ValueError(f"kernels read and write {' or '.join(map(str, ELEMENT_TYPES))}, "
                             f"not {np.dtype(dtype)}")
    return {"IN_HALF": int(np.dtype(in_dtype) == FLOAT16),
            "OUT_HALF": int(np.dtype(out_dtype) == FLOAT16)}

# The staged element types (staging and ingest kernels): MODE 1 fp16, 2 bf16 bits; any other
# maths reads float32.
STAGE_MODES = {"fp16": 1, "bf16": 2}

STAGE_ELEMENT_SOURCE = r"""
// MODE: 0 float32, 1 fp16 rounded to nearest even, 2 bf16 bits, the same.
#if MODE == 0
typedef float elem_t;
#define ELEM_BYTES 4
#else
typedef unsigned short elem_t;
#define ELEM_BYTES 2
#endif
__device__ __forceinline__ elem_t convert(float f)
{
#if MODE == 0
    return f;
#elif MODE == 1
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    const unsigned u = __float_as_uint(f);
    return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
#endif
}
"""
