"""The tile schedulers' device side: which output tile, of which group, and which of its K-tiles
a block computes next. A schedule's walk hands out TileUnits; the gather, the mainloop, the
split-K meeting and the epilogue read the tile's coordinates from the unit (`unit.mtile`, ...),
not from blockIdx, so one set of pieces serves every schedule (CUTLASS's tile schedulers and
their work-tile info play the same part); only the grid schedule's pipelines reckon their K
range from the block's index (their comment says why). Each walk is a template over the
layer's constants, so this source compiles by itself (tests/test_wgmma.py). The kernel pieces
that read a unit find it as `unit`; the grid's split-K meeting (splitk.SPLIT_K_REDUCE) also
names the grid's walk type `Walk`."""

SOURCE = r"""
// K-tiles [kbeg, kend) of output tile `tile`: m-tile `mtile` (BM output channels of group
// `group`) by n-tile `ntile` (BN output pixels; the halo schedule's tiles are rows instead:
// `image`, from output row `h0`). `split` is which K-split of the tile it is (0 without
// split-K); `tile` numbers its walk's tiles (a walk's `slot` places the tile in the split-K
// workspace).
struct TileUnit {
    int split, tile, mtile, ntile, group, kbeg, kend;
    int image, h0;
};

template <int SplitK, int KTiles>
__device__ __forceinline__ int split_begin(int split)
{
    return (int)((long long)split * KTiles / SplitK);
}

// The grid schedule: one unit a block. blockIdx.x is its tile and split, splits fastest, then
// m-tiles (neighbours share their input tile in L2); blockIdx.y is its group. `tile` counts
// within the group. The grid's pipelines reckon the same K range as kbeg and kend themselves
// (mainloop.PIPELINE says why).
template <int SplitK, int MTiles, int KTiles>
struct GridWalk {
    static __device__ __forceinline__ TileUnit unit()
    {
        TileUnit u;
        u.split = blockIdx.x % SplitK;
        u.tile = blockIdx.x / SplitK;
        u.mtile = u.tile % MTiles;
        u.ntile = u.tile / MTiles;
        u.group = blockIdx.y;
        u.kbeg = split_begin<SplitK, KTiles>(u.split);
        u.kend = split_begin<SplitK, KTiles>(u.split + 1);
        u.image = u.h0 = 0;
        return u;
    }

    // Where the unit's tile keeps its split-K partial sums: tiles of every group in one list.
    static __device__ __forceinline__ long long slot(const TileUnit& u)
    {
        return (long long)u.group * (gridDim.x / SplitK) + u.tile;
    }
};

// The persistent schedule: block b walks units b, b + gridDim.x, ... of one list that both of
// its roles (loaders and MMA threads) walk alike. A unit is one K-split of one tile and a
// tile's splits are neighbours in the list, so they run at once and the last one's reads of
// the others' partial tiles find them in L2. Tiles go m fastest (neighbours share their input
// rows in L2), then pixels, then groups; in a two-block cluster (no split-K, an even count of
// m-tiles, an even grid) the blocks' units are m-tiles 2i and 2i + 1 of the same pixels.
// `tile` counts over every group.
template <int SplitK, int MTiles, int KTiles, int Groups, int BlockN>
struct PersistentWalk {
    int ntiles, units;

    __device__ __forceinline__ explicit PersistentWalk(int npix)
        : ntiles((npix + BlockN - 1) / BlockN),
          units(Groups * MTiles * ntiles * SplitK)  // < 2^31, checked by the host
    {
    }

    __device__ __forceinline__ int first() const { return blockIdx.x; }
    __device__ __forceinline__ int next(int u) const { return u + gridDim.x; }

    __device__ __forceinline__ TileUnit unit(int u) const
    {
        TileUnit t;
        t.split = u % SplitK;
        t.tile = u / SplitK;
        t.mtile = t.tile % MTiles;
        t.ntile = (t.tile / MTiles) % ntiles;
        t.group = t.tile / (MTiles * ntiles);
        t.kbeg = split_begin<SplitK, KTiles>(t.split);
        t.kend = split_begin<SplitK, KTiles>(t.split + 1);
        t.image = t.h0 = 0;
        return t;
    }

    __device__ __forceinline__ long long slot(const TileUnit& t) const { return t.tile; }
};

// The halo schedule: a tile is Rows whole output rows of one image. Tiles go (group, m-tile,
// image, row block); block b takes a contiguous run of them, so consecutive tiles share their
// filters (`filters`: the (group, m-tile) pair, which picks the A tiles) and their patches'
// edge rows. No split-K: a unit is a whole tile.
template <int MTiles, int KTiles, int Groups, int RowBlocks, int Rows>
struct HaloWalk {
    int ntiles, first, last;

    __device__ __forceinline__ explicit HaloWalk(int batch)
        : ntiles(batch * RowBlocks)
    {
        const long long tiles = (long long)Groups * MTiles * ntiles;  // < 2^31, checked by the host
        first = (int)(tiles * blockIdx.x / gridDim.x);
        last = (int)(tiles * (blockIdx.x + 1) / gridDim.x);
    }

    __device__ __forceinline__ int filters(int t) const { return t / ntiles; }

    __device__ __forceinline__ TileUnit unit(int t) const
    {
        TileUnit u;
        const int gm = filters(t);
        u.split = 0;
        u.tile = t;
        u.group = gm / MTiles;
        u.image = (t - gm * ntiles) / RowBlocks;
        u.h0 = (t - gm * ntiles - u.image * RowBlocks) * Rows;
        u.mtile = gm - u.group * MTiles;
        u.ntile = 0;
        u.kbeg = 0;
        u.kend = KTiles;
        return u;
    }
};
"""
