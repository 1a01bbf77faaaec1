//! Host tensor views for the CPU backends: matrices with a row stride, the output
//! buffers, and the global scale.

use crate::layout::ScaleLayout;
use crate::Error;

fn view_len(
    name: &'static str,
    len: usize,
    rows: usize,
    cols: usize,
    stride: usize,
) -> Result<(), Error> {
    if stride < cols && rows > 1 {
        return Err(Error::StrideTooSmall { name, stride, cols });
    }
    let needed = if rows == 0 {
        0
    } else {
        (rows - 1)
            .checked_mul(stride)
            .and_then(|n| n.checked_add(cols))
            .ok_or(Error::SizeOverflow)?
    };
    if needed > len {
        return Err(Error::ViewOutOfBounds {
            name,
            rows,
            cols,
            stride,
            needed,
            len,
        });
    }
    Ok(())
}

/// A read-only `rows × cols` matrix in a slice; row `i` starts at element `i · row_stride`.
///
/// A 3-D tensor `[B, S, H]` is the matrix `[B·S, H]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    row_stride: usize,
}

impl<'a, T> MatRef<'a, T> {
    /// A contiguous matrix: `data.len()` must be at least `rows · cols`.
    pub fn new(data: &'a [T], rows: usize, cols: usize) -> Result<Self, Error> {
        Self::with_stride(data, rows, cols, cols)
    }

    /// A matrix whose rows are `row_stride` elements apart (a view into a wider buffer).
    pub fn with_stride(
        data: &'a [T],
        rows: usize,
        cols: usize,
        row_stride: usize,
    ) -> Result<Self, Error> {
        view_len("MatRef", data.len(), rows, cols, row_stride)?;
        Ok(MatRef {
            data,
            rows,
            cols,
            row_stride,
        })
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Elements per row.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Elements between the starts of consecutive rows.
    pub fn row_stride(&self) -> usize {
        self.row_stride
    }
    /// Row `i` (panics if `i >= rows`).
    pub fn row(&self, i: usize) -> &'a [T] {
        &self.data[i * self.row_stride..i * self.row_stride + self.cols]
    }
    /// The underlying slice.
    pub fn data(&self) -> &'a [T] {
        self.data
    }
}

/// A mutable `rows × cols` matrix in a slice; row `i` starts at element `i · row_stride`.
#[derive(Debug)]
pub struct MatMut<'a, T> {
    data: &'a mut [T],
    rows: usize,
    cols: usize,
    row_stride: usize,
}

impl<'a, T> MatMut<'a, T> {
    /// A contiguous matrix: `data.len()` must be at least `rows · cols`.
    pub fn new(data: &'a mut [T], rows: usize, cols: usize) -> Result<Self, Error> {
        Self::with_stride(data, rows, cols, cols)
    }

    /// A matrix whose rows are `row_stride` elements apart (a view into a wider buffer).
    pub fn with_stride(
        data: &'a mut [T],
        rows: usize,
        cols: usize,
        row_stride: usize,
    ) -> Result<Self, Error> {
        view_len("MatMut", data.len(), rows, cols, row_stride)?;
        Ok(MatMut {
            data,
            rows,
            cols,
            row_stride,
        })
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Elements per row.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Elements between the starts of consecutive rows.
    pub fn row_stride(&self) -> usize {
        self.row_stride
    }
    /// Row `i` (panics if `i >= rows`).
    pub fn row(&self, i: usize) -> &[T] {
        &self.data[i * self.row_stride..i * self.row_stride + self.cols]
    }
    /// Row `i`, mutable (panics if `i >= rows`).
    pub fn row_mut(&mut self, i: usize) -> &mut [T] {
        &mut self.data[i * self.row_stride..i * self.row_stride + self.cols]
    }
    /// A read-only view of the same matrix.
    pub fn as_ref(&self) -> MatRef<'_, T> {
        MatRef {
            data: self.data,
            rows: self.rows,
            cols: self.cols,
            row_stride: self.row_stride,
        }
    }
    /// Splits the matrix into consecutive groups of `rows_per_chunk` rows (the last may be
    /// shorter): disjoint mutable views, for processing row groups in parallel.
    pub(crate) fn into_row_chunks(self, rows_per_chunk: usize) -> Vec<MatMut<'a, T>> {
        let mut out = Vec::with_capacity(self.rows.div_ceil(rows_per_chunk.max(1)));
        let (mut data, mut rows) = (self.data, self.rows);
        while rows > 0 {
            let take = rows.min(rows_per_chunk);
            let split = if take == rows {
                data.len()
            } else {
                take * self.row_stride
            };
            let (head, tail) = std::mem::take(&mut data).split_at_mut(split);
            out.push(MatMut {
                data: head,
                rows: take,
                cols: self.cols,
                row_stride: self.row_stride,
            });
            data = tail;
            rows -= take;
        }
        out
    }
}

/// The block-scale output buffer(s); the variant chooses the layout.
#[derive(Clone, Copy, Debug)]
pub enum ScaleOut<S> {
    /// Row-major `[M, H/B]`.
    RowMajor(S),
    /// Swizzled 128×4, `Mp · nK · 4` bytes; padding is written as zero.
    Swizzled(S),
    /// Both layouts from one pass.
    Both {
        /// Row-major `[M, H/B]`.
        row_major: S,
        /// Swizzled 128×4.
        swizzled: S,
    },
}

impl<S> ScaleOut<S> {
    /// The layout this output asks for.
    pub fn layout(&self) -> ScaleLayout {
        match self {
            ScaleOut::RowMajor(_) => ScaleLayout::RowMajor,
            ScaleOut::Swizzled(_) => ScaleLayout::Swizzled,
            ScaleOut::Both { .. } => ScaleLayout::Both,
        }
    }

    /// The row-major and swizzled buffers, where present.
    pub fn split(self) -> (Option<S>, Option<S>) {
        match self {
            ScaleOut::RowMajor(r) => (Some(r), None),
            ScaleOut::Swizzled(s) => (None, Some(s)),
            ScaleOut::Both {
                row_major,
                swizzled,
            } => (Some(row_major), Some(swizzled)),
        }
    }

    /// Borrowed buffers.
    pub fn as_ref(&self) -> ScaleOut<&S> {
        match self {
            ScaleOut::RowMajor(r) => ScaleOut::RowMajor(r),
            ScaleOut::Swizzled(s) => ScaleOut::Swizzled(s),
            ScaleOut::Both {
                row_major,
                swizzled,
            } => ScaleOut::Both {
                row_major,
                swizzled,
            },
        }
    }
}

/// Where the outputs of one call go (host memory).
#[derive(Debug)]
pub struct Fp4Out<'a, T> {
    /// Packed FP4, `M · H/2` bytes: element `2j` in the low nibble of byte `j`.
    pub y_fp4: &'a mut [u8],
    /// Block-scale codes in the chosen layout(s).
    pub scales: ScaleOut<&'a mut [u8]>,
    /// Optional `[M, H]` normalised values in the input dtype, before quantisation.
    pub y_out: Option<MatMut<'a, T>>,
}

/// The global scale of E4M3 scales (ignored by UE8M0).
#[derive(Clone, Copy, Debug)]
pub enum GlobalScale<'a> {
    /// One value for every row (the usual case; 1.0 means none).
    Uniform(f32),
    /// One value per row (`M` values).
    PerRow(&'a [f32]),
}

impl GlobalScale<'_> {
    /// The scale of row `i`.
    #[inline(always)]
    pub fn row(&self, i: usize) -> f32 {
        match self {
            GlobalScale::Uniform(g) => *g,
            GlobalScale::PerRow(g) => g[i],
        }
    }
}

impl Default for GlobalScale<'_> {
    fn default() -> Self {
        GlobalScale::Uniform(1.0)
    }
}
