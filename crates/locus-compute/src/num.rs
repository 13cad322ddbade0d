//! Numerics: compensated sums, Chan's merge of variances, Python's modulo, determinants.

use crate::pb;

/// A running sum with Neumaier's compensation: the error of a sum of n terms stays near
/// one rounding, not n of them (numpy's pairwise sum is the yardstick: relative 1e-9).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Neumaier {
    pub sum: f64,
    pub comp: f64,
}

impl Neumaier {
    #[inline]
    pub fn add(&mut self, x: f64) {
        let t = self.sum + x;
        if self.sum.abs() >= x.abs() {
            self.comp += (self.sum - t) + x;
        } else {
            self.comp += (x - t) + self.sum;
        }
        self.sum = t;
    }

    pub fn value(&self) -> f64 {
        self.sum + self.comp
    }

    pub fn merge(&mut self, o: &Neumaier) {
        self.add(o.sum);
        self.add(o.comp);
    }

    pub fn to_pb(self) -> pb::CompensatedSum {
        pb::CompensatedSum { sum: self.sum, comp: self.comp }
    }

    pub fn from_pb(p: Option<&pb::CompensatedSum>) -> Self {
        p.map(|p| Neumaier { sum: p.sum, comp: p.comp }).unwrap_or_default()
    }
}

/// Count, mean and sum of squared deviations of a set of values, merged with Chan et al.'s
/// parallel formula: stable where the naive sum of squares cancels catastrophically.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Moments {
    pub n: u64,
    pub mean: f64,
    pub m2: f64,
}

impl Moments {
    /// The moments of one batch (a few thousand values), by the corrected two-pass
    /// formula over it; batches are then merged with [`Moments::merge`].
    pub fn of(xs: &[f64]) -> Moments {
        if xs.is_empty() {
            return Moments::default();
        }
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let (mut m2, mut c) = (0.0, 0.0);
        for &x in xs {
            let d = x - mean;
            m2 += d * d;
            c += d;
        }
        // The corrected two-pass formula: the mean's rounding error taken back out.
        Moments { n: xs.len() as u64, mean: mean + c / n, m2: (m2 - c * c / n).max(0.0) }
    }

    pub fn merge(&mut self, o: &Moments) {
        if o.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *o;
            return;
        }
        let (na, nb) = (self.n as f64, o.n as f64);
        let n = na + nb;
        let delta = o.mean - self.mean;
        self.mean += delta * nb / n;
        self.m2 += o.m2 + delta * delta * na * nb / n;
        self.n += o.n;
    }

    /// Population variance (ddof 0), as numpy's `var` by default.
    pub fn var_pop(&self) -> Option<f64> {
        (self.n > 0).then(|| self.m2 / self.n as f64)
    }

    /// Sample variance (ddof 1).
    pub fn var_sample(&self) -> Option<f64> {
        (self.n > 1).then(|| self.m2 / (self.n - 1) as f64)
    }
}

/// `x mod m` as Python and numpy define it: the result has the sign of `m`.
#[inline]
pub fn py_mod(x: f64, m: f64) -> f64 {
    let r = fmod(x, m);
    if r != 0.0 && ((r < 0.0) != (m < 0.0)) { r + m } else { r }
}

/// `x % m` (C's `fmod`, exact), the quick way when it can: with `q` the quotient `x / m`
/// truncated, `x - q * m` in one rounding (a fused multiply-add) is `x % m` exactly
/// whenever it lands where `x % m` must (the sign of `x`, below `|m|`): the exact value
/// then *is* `x % m`, a double, so its rounding changes nothing. Otherwise (`q` off by
/// one, infinities, NaN, a zero `m`) the remainder is computed the slow way.
#[inline]
pub fn fmod(x: f64, m: f64) -> f64 {
    let t = x / m;
    // Truncated by a conversion (`trunc` is a call without SSE4.1); NaN and quotients
    // beyond 2^62 take the slow way.
    #[allow(clippy::neg_cmp_op_on_partial_ord)] // NaN must take the slow way too
    if !(t.abs() < 4.6e18) {
        return x % m;
    }
    let q = t as i64 as f64;
    let r = (-q).mul_add(m, x);
    let am = m.abs();
    let ok = if x >= 0.0 { r >= 0.0 && r < am } else { r <= 0.0 && r > -am };
    if !ok {
        x % m
    } else if r == 0.0 {
        0.0f64.copysign(x)
    } else {
        r
    }
}

/// The determinant of a square matrix (row-major), by LU decomposition with partial
/// pivoting, as numpy's `linalg.det` computes it.
pub fn determinant(n: usize, a: &[f64]) -> f64 {
    assert_eq!(a.len(), n * n);
    let mut m = a.to_vec();
    let mut det = 1.0;
    for col in 0..n {
        let p = (col..n).max_by(|&i, &j| m[i * n + col].abs().total_cmp(&m[j * n + col].abs())).unwrap_or(col);
        if m[p * n + col] == 0.0 {
            return 0.0;
        }
        if p != col {
            for k in 0..n {
                m.swap(p * n + k, col * n + k);
            }
            det = -det;
        }
        let d = m[col * n + col];
        det *= d;
        for r in col + 1..n {
            let f = m[r * n + col] / d;
            if f != 0.0 {
                for k in col..n {
                    m[r * n + k] -= f * m[col * n + k];
                }
            }
        }
    }
    det
}

/// Shannon entropy in bits of a distribution given by counts.
pub fn entropy_bits<'a>(counts: impl Iterator<Item = &'a u64> + Clone) -> f64 {
    let total: u64 = counts.clone().sum();
    if total == 0 {
        return 0.0;
    }
    let t = total as f64;
    let mut h = Neumaier::default();
    for &c in counts {
        if c > 0 {
            let p = c as f64 / t;
            h.add(-p * p.log2());
        }
    }
    h.value()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_modulo() {
        assert_eq!(py_mod(7.0, 3.0), 1.0);
        assert_eq!(py_mod(-7.0, 3.0), 2.0);
        assert_eq!(py_mod(7.0, -3.0), -2.0);
        assert_eq!(py_mod(-7.0, -3.0), -1.0);
        assert_eq!(py_mod(6.0, 3.0), 0.0);
    }

    #[test]
    fn quick_fmod_is_fmod() {
        let mut xs = vec![0.0, -0.0, 7.0, -7.0, 1e300, -1e300, 1e-300, 5e-324, f64::MAX, f64::MIN_POSITIVE];
        xs.extend([f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 2f64.powi(53) + 2.0, 0.1, 0.7, 2.1, 6.999999999999999]);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let x = f64::from_bits(state);
            xs.push(x);
            xs.push((state % 2_000_000) as f64 / 10_000.0 * 3.0 - 100.0);
        }
        for m in [7.0, -7.0, 0.1, 3.0, 1e-300, 1e300, 0.0, f64::INFINITY, f64::NAN, 2.5] {
            for &x in &xs {
                let (a, b) = (fmod(x, m), x % m);
                assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "{x:e} % {m:e}: {a:e} != {b:e}");
            }
        }
    }

    #[test]
    fn chan_merge_equals_one_pass() {
        let xs: Vec<f64> = (0..1000).map(|i| 1e9 + (i as f64) * 0.37 - ((i * i) % 17) as f64).collect();
        let whole = Moments::of(&xs);
        let mut m = Moments::default();
        for c in xs.chunks(37) {
            m.merge(&Moments::of(c));
        }
        assert_eq!(m.n, whole.n);
        assert!((m.mean - whole.mean).abs() / whole.mean.abs() < 1e-14);
        assert!((m.m2 - whole.m2).abs() / whole.m2 < 1e-9, "{} vs {}", m.m2, whole.m2);
    }

    #[test]
    fn determinants() {
        assert_eq!(determinant(2, &[1.0, 2.0, 3.0, 4.0]), -2.0);
        assert!((determinant(3, &[2.0, 0.0, 1.0, 1.0, 3.0, 2.0, 1.0, 1.0, 2.0]) - 6.0).abs() < 1e-12);
        assert_eq!(determinant(2, &[1.0, 2.0, 2.0, 4.0]), 0.0);
    }

    #[test]
    fn entropy_of_uniform_bytes_is_eight_bits() {
        let c = [5u64; 256];
        assert!((entropy_bits(c.iter()) - 8.0).abs() < 1e-12);
        assert_eq!(entropy_bits([7u64].iter()), 0.0);
    }
}
