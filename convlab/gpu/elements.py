"""The element types kernels read and write between the network's layers, as CUDA C.

Activations are float32, or the 16-bit type of the class (fp16, or bf16 bits) where the next
consumer is a convolution of that class that reads them as they are: the op (or conv) before it
writes them so and no conversion pass runs between them.
"""

import numpy as np

# What a kernel reads and writes, as its IN_HALF / OUT_HALF compile-time switches (16-bit
# elements) and BF16_BITS (those are bf16 bits, not fp16). bf16 travels as its bit patterns:
# neither NumPy nor CuPy has a bfloat16 dtype, and uint16 means nothing else here.
FLOAT32, FLOAT16, BFLOAT16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.uint16)
ELEMENT_TYPES = (FLOAT32, FLOAT16, BFLOAT16)
HALF_TYPES = (FLOAT16, BFLOAT16)
# A bf16 NaN (exponent all ones, significand not zero), to poison a buffer of bf16 bits with.
BFLOAT16_NAN = 0x7FC0

# bf16 bit patterns (a float32's top half) to and from float32, rounding to nearest even as
# igemm.packing's to_bf16_bits does (finite values): one source for the kernels that write bf16
# activations and the ones that stage inputs, whose bits must agree.
BF16_SOURCE = r"""
__device__ __forceinline__ unsigned short float_to_bf16(float f)
{
    const unsigned u = __float_as_uint(f);
    return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float bf16_to_float(unsigned short h)
{
    return __uint_as_float((unsigned)h << 16);
}
"""

# The element types as types: each holds its storage (`bits`), its value as float32 (`value`)
# and a float32 rounded into it (`from`, to nearest even: NumPy's and CuPy's astype for fp16,
# igemm.packing's to_bf16_bits for bf16, finite values); the 16-bit ones also unpack a pair of
# them held in 32 bits (the first in the low half, the lower address). The arithmetic stays
# float32; PTX cvt converts (no header needed). ElementOf picks one from a kernel's switches.
ELEMENT_TYPES_SOURCE = BF16_SOURCE + r"""
struct Float32Element {
    typedef float bits;
    static __device__ __forceinline__ float value(float e) { return e; }
    static __device__ __forceinline__ float from(float v) { return v; }
};

// A float32 output a next tf32 wgmma may read (OUT_TF32), rounded to TF32, to nearest. wgmma
// drops an operand's low 13 bits, which errs toward zero on every input; a rounded operand is
// read exact, its rounding unbiased. On ResNet-50 in tf32 at batch 128, 3 of 128 images' top-1
// differed from float64 with the truncation, none rounded (H200, 2026-11-28,
// results/h200/resnet50-tf32-fused-adds-20261128/). The rounding adds at most 2^-11 |y|, and
// |y| is at most the check's magnitude (sum|x*w|, plus |b| and the kept activation's where the
// epilogue adds them): under 1/8 of the tf32 bound at any n.
struct Tf32RoundedElement {
    typedef float bits;
    static __device__ __forceinline__ float value(float e) { return e; }
    static __device__ __forceinline__ float from(float v)
    {
        unsigned r;
        asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
        return __uint_as_float(r);
    }
};

struct Fp16Element {
    typedef unsigned short bits;
    static __device__ __forceinline__ float value(unsigned short h)
    {
        float v;
        asm("cvt.f32.f16 %0, %1;" : "=f"(v) : "h"(h));
        return v;
    }
    static __device__ __forceinline__ unsigned short from(float v)
    {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
        return h;
    }
    static __device__ __forceinline__ void unpack(unsigned pair, float& lo, float& hi)
    {
        asm("{\n .reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}"
            : "=f"(lo), "=f"(hi) : "r"(pair));
    }
};

struct Bf16Element {
    typedef unsigned short bits;
    static __device__ __forceinline__ float value(unsigned short h) { return bf16_to_float(h); }
    static __device__ __forceinline__ unsigned short from(float v) { return float_to_bf16(v); }
    static __device__ __forceinline__ void unpack(unsigned pair, float& lo, float& hi)
    {
        lo = __uint_as_float(pair << 16);
        hi = __uint_as_float(pair & 0xFFFF0000u);
    }
};

// IsHalf: 16-bit (bf16 if IsBf16, else fp16); else float32, rounded to TF32 if IsTf32.
template <int IsHalf, int IsBf16, int IsTf32 = 0> struct ElementOf { typedef Float32Element type; };
template <int IsBf16> struct ElementOf<0, IsBf16, 1> { typedef Tf32RoundedElement type; };
template <int IsTf32> struct ElementOf<1, 0, IsTf32> { typedef Fp16Element type; };
template <int IsTf32> struct ElementOf<1, 1, IsTf32> { typedef Bf16Element type; };
"""

# The fragment every op and the implicit-GEMM epilogue include: this kernel's input, output and
# 16-bit types from its switches (IN_HALF, OUT_HALF, BF16_BITS; OUT_TF32), and the functions
# the kernels call them by. A kernel's 16-bit operands are all of one class's type: one network
# runs one class.
ELEMENT_SOURCE = ELEMENT_TYPES_SOURCE + r"""
#ifndef BF16_BITS
#define BF16_BITS 0
#endif
#ifndef OUT_TF32
#define OUT_TF32 0
#endif
typedef ElementOf<IN_HALF, BF16_BITS>::type InElement;
typedef ElementOf<OUT_HALF, BF16_BITS, OUT_TF32>::type OutElement;
typedef ElementOf<1, BF16_BITS>::type HalfElement;  // the input's, or a kept operand's
typedef InElement::bits in_t;
typedef OutElement::bits out_t;

__device__ __forceinline__ float half_bits_to_float(unsigned short h)
{
    return HalfElement::value(h);
}

__device__ __forceinline__ unsigned short float_to_half_bits(float v)
{
    return HalfElement::from(v);
}

__device__ __forceinline__ float to_float(in_t e)
{
    return InElement::value(e);
}

__device__ __forceinline__ float load_in(const in_t* __restrict__ p)
{
    return to_float(__ldg(p));
}

__device__ __forceinline__ out_t to_out(float v)
{
    return OutElement::from(v);
}
"""


def element_defines(in_dtype=FLOAT32, out_dtype=FLOAT32, *others) -> dict[str, int]:
    """IN_HALF / OUT_HALF / BF16_BITS for a kernel reading `in_dtype` and writing `out_dtype`
    (`others`: any further operand types it reads, a residual add's kept one)."""
    dtypes = [np.dtype(d) for d in (in_dtype, out_dtype, *others)]
    for dtype in dtypes:
        if dtype not in ELEMENT_TYPES:
            raise ValueError(f"kernels read and write {', '.join(map(type_name, ELEMENT_TYPES))}"
                             f", not {dtype}")
    if FLOAT16 in dtypes and BFLOAT16 in dtypes:
        raise ValueError("a kernel's 16-bit operands are all fp16 or all bf16, not both")
    return {"IN_HALF": int(dtypes[0] in HALF_TYPES), "OUT_HALF": int(dtypes[1] in HALF_TYPES),
            "BF16_BITS": int(BFLOAT16 in dtypes)}


def type_name(dtype) -> str:
    """How tables and messages name an element type: bf16 bits as bf16."""
    return "bf16" if np.dtype(dtype) == BFLOAT16 else str(np.dtype(dtype))


def values(a):
    """The element values of a host or device array: bf16 bits as float32 (exact), any other
    type as it is."""
    if a.dtype != BFLOAT16:
        return a
    return (a.astype(np.uint32) << 16).view(np.float32)


def poison_value(dtype) -> float | int:
    """A NaN of `dtype`, which no check passes: what a buffer is filled with before a launch."""
    return BFLOAT16_NAN if np.dtype(dtype) == BFLOAT16 else float("nan")

# The staged element types (staging and ingest kernels): MODE 1 fp16, 2 bf16 bits; any other
# maths reads float32.
STAGE_MODES = {"fp16": 1, "bf16": 2}

STAGE_ELEMENT_SOURCE = BF16_SOURCE + r"""
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
    return float_to_bf16(f);
#endif
}
"""
