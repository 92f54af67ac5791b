//! The bodies of the fuzz targets (`tests/fuzz`, run with `cargo fuzz`), kept in the library
//! so the stable test suite replays the saved corpus and every crash found
//! (`tests/fuzz_regressions.rs`) through exactly the same code. Each takes arbitrary bytes
//! and must return without panicking: every bad input is an `Err`.

use ndarray::{Array2, ArrayD, IxDyn};

use crate::attention::{Attention, Projections};
use crate::mask::Mask;

/// The `.npy` readers: an array, a mask and lengths parsed from the same bytes; what parses
/// goes on to the shape checks of a call on X and the mask's broadcast.
pub fn npy(data: &[u8]) {
    if let Ok(a) = crate::npy::parse(data) {
        let _ = Attention::new().dims(a.shape(), None);
    }
    if let Ok(m) = crate::npy::parse_mask(data) {
        let _ = m.mask().check([2, 2, 3, 3]);
    }
    let _ = crate::npy::parse_lengths(data);
}

/// Reads small numbers off the front of the fuzzer's bytes (zeros once they run out).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    /// A size in `0..=max`.
    fn size(&mut self, max: u8) -> usize {
        usize::from(self.byte() % (max + 1))
    }

    fn f32(&mut self) -> f32 {
        f32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
}

/// Configuration validation: an op (heads, causal, scale), shapes of X, the weights and a
/// mask, and key lengths, all drawn from the bytes, through `dims`, `sdpa_dims`, the mask's
/// checks and — when everything is valid and small — the CPU reference, which must then
/// agree with the checks.
pub fn config(data: &[u8]) {
    let mut b = Bytes(data);
    let mut op = Attention::new()
        .heads(b.size(5))
        .causal(b.byte() & 1 == 1)
        .propagate_non_finite(b.byte() & 1 == 1);
    if b.byte() & 1 == 1 {
        op = op.scale(b.f32());
    }
    let rank = 1 + b.size(3);
    let x_shape: Vec<usize> = (0..rank).map(|_| b.size(6)).collect();
    let (d_in, d_k, d_k2, d_v) = (b.size(6), b.size(6), b.size(6), b.size(6));
    let with_weights = b.byte() & 1 == 1;
    let mask_rank = b.size(5);
    let mask_shape: Vec<usize> = (0..mask_rank).map(|_| b.size(6)).collect();
    let lengths: Vec<usize> = (0..b.size(4)).map(|_| b.size(8)).collect();
    let fill = b.f32();

    let (wq, wk, wv) = (
        Array2::from_elem((d_in, d_k), 0.5f32),
        Array2::from_elem((d_in, d_k2), -0.25f32),
        Array2::from_elem((d_in, d_v), 0.125f32),
    );
    let proj = Projections::new(wq.view(), wk.view(), wv.view());
    let proj = with_weights.then_some(&proj);
    let x = ArrayD::from_elem(IxDyn(&x_shape), fill);
    let keep = ArrayD::from_elem(IxDyn(&mask_shape), true);
    let mut mask = if mask_rank > 0 {
        Mask::boolean(keep.view())
    } else {
        Mask::none()
    };
    if !lengths.is_empty() {
        mask = mask.with_kv_lengths(&lengths);
    }
    let checked = op.dims(x.shape(), proj).and_then(|dims| {
        mask.check([dims.batch, dims.heads, dims.n, dims.n])
            .map(|_| dims)
    });
    let reference = crate::reference::attention_masked(&op, x.view(), proj, &mask);
    // The reference runs the same checks (and the finiteness ones): it fails where they fail.
    if checked.is_err() {
        assert!(reference.is_err(), "checks failed but the reference ran");
    }
    if let (Ok(dims), Ok(out)) = (&checked, &reference) {
        assert_eq!(out.context.shape(), dims.context_shape().as_slice());
    }
    let _ = op.sdpa_dims(&[1, 1, x.len(), 1], &x_shape, &mask_shape);
}

/// The safetensors checkpoint reader, under a prefix taken from the first byte.
pub fn safetensors(data: &[u8]) {
    let prefixes = ["layer", "enc.layer.0.attention.self", "a.b"];
    let (pick, rest) = data.split_first().unwrap_or((&0, &[]));
    let prefix = prefixes[usize::from(*pick) % prefixes.len()];
    if let Ok(layer) = crate::checkpoint::parse(rest, prefix) {
        // What loads must make projections whose shapes the op can check.
        let p = layer.projections();
        let _ = Attention::new().dims(&[2, layer.weights.0.nrows()], Some(&p));
    }
}
