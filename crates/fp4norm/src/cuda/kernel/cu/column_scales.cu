// The column-scales pass (FP4_KIND 5), fp8_column_scales: the second kernel of a split
// column-major write (FP8_COL_SPLIT in the fused kernel). The fused kernel left the f32
// scales of each tile of 8 rows x COL_TILE_G groups in the tile's staging order
// (col_staged_offset, common.cuh), one coalesced store per warp and row where the layout
// [H/G, mp4] wants a 4-byte store per scale; here each thread writes one 32-byte line of
// a tile (one group's 8 rows) in place, from the 8 words it read of the staging order.
// A tile's lanes are neighbours, and so are neighbouring tiles', so that each 4-byte load
// of a warp reads every tile's staged words side by side (32 contiguous bytes a tile with
// groups of 32, 16 with 64) and each line is a 32-byte store of its own. A tile is read by its own lanes only, all before any writes
// (one warp, __syncwarp). Rows of the last, partial tile (M not a multiple of 8) and the
// padding rows were written in place by the fused kernel and are not touched. Launched
// right after the fused kernel, with programmatic dependent launch where the GPU has it.
// The configuration macros are listed in common.cuh.

#include "common.cuh"

#if FP4_KIND != 5
#error "column_scales.cu is the FP4_KIND 5 kernel"
#endif

struct Fp8ColumnScalesParams {
    u32* sf;  // [NB, mp4] f32 scales
    i64 m;
};

extern "C" __global__ void __launch_bounds__(256) fp8_column_scales(const Fp8ColumnScalesParams p) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    static_assert(32 % COL_TILE_G == 0, "a warp holds whole tiles");
    const i64 mp4 = (p.m + 3) & ~3ll;
    const i64 row_tiles = p.m / 8;
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 tile_index = t / COL_TILE_G;  // (a warp's tiles are whole: COL_TILE_G | 32)
    const int j = (int)(t % COL_TILE_G);    // this lane's group of the tile
    const bool live = tile_index < row_tiles * (NB / COL_TILE_G);
    const i64 band = tile_index / row_tiles;  // the tile's groups: band * COL_TILE_G ...
    u32* tile = p.sf + band * COL_TILE_G * mp4 + (tile_index % row_tiles) * 8;
    // Row r of group j: word k = r * COL_TILE_G + j of the staging order (col_staged_offset).
    u32 w[8];
    if (live) {
#pragma unroll
        for (int r = 0; r < 8; ++r) w[r] = tile[col_staged_offset(r, j, mp4)];
    }
    __syncwarp();  // every lane of the warp has read its tile's words before any writes
    if (!live) return;
    u32* line = tile + j * mp4;
    if (((u64)p.sf & 15u) == 0) {  // lines are mp4 * 4 bytes (16 | that), tiles 32 bytes apart
        *reinterpret_cast<uint4*>(line) = make_uint4(w[0], w[1], w[2], w[3]);
        *reinterpret_cast<uint4*>(line + 4) = make_uint4(w[4], w[5], w[6], w[7]);
    } else {
#pragma unroll
        for (int r = 0; r < 8; ++r) line[r] = w[r];
    }
}
