//! The output buffer of one matmul, shared by the pool's threads: each
//! writes only the elements its work item owns, through checked slices.

/// The output buffer shared by the threads of one matmul, each writing only
/// the elements it owns. Kernels address it as the whole `n x rows` output
/// (`out[i * rows + r]`); a window ([`OutPtr::window`]) holds only some
/// of those elements, for a `matmul_visit` work item.
pub(crate) struct OutPtr {
    ptr: *mut f32,
    len: usize,
    window: Option<Window>,
}

/// The part of an `n x stride` output a windowed [`OutPtr`] holds:
/// activation rows from `row0` on x outputs `col0..col0 + cols`, stored
/// row after row (`cols` apart).
#[derive(Clone, Copy)]
struct Window {
    stride: usize,
    row0: usize,
    col0: usize,
    cols: usize,
}

// SAFETY: threads only create disjoint sub-slices (see `slice`), and the
// buffer outlives the `pool.run` call that uses it.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    pub(crate) fn new(out: &mut [f32]) -> Self {
        OutPtr {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            window: None,
        }
    }

    /// `buf` standing for outputs `(i, r)`, `i >= row0`, `r` in `col0..col0
    /// + cols`, of an output of `stride` values a row: `(i, r)` is
    /// `buf[(i - row0) * cols + r - col0]`.
    pub(crate) fn window(
        buf: &mut [f32],
        stride: usize,
        row0: usize,
        col0: usize,
        cols: usize,
    ) -> Self {
        OutPtr {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            window: Some(Window {
                stride,
                row0,
                col0,
                cols,
            }),
        }
    }

    /// Where the `len` elements from output index `start` are in the
    /// buffer (asserting that a window holds all of them).
    #[inline]
    fn at(&self, start: usize, len: usize) -> usize {
        let Some(w) = self.window else {
            return start;
        };
        let (i, r) = (start / w.stride, start % w.stride);
        assert!(
            i >= w.row0 && r >= w.col0 && r + len <= w.col0 + w.cols,
            "output outside the window"
        );
        (i - w.row0) * w.cols + r - w.col0
    }

    /// `out[start..start + len]`, checked against the buffer's bounds.
    ///
    /// # Safety
    /// The buffer this `OutPtr` was made from is alive and not otherwise
    /// accessed (true within the matmul call that made it), and while the
    /// slice lives no other slice from this `OutPtr` overlaps the range and
    /// no [`set`](Self::set) writes into it.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, start: usize, len: usize) -> &mut [f32] {
        let start = self.at(start, len);
        assert!(start <= self.len && len <= self.len - start);
        // SAFETY: in bounds (checked above); exclusive by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }

    /// `out[i] = v`, checked against the buffer's bounds.
    ///
    /// # Safety
    /// The buffer this `OutPtr` was made from is alive and not otherwise
    /// accessed; no other thread writes element `i` during the call, and no
    /// live slice from this `OutPtr` covers it.
    #[inline]
    pub(crate) unsafe fn set(&self, i: usize, v: f32) {
        let i = self.at(i, 1);
        assert!(i < self.len);
        // SAFETY: in bounds (checked above); exclusive by the caller's promise.
        unsafe { *self.ptr.add(i) = v }
    }
}
