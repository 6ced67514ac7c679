//! Choosing the next token from a position's logits: greedy (the largest logit, the first on a
//! tie) or sampled as transformers' `generate` samples: logits divided by the temperature, kept
//! to the `top_k` largest, then to the smallest set whose probability reaches `top_p` (the
//! most likely token always kept), then drawn in proportion to their probabilities. The draw
//! uses ChaCha8 seeded by `seed`, so a seed gives the same text on every machine.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0: greedy.
    pub temperature: f32,
    /// 0: no limit.
    pub top_k: usize,
    /// 1: no limit.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl Sampling {
    /// An error naming the setting that is out of range.
    pub fn check(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature {} is not a finite number >= 0", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top-p {} is not in (0, 1]", self.top_p));
        }
        Ok(())
    }
}

pub struct Sampler {
    settings: Sampling,
    rng: ChaCha8Rng,
}

impl Sampler {
    pub fn new(settings: Sampling) -> Sampler {
        Sampler { settings, rng: ChaCha8Rng::seed_from_u64(settings.seed) }
    }

    /// The next token. Logits that are NaN count as -inf.
    pub fn next(&mut self, logits: &[f32]) -> u32 {
        let s = self.settings;
        if s.temperature == 0.0 {
            return argmax(logits);
        }
        let kept = candidates(logits, s.temperature, s.top_k, s.top_p);
        // A uniform draw in [0, 1) with 53 random bits.
        let u = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let mut acc = 0.0;
        for &(id, p) in &kept {
            acc += p;
            if u < acc {
                return id;
            }
        }
        kept.last().map_or(0, |&(id, _)| id)
    }
}

/// The index of the largest logit (the first of equals); NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = (0, f32::NEG_INFINITY);
    for (i, &x) in logits.iter().enumerate() {
        if x > best.1 {
            best = (i, x);
        }
    }
    best.0 as u32
}

/// The tokens sampling may draw, most likely first, with their probabilities renormalised
/// (they sum to 1): softmax of `logits / temperature` cut to the `top_k` most likely (0: all),
/// then to the fewest whose probability reaches `top_p`.
pub fn candidates(logits: &[f32], temperature: f32, top_k: usize, top_p: f32) -> Vec<(u32, f64)> {
    let mut order: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &x)| (i as u32, if x.is_nan() { f32::NEG_INFINITY } else { x }))
        .collect();
    // Stable: equal logits keep id order.
    order.sort_by(|a, b| b.1.total_cmp(&a.1));
    if top_k > 0 {
        order.truncate(top_k);
    }
    let Some(&(_, max)) = order.first() else {
        return Vec::new();
    };
    if max == f32::NEG_INFINITY {
        return vec![(order[0].0, 1.0)];
    }
    let t = temperature as f64;
    let weights: Vec<f64> =
        order.iter().map(|&(_, x)| ((x as f64 - max as f64) / t).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut kept = Vec::new();
    let mut acc = 0.0;
    for (&(id, _), w) in order.iter().zip(&weights) {
        let p = w / total;
        if p == 0.0 {
            // Sorted: the rest are zero too (and a NaN logit is among them).
            break;
        }
        kept.push((id, p));
        acc += p;
        if acc >= top_p as f64 {
            break;
        }
    }
    let sum: f64 = kept.iter().map(|&(_, p)| p).sum();
    kept.iter().map(|&(id, p)| (id, p / sum)).collect()
}
