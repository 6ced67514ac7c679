//! Random DSL graphs for property tests (not a stable API).

/// A small deterministic generator (xorshift).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

/// A random layer-like graph over `x, y: [S, D]`, `g: [D]`, `w: [D, D]`, `we: [D, E]`,
/// `wb: [E, D]` of `n` ops: activations, broadcasts, row reductions, norms, softmax, matmuls,
/// attention-like blocks; one or two outputs.
pub fn random_graph(seed: u64, n: usize) -> String {
    let mut r = Rng::new(seed);
    let mut full: Vec<String> = vec!["x".into(), "y".into()];
    let mut body = String::new();
    for i in 0..n {
        let t = format!("t{i}");
        let a = r.pick(&full).clone();
        let b = r.pick(&full).clone();
        let e = match r.below(12) {
            0 => format!(
                "{}({a})",
                r.pick(&["silu", "tanh", "sigmoid", "relu", "gelu", "neg", "gelu_tanh"])
            ),
            1 => format!("{a} {} {b}", r.pick(&["+", "-", "*"])),
            2 => format!("{a} * g + {}", r.pick(&["0.5", "g", "1.0"])),
            3 => format!("{a} - {}({b}, -1)", r.pick(&["mean", "max", "sum"])),
            4 => format!("matmul({a}, w)"),
            5 => format!("layer_norm({a}, g, g, 1e-5)"),
            6 => format!("rms_norm({a} + {b}, g, 1e-6)"),
            7 => format!("softmax({a}, -1)"),
            8 => format!("linear(silu(matmul({a}, we)), wb, g)"),
            9 => format!("exp(neg({a} * {a}))"),
            10 => format!("matmul(softmax(matmul({a}, transpose({b}, 0, 1)) * 0.25, -1), {a})"),
            _ => format!("{a} / (1.0 + {b} * {b})"),
        };
        body += &format!("    let {t} = {e};\n");
        full.push(t);
    }
    let last = full.last().unwrap().clone();
    let (ret, tail) = if r.below(2) == 0 {
        ("Tensor<f32, {[S, D]}>".to_string(), last)
    } else {
        let other = full[full.len() / 2].clone();
        (
            "(Tensor<f32, {[S, D]}>, Tensor<f32, {[S, D]}>)".to_string(),
            format!("({last}, {other} + 1.0)"),
        )
    };
    format!(
        "#[fused_graph(dims(D = 16, E = 24))]\nfn random_{seed}(x: Tensor<f32, {{[S, D]}}>, y: Tensor<f32, {{[S, D]}}>, g: Tensor<f32, {{[D]}}>, w: Tensor<f32, {{[D, D]}}>, we: Tensor<f32, {{[D, E]}}>, wb: Tensor<f32, {{[E, D]}}>) -> {ret} {{\n{body}    {tail}\n}}\n"
    )
}
