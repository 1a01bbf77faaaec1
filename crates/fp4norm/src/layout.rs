//! Block-scale layouts (SPEC.md §3) and the buffer sizes every backend uses.

use crate::Error;

/// Where the block-scale codes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleLayout {
    /// `sf[M, H/B]`, one byte per block, rows one after another.
    RowMajor,
    /// The 128×4 tiled layout Blackwell block-scaled GEMMs read, padding zeroed.
    Swizzled,
    /// Both buffers, written from one pass.
    Both,
}

impl ScaleLayout {
    /// Every layout: row-major, swizzled, both.
    pub const ALL: [ScaleLayout; 3] = [
        ScaleLayout::RowMajor,
        ScaleLayout::Swizzled,
        ScaleLayout::Both,
    ];

    /// Whether the row-major buffer is written.
    pub fn has_row_major(self) -> bool {
        matches!(self, ScaleLayout::RowMajor | ScaleLayout::Both)
    }

    /// Whether the swizzled buffer is written.
    pub fn has_swizzled(self) -> bool {
        matches!(self, ScaleLayout::Swizzled | ScaleLayout::Both)
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            ScaleLayout::RowMajor => "row-major",
            ScaleLayout::Swizzled => "swizzled",
            ScaleLayout::Both => "both",
        }
    }
}

impl std::fmt::Display for ScaleLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ScaleLayout {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "row-major" | "rowmajor" | "row_major" | "linear" => Ok(ScaleLayout::RowMajor),
            "swizzled" | "128x4" => Ok(ScaleLayout::Swizzled),
            "both" => Ok(ScaleLayout::Both),
            _ => Err(Error::UnknownLayout(s.to_string())),
        }
    }
}

/// Rows in one swizzled tile.
pub const SWIZZLE_ROWS: usize = 128;
/// Block columns in one swizzled tile.
pub const SWIZZLE_COLS: usize = 4;
/// Bytes in one swizzled 128×4 tile.
pub const SWIZZLE_TILE_BYTES: usize = SWIZZLE_ROWS * SWIZZLE_COLS;

/// Number of 4-block column groups of the swizzled layout: `nK = ceil(n_blocks / 4)`.
pub fn swizzled_col_tiles(n_blocks: usize) -> usize {
    n_blocks.div_ceil(SWIZZLE_COLS)
}

/// Rows of the swizzled layout: `Mp = 128 · ceil(M / 128)` (for an `M` already checked
/// by [`swizzled_len`]).
pub fn swizzled_rows(m: usize) -> usize {
    m.div_ceil(SWIZZLE_ROWS) * SWIZZLE_ROWS
}

/// Bytes of the row-major scale buffer: `M · n_blocks`.
pub fn row_major_len(m: usize, n_blocks: usize) -> Result<usize, Error> {
    m.checked_mul(n_blocks).ok_or(Error::SizeOverflow)
}

/// Bytes of the swizzled scale buffer: `Mp · nK · 4`.
pub fn swizzled_len(m: usize, n_blocks: usize) -> Result<usize, Error> {
    m.div_ceil(SWIZZLE_ROWS)
        .checked_mul(SWIZZLE_ROWS)
        .and_then(|mp| mp.checked_mul(swizzled_col_tiles(n_blocks) * SWIZZLE_COLS))
        .ok_or(Error::SizeOverflow)
}

/// Byte offset of block `b` of row `row` in the swizzled layout (SPEC.md §3):
/// `(row/128)·nK·512 + (b/4)·512 + (row%32)·16 + ((row%128)/32)·4 + (b%4)`.
///
/// ```
/// use fp4norm::layout::swizzled_offset;
/// // Row 33 is the second 32-row group: its first block sits 16 + 4 bytes in.
/// assert_eq!(swizzled_offset(33, 0, 8), 20);
/// // Block 4 starts the second 128x4 tile of the same 128 rows.
/// assert_eq!(swizzled_offset(0, 4, 8), 512);
/// ```
#[inline(always)]
pub fn swizzled_offset(row: usize, block: usize, n_blocks: usize) -> usize {
    let nk = swizzled_col_tiles(n_blocks);
    (row / 128) * nk * SWIZZLE_TILE_BYTES
        + (block / 4) * SWIZZLE_TILE_BYTES
        + (row % 32) * 16
        + ((row % 128) / 32) * 4
        + (block % 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swizzled_offsets_are_a_bijection_onto_the_buffer() {
        for (m, nb) in [(1, 1), (127, 3), (128, 4), (129, 5), (300, 17), (256, 512)] {
            let len = swizzled_len(m, nb).unwrap();
            let mp = swizzled_rows(m);
            let nk4 = swizzled_col_tiles(nb) * 4;
            assert_eq!(len, mp * nk4);
            let mut seen = vec![false; len];
            for row in 0..mp {
                for b in 0..nk4 {
                    let o = swizzled_offset(row, b, nb);
                    assert!(!seen[o], "offset {o} hit twice");
                    seen[o] = true;
                }
            }
            assert!(seen.iter().all(|&s| s));
        }
    }

    #[test]
    fn sizes_overflow_is_an_error() {
        assert!(matches!(
            row_major_len(usize::MAX, 2),
            Err(Error::SizeOverflow)
        ));
        assert!(matches!(
            swizzled_len(usize::MAX / 2, 64),
            Err(Error::SizeOverflow)
        ));
    }
}
