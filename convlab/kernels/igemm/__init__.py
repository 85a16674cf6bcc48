"""The pieces the pipelined implicit-GEMM variants are built from, along CUTLASS's seams.

Device source, composed into one kernel in `kernels/pipelined.py` (the order is the kernel's):
`mainloop` (geometry macros, the PTX instructions, the grid schedule's kernel template and the
kernel's entry, the A copy, the MMA K-step and the cp.async pipeline), `tile_walks` (which tile
and K-tiles a block computes: the grid, persistent and halo schedules' walks), `gather` (the
im2col B operand, `NchwGather`: per-tap or through an offset table, and the host's table),
`splitk` (the in-kernel reduction of K-split partial tiles) and `epilogue` (`StagedStore`: the C
tile through shared memory, bias, ReLU and the kept activation, NCHW or NHWC stores; and the
warp-specialised schedules' store from the registers, `store_registers_nhwc`); the channels-last
and Hopper kernels swap in `gather_nhwc`, `staging`, `wgmma` (warpgroup MMAs on swizzled shared
memory), `persistent` (its persistent, warp-specialised schedule's kernel template) and `halo`
(that schedule reading every tap's B out of one input patch per tile: its kernel template and
the rules of its tilings). Host side: `tiling` (the Tiling config and its rules), `packing`
(filters in fragment order, staged fp16/bf16 inputs) and `cost` (the model that ranks tilings
for a layer).
"""
