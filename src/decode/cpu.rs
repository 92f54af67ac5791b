//! The CPU peer `bench --decode` compares with: a straightforward one-thread f32 KV cache and
//! decode step, the same semantics as [`super::Decoder::step`] (not part of the API).

use ndarray::{s, Array4, ArrayView2, ArrayView4, Axis, ShapeBuilder};

/// K and V in host memory, token-major as the device cache: `(token, batch, kv_heads, d)`.
#[derive(Debug, Clone)]
pub struct CpuKvCache {
    batch: usize,
    kv_heads: usize,
    d_k: usize,
    d_v: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl CpuKvCache {
    /// An empty cache with room reserved for `capacity` tokens.
    pub fn new(capacity: usize, batch: usize, kv_heads: usize, d_k: usize, d_v: usize) -> Self {
        let rows = capacity * batch * kv_heads;
        CpuKvCache {
            batch,
            kv_heads,
            d_k,
            d_v,
            k: Vec::with_capacity(rows * d_k),
            v: Vec::with_capacity(rows * d_v),
        }
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.k.len() / (self.batch * self.kv_heads * self.d_k).max(1)
    }

    /// Whether it holds no token.
    pub fn is_empty(&self) -> bool {
        self.k.is_empty()
    }

    /// Appends K `(batch, kv_heads, m, d_k)` and V `(batch, kv_heads, m, d_v)` (shapes as
    /// [`super::KvCache::append`] checks them; here they are assumed).
    pub fn append(&mut self, k: ArrayView4<'_, f32>, v: ArrayView4<'_, f32>) {
        let m = k.dim().2;
        for t in 0..m {
            for b in 0..self.batch {
                for h in 0..self.kv_heads {
                    self.k.extend(k.slice(s![b, h, t, ..]).iter());
                    self.v.extend(v.slice(s![b, h, t, ..]).iter());
                }
            }
        }
    }

    /// The decode step: `q` `(batch, heads, m, d_k)`, the last `m` tokens' queries, against
    /// every token, causal aligned to the end; returns `(batch, heads, m, d_v)`. Per (batch,
    /// K/V head), the scores of its query rows and the weighted sum are two GEMMs
    /// (matrixmultiply's, one thread) reading the cache in place.
    pub fn step(&self, q: ArrayView4<'_, f32>, scale: f32) -> Array4<f32> {
        let (batch, heads, m, d_k) = q.dim();
        let len = self.len();
        let ratio = heads / self.kv_heads;
        let tok_k = self.batch * self.kv_heads * self.d_k;
        let tok_v = self.batch * self.kv_heads * self.d_v;
        let mut out = Array4::<f32>::zeros((batch, heads, m, self.d_v));
        for b in 0..batch {
            for kvh in 0..self.kv_heads {
                let heads_of = s![b, kvh * ratio..(kvh + 1) * ratio, .., ..];
                let rows = q
                    .slice(heads_of)
                    .as_standard_layout()
                    .into_owned()
                    .into_shape_with_order((ratio * m, d_k))
                    .expect("contiguous rows");
                let at = (b * self.kv_heads + kvh) * self.d_k;
                let keys =
                    ArrayView2::from_shape((len, self.d_k).strides((tok_k, 1)), &self.k[at..])
                        .expect("the cache holds len tokens");
                let at = (b * self.kv_heads + kvh) * self.d_v;
                let values =
                    ArrayView2::from_shape((len, self.d_v).strides((tok_v, 1)), &self.v[at..])
                        .expect("the cache holds len tokens");
                let mut scores = rows.dot(&keys.t());
                for (r, mut row) in scores.axis_iter_mut(Axis(0)).enumerate() {
                    let visible = len - m + r % m + 1;
                    let row = row
                        .as_slice_mut()
                        .expect("rows of a new array are contiguous");
                    let max = row[..visible]
                        .iter()
                        .fold(f32::NEG_INFINITY, |a, &x| a.max(x * scale));
                    let mut sum = 0.0f32;
                    for x in &mut row[..visible] {
                        *x = (*x * scale - max).exp();
                        sum += *x;
                    }
                    for x in &mut row[..visible] {
                        *x /= sum;
                    }
                    row[visible..].fill(0.0);
                }
                let o = scores.dot(&values);
                out.slice_mut(heads_of)
                    .assign(&o.into_shape_with_order((ratio, m, self.d_v)).expect("rows"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::Attention;

    #[test]
    fn the_cpu_peer_matches_the_reference() {
        let f = |salt: usize| {
            move |(a, b, c, d): (usize, usize, usize, usize)| {
                (((a * 31 + b * 17 + c * 7 + d) * (salt + 2)) as f32 * 0.013).sin() * 1.5
            }
        };
        let (b, h, kvh, n, d) = (2, 4, 2, 13, 6);
        let q = Array4::from_shape_fn((b, h, n, d), f(1));
        let k = Array4::from_shape_fn((b, kvh, n, d), f(2));
        let v = Array4::from_shape_fn((b, kvh, n, d + 1), f(3));
        let op = Attention::new().causal(true);
        let want = crate::reference::sdpa(&op, q.view(), k.view(), v.view())
            .unwrap()
            .context;
        let mut cache = CpuKvCache::new(n, b, kvh, d, d + 1);
        cache.append(k.slice(s![.., .., ..10, ..]), v.slice(s![.., .., ..10, ..]));
        let first = cache.step(q.slice(s![.., .., ..10, ..]), 1.0 / (d as f32).sqrt());
        cache.append(k.slice(s![.., .., 10.., ..]), v.slice(s![.., .., 10.., ..]));
        let rest = cache.step(q.slice(s![.., .., 10.., ..]), 1.0 / (d as f32).sqrt());
        assert_eq!(cache.len(), n);
        let got = ndarray::concatenate(ndarray::Axis(2), &[first.view(), rest.view()]).unwrap();
        let (rel, _) = crate::reference::compare(&got.into_dyn(), &want);
        assert!(rel < 1e-5, "{rel:e}");
    }
}
