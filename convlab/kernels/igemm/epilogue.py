"""The epilogue: the accumulators through shared memory so stores are coalesced, then bias and
ReLU by the ladder's shared `finish_output` (general.EPILOGUE_SOURCE), stored as float32 or fp16
(gpu.elements' `to_out`, OUT_HALF). NCHW stores: a warp per
output channel row, lanes along consecutive pixels; NHWC stores: a warp per pixel, lanes along
consecutive output channels. The wgmma kernel's warp-specialised schedules store straight from
the registers instead (STORE_REGISTERS_NHWC)."""

STORE_NCHW = r"""
    // Accumulator (i, j) element e: row 16i + g + 8*(e/2), column 8j + 2t + e%2 of the warp tile.
    float* cs = smem;
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j) {
            const int row = wm * WM + i * 16 + g8, col = wn * WN + j * 8 + 2 * t4;
            float2* upper = reinterpret_cast<float2*>(cs + row * C_LD + col);
            float2* lower = reinterpret_cast<float2*>(cs + (row + 8) * C_LD + col);
            *upper = make_float2(acc[i][j][0], acc[i][j][1]);
            *lower = make_float2(acc[i][j][2], acc[i][j][3]);
        }
    __syncthreads();

    // A warp stores one channel row at a time, lanes along consecutive pixels.
    long long yoff[BN / 32];
#pragma unroll
    for (int i = 0; i < BN / 32; ++i) {
        const int n = ntile * BN + lane + 32 * i;
        if (n < npix) {
            const int b = n / HWO;
            yoff[i] = ((long long)b * M + group * MG) * HWO + (n - b * HWO);
        } else {
            yoff[i] = -1;
        }
    }
    for (int m = warp; m < BM; m += NWARPS) {
        const int mg = mtile * BM + m;
        if (mg >= MG) break;
#pragma unroll
        for (int i = 0; i < BN / 32; ++i) {
            if (yoff[i] < 0) continue;
            y[yoff[i] + (long long)mg * HWO] =
                to_out(finish_output(cs[m * C_LD + lane + 32 * i], bias, group * MG + mg));
        }
    }
}
"""

STORE_NHWC = r"""
    // C staged transposed, [n][m] (C_LD = BM + 4): the fragment writes of a warp hit 32 banks,
    // and each pixel's output channels are contiguous for the stores.
    float* cs = smem;
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j) {
            const int row = wm * WM + i * 16 + g8, col = wn * WN + j * 8 + 2 * t4;
            cs[col * C_LD + row] = acc[i][j][0];
            cs[(col + 1) * C_LD + row] = acc[i][j][1];
            cs[col * C_LD + row + 8] = acc[i][j][2];
            cs[(col + 1) * C_LD + row + 8] = acc[i][j][3];
        }
    __syncthreads();

    // A warp stores one pixel at a time, lanes along consecutive output channels.
    for (int n = warp; n < BN; n += NWARPS) {
        const int pix = ntile * BN + n;
        if (pix >= npix) break;
        out_t* yrow = y + (long long)pix * M + group * MG;
#pragma unroll
        for (int m = lane; m < BM; m += 32) {
            const int mg = mtile * BM + m;
            if (mg < MG) yrow[mg] = to_out(finish_output(cs[n * C_LD + m], bias, group * MG + mg));
        }
    }
}
"""

# The warp-specialised wgmma schedules' store, straight from the MMA warps' accumulators (no C
# tile in shared memory: the stages hold the next tile's operands meanwhile). Before the
# macro the kernel defines `ytile`, its tile's first output pixel at the tile's first output
# channel, and `pixel(q, at)`: whether the tile's GEMM column q is an output, and the element
# offset of its channel row from ytile. Each thread holds two output channels and, per
# n-block, two columns: their bias is read once a tile and each column's address is reckoned
# once for both channels. Both schedules had a copy of this loop reading the bias and forming
# a 64-bit address per element, about 13 instructions an output (SASS of the VGG 3x3 tiles);
# this one takes half that. On an H100 it timed the same (session 19, within 1% on six
# layers): the stores are not what bounds these kernels.
STORE_REGISTERS_NHWC = r"""
        {
            const int m0 = mtile * BM + 16 * warp + g8;
            const bool first = MG % BM == 0 || m0 < MG, second = MG % BM == 0 || m0 + 8 < MG;
            float b0 = 0.0f, b1 = 0.0f;
#if HAS_BIAS
            if (first) b0 = __ldg(bias + group * MG + m0);
            if (second) b1 = __ldg(bias + group * MG + m0 + 8);
#endif
            out_t* const yc = ytile + 16 * warp + g8;
            // Element e of n-block f: channel m0 + 8*(e/2), column 8f + 2*t4 + e%2.
#pragma unroll
            for (int f = 0; f < NF; ++f)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    unsigned at;
                    if (pixel(8 * f + 2 * t4 + h, at)) {
                        out_t* const p = yc + at;
                        if (first) p[0] = to_out(finish_value(acc[0][f][h], b0));
                        if (second) p[8] = to_out(finish_value(acc[0][f][2 + h], b1));
                    }
                }
        }
"""
