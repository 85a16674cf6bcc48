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
// split-K; under stream-K, which piece); `tile` numbers its walk's tiles (a walk's `slot`
// numbers the tile's split-K arrival count and, but under stream-K, its partial tiles).
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

    // A split tile's pieces: its K-splits, each with a partial tile of its own in the
    // workspace.
    enum : bool { splits = SplitK > 1 };
    __device__ __forceinline__ int pieces(const TileUnit&) const { return SplitK; }
    __device__ __forceinline__ long long part(const TileUnit& t, int s) const
    {
        return slot(t) * SplitK + s;
    }
};

// The stream-K schedule (Osama et al., "Stream-K", PPoPP 2023; CUTLASS's stream-K scheduler
// with its data-parallel waves): where a layer's tiles do not fill the GPU's slots in whole
// waves (160 tiles on 132 slots run as two waves, 28 slots doing twice the others' work),
// every wave but the last two runs whole tiles as PersistentWalk does (block b takes tiles b,
// b + G, ...), and the rest, between one and two waves of tiles, are stream-K's: their
// K-tiles, tile by tile (m fastest, then pixels, then groups), are cut into gridDim.x runs of
// equal length, block b taking run b, floor(b I / G) .. floor((b + 1) I / G) - 1 of the I.
// A run's units are its pieces of tiles: its first and last may be part of a tile whose
// other pieces other blocks hold, the rest are whole. A tile's pieces meet as K-splits do
// (splitk.SPLIT_K_LAST): each writes its partial tile, the last to arrive adds them in piece
// order, so no block waits for another. A block holds at most two pieces of tiles it shares
// (its run's first unit and last), so their partial tiles live in two slots a block, 2 G in
// all, whatever the batch. The host launches at most one block a stream-K K-tile. `units` is
// where this block's run ends; a unit's number is its first K-tile's in the list of all.
template <int MTiles, int KTiles, int Groups, int BlockN>
struct StreamKWalk {
    int ntiles, whole, units, begin;  // whole: the tiles before the stream-K ones
    long long iterations;             // the stream-K tiles' K-tiles

    __device__ __forceinline__ explicit StreamKWalk(int npix)
        : ntiles((npix + BlockN - 1) / BlockN)
    {
        const int tiles = Groups * MTiles * ntiles;  // < 2^31 K-tiles, checked by the host
        const int waves = tiles / (int)gridDim.x;
        whole = waves > 1 ? (waves - 1) * (int)gridDim.x : 0;
        iterations = (long long)(tiles - whole) * KTiles;
        begin = whole * KTiles + run_begin(blockIdx.x);
        units = whole * KTiles + run_begin(blockIdx.x + 1);
    }

    __device__ __forceinline__ int run_begin(int b) const
    {
        return (int)(iterations * b / gridDim.x);
    }

    // The block whose run holds K-tile i of the list (i past the whole tiles').
    __device__ __forceinline__ int owner(int i) const
    {
        return (int)(((long long)(i - whole * KTiles + 1) * gridDim.x - 1) / iterations);
    }

    __device__ __forceinline__ int first() const
    {
        return (int)blockIdx.x < whole ? (int)blockIdx.x * KTiles : begin;
    }

    __device__ __forceinline__ int next(int u) const
    {
        if (u < whole * KTiles) {
            const int v = u + (int)gridDim.x * KTiles;
            return v < whole * KTiles ? v : begin;
        }
        return (u / KTiles + 1) * KTiles;
    }

    __device__ __forceinline__ TileUnit unit(int u) const
    {
        TileUnit t;
        t.tile = u / KTiles;
        t.kbeg = u - t.tile * KTiles;
        t.kend = t.tile < whole ? KTiles : min(KTiles, units - t.tile * KTiles);
        t.split = t.tile < whole ? 0 : (int)blockIdx.x - owner(t.tile * KTiles);
        t.mtile = t.tile % MTiles;
        t.ntile = (t.tile / MTiles) % ntiles;
        t.group = t.tile / (MTiles * ntiles);
        t.image = t.h0 = 0;
        return t;
    }

    __device__ __forceinline__ long long slot(const TileUnit& t) const { return t.tile; }

    enum : bool { splits = true };
    __device__ __forceinline__ int pieces(const TileUnit& t) const
    {
        if (t.tile < whole) return 1;
        const int k0 = t.tile * KTiles;
        return owner(k0 + KTiles - 1) - owner(k0) + 1;
    }

    // Piece s's partial tile: the first slot of the block that holds it where the tile is the
    // first of that block's run, else its second.
    __device__ __forceinline__ long long part(const TileUnit& t, int s) const
    {
        const int b = owner(t.tile * KTiles) + s;
        return 2LL * b + (whole + run_begin(b) / KTiles != t.tile);
    }
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
