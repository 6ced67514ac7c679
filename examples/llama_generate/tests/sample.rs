//! Token choice: greedy is the first largest logit; temperature, top-k and top-p cut and
//! reshape the distribution as transformers' warpers do; a seed fixes the draws; the draws
//! follow the probabilities (counted over many draws).

use llama_generate::sample::{argmax, candidates, Sampler, Sampling};

fn softmax(x: &[f32], t: f64) -> Vec<f64> {
    let m = x.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
    let e: Vec<f64> = x.iter().map(|&v| ((v as f64 - m) / t).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

#[test]
fn greedy_takes_the_first_largest_and_never_nan() {
    assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
    assert_eq!(argmax(&[f32::NAN, 1.0, 0.0]), 1);
    let mut s = Sampler::new(Sampling::default());
    assert_eq!(s.next(&[-3.0, -1.0, -2.0]), 1);
}

#[test]
fn candidates_are_the_warped_softmax() {
    let logits = [1.0f32, 3.0, 2.0, 0.0, 2.5];
    // No cut: the softmax at temperature 0.7, most likely first.
    let all = candidates(&logits, 0.7, 0, 1.0);
    let p = softmax(&logits, 0.7f32 as f64);
    assert_eq!(all.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 4, 2, 0, 3]);
    for &(id, q) in &all {
        assert!((q - p[id as usize]).abs() < 1e-12, "{id}: {q} against {}", p[id as usize]);
    }
    // Top-k 2: the two largest, renormalised.
    let k2 = candidates(&logits, 1.0, 2, 1.0);
    let p = softmax(&logits, 1.0);
    assert_eq!(k2.len(), 2);
    assert!((k2[0].1 - p[1] / (p[1] + p[4])).abs() < 1e-12);
    // Top-p: the fewest whose mass reaches p; the first alone when p is below its mass.
    let mass_two = p[1] + p[4];
    assert_eq!(candidates(&logits, 1.0, 0, (mass_two - 1e-6) as f32).len(), 2);
    assert_eq!(candidates(&logits, 1.0, 0, (mass_two + 1e-3) as f32).len(), 3);
    assert_eq!(candidates(&logits, 1.0, 0, 0.01), vec![(1, 1.0)]);
    let sum: f64 = candidates(&logits, 1.3, 4, 0.9).iter().map(|c| c.1).sum();
    assert!((sum - 1.0).abs() < 1e-12);
}

#[test]
fn a_seed_fixes_the_draws_and_draws_follow_the_probabilities() {
    let logits = [0.0f32, (2.0f32).ln(), (3.0f32).ln(), f32::NAN];
    let settings = Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 42 };
    let draw = |seed: u64, n: usize| {
        let mut s = Sampler::new(Sampling { seed, ..settings });
        (0..n).map(|_| s.next(&logits)).collect::<Vec<u32>>()
    };
    assert_eq!(draw(42, 200), draw(42, 200));
    assert_ne!(draw(42, 200), draw(43, 200));
    let n = 60_000;
    let mut counts = [0usize; 4];
    for id in draw(7, n) {
        counts[id as usize] += 1;
    }
    assert_eq!(counts[3], 0, "a NaN logit is never drawn");
    for (i, want) in [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0].iter().enumerate() {
        let got = counts[i] as f64 / n as f64;
        // Four standard deviations of a binomial share.
        let sd = (want * (1.0 - want) / n as f64).sqrt();
        assert!((got - want).abs() < 4.0 * sd, "token {i}: {got} drawn, {want} expected");
    }
    // Top-k 1 is greedy whatever the seed.
    let mut s = Sampler::new(Sampling { top_k: 1, ..settings });
    assert!((0..100).all(|_| s.next(&logits) == 2));
}

#[test]
fn settings_out_of_range_are_refused() {
    let ok = Sampling::default();
    assert!(ok.check().is_ok());
    for (bad, want) in [
        (Sampling { temperature: -0.5, ..ok }, "temperature"),
        (Sampling { temperature: f32::NAN, ..ok }, "temperature"),
        (Sampling { top_p: 0.0, ..ok }, "top-p"),
        (Sampling { top_p: 1.5, ..ok }, "top-p"),
    ] {
        let e = bad.check().unwrap_err();
        assert!(e.contains(want), "{e}");
    }
}
