//! Prefill and decode speed of sessions timed side by side, round by round, as the `llama`
//! bench and `llama_generate --bench` print them, in lines scripts read:
//!
//! ```text
//! llama <dtype> prefill S=<n>: fused X tok/s, opt0 Y tok/s
//! llama <dtype> decode ctx=<T>: fused X tok/s, opt0 Y tok/s, Z GB/s of W GB/s measured
//! ```
//!
//! Prefill computes the last position's logits only (`Session::prefill_last`), as generation
//! does. Decode at `ctx = T` times single steps after T tokens are in the cache.

use crate::{Result, Session};
use std::time::Instant;

/// The median of `v` (sorted in place); 0 for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// `n` token ids below `vocab`, varied by `seed` (a prompt for timing).
pub fn ids(n: usize, seed: usize, vocab: usize) -> Vec<i64> {
    (0..n).map(|i| ((i * 7919 + seed * 104_729) % vocab.max(1)) as i64).collect()
}

/// Every session warmed once (weights packed, plans made) and reset.
pub fn warm(sessions: &mut [Session], vocab: usize) -> Result<()> {
    for s in sessions {
        s.prefill_last(&ids(8.min(s.max_len() - 1), 0, vocab))?;
        s.step(1)?;
        s.reset();
    }
    Ok(())
}

/// Tokens per second of a prefill of `n` tokens in each session, the median of `rounds`
/// rounds, the sessions interleaved within each round.
pub fn prefill_tok_s(
    sessions: &mut [Session],
    n: usize,
    rounds: usize,
    vocab: usize,
) -> Result<Vec<f64>> {
    let mut times = vec![Vec::new(); sessions.len()];
    for r in 0..rounds {
        for (i, s) in sessions.iter_mut().enumerate() {
            s.reset();
            let t = Instant::now();
            s.prefill_last(&ids(n, r, vocab))?;
            times[i].push(t.elapsed().as_secs_f64());
        }
    }
    Ok(times.iter_mut().map(|t| n as f64 / median(t)).collect())
}

/// Tokens per second of single decode steps with `ctx` tokens in the cache, in each session:
/// `steps` steps a round, the median of `rounds` rounds, interleaved.
pub fn decode_tok_s(
    sessions: &mut [Session],
    ctx: usize,
    steps: usize,
    rounds: usize,
    vocab: usize,
) -> Result<Vec<f64>> {
    for s in sessions.iter_mut() {
        s.reset();
        if ctx > 0 {
            s.prefill_last(&ids(ctx, 7, vocab))?;
        }
    }
    let mut times = vec![Vec::new(); sessions.len()];
    for _ in 0..rounds {
        for (i, s) in sessions.iter_mut().enumerate() {
            s.truncate(ctx)?;
            let t = Instant::now();
            for k in 0..steps {
                s.step(ids(1, k, vocab)[0])?;
            }
            times[i].push(t.elapsed().as_secs_f64() / steps.max(1) as f64);
        }
    }
    Ok(times.iter_mut().map(|t| 1.0 / median(t)).collect())
}

/// The prefill line: `tok_s` is [fused, opt0].
pub fn prefill_line(dtype: &str, n: usize, tok_s: &[f64]) -> String {
    format!("llama {dtype} prefill S={n}: fused {:.1} tok/s, opt0 {:.1} tok/s", tok_s[0], tok_s[1])
}

/// The decode line: `tok_s` is [fused, opt0]; the fused decode's weight bytes per token times
/// its tokens/s beside the measured read bandwidth.
pub fn decode_line(
    dtype: &str,
    ctx: usize,
    tok_s: &[f64],
    bytes_per_token: f64,
    bandwidth: f64,
) -> String {
    format!(
        "llama {dtype} decode ctx={ctx}: fused {:.1} tok/s, opt0 {:.1} tok/s, {:.1} GB/s of {bandwidth:.1} GB/s measured",
        tok_s[0],
        tok_s[1],
        tok_s[0] * bytes_per_token / 1e9
    )
}
