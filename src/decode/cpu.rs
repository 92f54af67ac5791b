//! The CPU peer `bench --decode` compares with: a straightforward one-thread f32 KV cache and
//! decode step, the same semantics as [`super::Decoder::step`] (not part of the API).

use ndarray::{s, Array4, ArrayView4};

/// K and V in host memory as a CPU program keeps them: one growing `(token, d)` array per
/// (batch, K/V head), so each head's keys are contiguous.
#[derive(Debug, Clone)]
pub struct CpuKvCache {
    batch: usize,
    kv_heads: usize,
    d_k: usize,
    d_v: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl CpuKvCache {
    /// An empty cache with room reserved for `capacity` tokens.
    pub fn new(capacity: usize, batch: usize, kv_heads: usize, d_k: usize, d_v: usize) -> Self {
        let heads = batch * kv_heads;
        CpuKvCache {
            batch,
            kv_heads,
            d_k,
            d_v,
            k: (0..heads)
                .map(|_| Vec::with_capacity(capacity * d_k))
                .collect(),
            v: (0..heads)
                .map(|_| Vec::with_capacity(capacity * d_v))
                .collect(),
        }
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.k.first().map_or(0, |k| k.len() / self.d_k.max(1))
    }

    /// Whether it holds no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends K `(batch, kv_heads, m, d_k)` and V `(batch, kv_heads, m, d_v)` (shapes as
    /// [`super::KvCache::append`] checks them; here they are assumed).
    pub fn append(&mut self, k: ArrayView4<'_, f32>, v: ArrayView4<'_, f32>) {
        for b in 0..self.batch {
            for h in 0..self.kv_heads {
                let at = b * self.kv_heads + h;
                self.k[at].extend(k.slice(s![b, h, .., ..]).iter());
                self.v[at].extend(v.slice(s![b, h, .., ..]).iter());
            }
        }
    }

    /// The decode step: `q` `(batch, heads, m, d_k)`, the last `m` tokens' queries, against
    /// every token, causal aligned to the end; returns `(batch, heads, m, d_v)`. Per query row:
    /// one pass over the keys for the scores, the softmax, one pass over the values, reading
    /// the cache in place.
    pub fn step(&self, q: ArrayView4<'_, f32>, scale: f32) -> Array4<f32> {
        let (batch, heads, m, d_k) = q.dim();
        let len = self.len();
        let ratio = heads / self.kv_heads;
        let mut out = Array4::<f32>::zeros((batch, heads, m, self.d_v));
        let mut scores = vec![0.0f32; len];
        let mut qrow = vec![0.0f32; d_k];
        for b in 0..batch {
            for h in 0..heads {
                let kvh = h / ratio;
                let (keys, values) = (
                    &self.k[b * self.kv_heads + kvh],
                    &self.v[b * self.kv_heads + kvh],
                );
                for i in 0..m {
                    let visible = len - m + i + 1;
                    for (dst, src) in qrow.iter_mut().zip(q.slice(s![b, h, i, ..])) {
                        *dst = *src * scale;
                    }
                    let mut max = f32::NEG_INFINITY;
                    for (sc, key) in scores[..visible].iter_mut().zip(keys.chunks_exact(d_k)) {
                        *sc = dot(key, &qrow);
                        max = max.max(*sc);
                    }
                    let mut sum = 0.0f32;
                    for sc in &mut scores[..visible] {
                        *sc = (*sc - max).exp();
                        sum += *sc;
                    }
                    let mut row = out.slice_mut(s![b, h, i, ..]);
                    let acc = row
                        .as_slice_mut()
                        .expect("rows of a new array are contiguous");
                    for (w, value) in scores[..visible].iter().zip(values.chunks_exact(self.d_v)) {
                        for (a, x) in acc.iter_mut().zip(value) {
                            *a += w * x;
                        }
                    }
                    let inv = 1.0 / sum;
                    for a in acc.iter_mut() {
                        *a *= inv;
                    }
                }
            }
        }
        out
    }
}

/// `a · b` with eight independent partial sums.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut part = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for k in 0..8 {
            part[k] += x[k] * y[k];
        }
    }
    part.iter().sum::<f32>() + tail
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
        let want = crate::reference::run(&op, &crate::Inputs::qkv(&q, &k, &v))
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
