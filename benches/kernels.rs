//! How fast the host kernels are, against this machine's limit and against onnxruntime.
//!
//!     pip install -r peers/requirements.txt      # once: numpy, onnx, onnxruntime
//!     cargo bench --bench kernels                 # [-- --quick] [--no-ort] [--only gemm|seed|decode|dtypes] [--verbose]
//!
//! Parts, each ending with a one-line summary:
//! 1. `fma peak`: an FMA loop per pool thread (the widest ISA this CPU has), all threads at once;
//!    `peak <isa>`: the same for every instruction family this machine may run (f32 FMA at
//!    256 and 512 bits, AVX512-BF16, AVX-VNNI and AVX512-VNNI, AMX-BF16 and AMX-INT8);
//!    then the generated code's matmul micro-kernel alone on one core with its operands in L1
//!    (`micro-kernel`), the ceiling of every matmul.
//! 2. `gemm`: C = A B at M = N = K = 1024, f32, through a generated kernel, on the pool.
//! 3. `seed_layer`: the seed layer at (d 512, 8 heads, S 128), (1024, 16, 512), (4096, 32, 256),
//!    fused (opt_level 3) and unfused (opt_level 0), interleaved round by round with
//!    onnxruntime (all graph optimisations, same thread count) served by
//!    `peers/ort_seed_layer.py` on the same weights and input; each output is checked
//!    against the script's float64 forward (normwise relative error <= 1e-4).
//! 4. `decode`: the d 512 layer at S = 1, 4, 16, onnxruntime at the same S, and the dispatch
//!    overheads on cached shapes (per call, per kernel, per SPMD launch + barrier).
//! 5. `dtypes`: the d 512 seed layer (S 128, fused) declared f32, f16 and bf16, interleaved:
//!    the half-precision layers' time over the f32 layer's (storage in 16 bits, arithmetic in
//!    f32, so the conversions are the whole difference).
//! 6. `memory`: arenas, packed weights and the process's peak RSS.
//!
//! Times are medians over runs interleaved with their competitors, so load on this shared
//! machine hits all of them alike. Threads: `AUTOFUSION_THREADS` (default: all cores).

#[path = "isa_peaks/mod.rs"]
mod isa_peaks;

use autofusion::{Module, Tensor};
use autofusion_compiler::target::Target;
use autofusion_compiler::{find_graphs, front, Unit, Variant};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

#[path = "../tests/common/mod.rs"]
mod common;

struct Args {
    quick: bool,
    verbose: bool,
    ort: bool,
    only: Option<String>,
}

fn args() -> Args {
    let a: Vec<String> = std::env::args().collect();
    let only = a.iter().position(|x| x == "--only").and_then(|i| a.get(i + 1)).cloned();
    Args {
        quick: a.iter().any(|x| x == "--quick"),
        verbose: a.iter().any(|x| x == "--verbose"),
        ort: !a.iter().any(|x| x == "--no-ort"),
        only,
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

fn threads() -> usize {
    autofusion_runtime::pool::pool().threads()
}

/// Parse `src` (one `#[fused_graph]` function), then generate, compile and load `variant`.
fn load(src: &str, variant: Variant, target: &Target) -> Module {
    let file = syn::parse_file(src).expect("bench graph parses");
    let (f, attr) = find_graphs(&file.items).into_iter().next().expect("one graph");
    let unit = Unit::with_options(front::parse_options(attr).expect("options"), f)
        .unwrap_or_else(|_| panic!("graph `{}` lowers", f.sig.ident));
    let dir = root().join("target").join("autofusion-bench").join("jit");
    common::load(&unit, variant, target, &dir, &["-O3"]).unwrap_or_else(|e| panic!("{e}"))
}

// ---------------------------------------------------------------- 1. FMA peak

/// GFLOP/s of all pool threads running an FMA loop at once, at the widest f32 level this CPU
/// has (`isa_peaks`; a scalar `mul_add` loop without AVX2): the best of many short tries,
/// since a try in which another process takes a core measures that process, not the CPU.
fn fma_peak(quick: bool) -> f64 {
    let tries = if quick { 20 } else { 100 };
    let families = isa_peaks::families();
    let widest = families.iter().rfind(|f| f.usable && matches!(f.name, "avx2" | "avx512f"));
    match widest {
        Some(f) => isa_peaks::peak(f, threads(), tries),
        None => isa_peaks::peak(&isa_peaks::scalar(), threads(), tries),
    }
}

/// `peak <isa>: X GFLOP/s` for each instruction family this machine may run, all pool threads
/// at once (`isa_peaks`); the others are named as absent.
fn isa_peak_lines(quick: bool) {
    for f in isa_peaks::families() {
        if f.usable {
            let p = isa_peaks::peak(&f, threads(), if quick { 5 } else { 30 });
            println!("peak {}: {p:.1} {} ({} threads)", f.name, f.unit, threads());
        } else {
            println!("peak {}: not on this machine", f.name);
        }
    }
}

// ---------------------------------------------------------------- 1b. micro-kernel alone

/// The generated code's matmul micro-kernel (the prelude's `af_isa()`, the one the kernels
/// use) on one thread with its operands in L1: A and B slivers of depth `kc` reused, C
/// accumulated. Compiled with the kernels' flags. Returns (ISA name, GFLOP/s) or why not.
fn micro_kernel(quick: bool) -> Result<(String, f64), String> {
    let dir = root().join("target").join("autofusion-bench");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let (src, exe) = (dir.join("uk.c"), dir.join("uk"));
    let reps: u64 = if quick { 200_000 } else { 1_000_000 };
    let main = format!(
        r#"
#include <stdio.h>
#include <time.h>
int main(void) {{
    const af_isa_info isa = af_isa();
    enum {{ KC = 256 }};
    static float A[AF_MR_MAX * KC] __attribute__((aligned(64))), B[KC * AF_NR_MAX] __attribute__((aligned(64)));
    static float C[AF_MR_MAX * 64] __attribute__((aligned(64)));
    for (int i = 0; i < AF_MR_MAX * KC; i++) A[i] = 1e-3f * (float)(i % 7);
    for (int i = 0; i < KC * AF_NR_MAX; i++) B[i] = 1e-3f * (float)(i % 5);
    double best = 0;
    for (int t = 0; t < 5; t++) {{
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long r = 0; r < {reps}L / 5; r++) isa.uk(KC, A, 1, isa.mr, B, C + (r & 1) * isa.nr, 64, isa.mr, isa.nr, 1);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        const double g = 2.0 * (double)isa.mr * (double)isa.nr * KC * ({reps}L / 5) / s / 1e9;
        if (g > best) best = g;
    }}
    printf("%s %ldx%ld %.3f %g\n", isa.name, (long)isa.mr, (long)isa.nr, best, (double)C[3]);
    return 0;
}}
"#
    );
    let include = src.with_file_name("include");
    autofusion_compiler::codegen::write_headers(&include).map_err(|e| e.to_string())?;
    let code = format!(
        "#define _POSIX_C_SOURCE 200809L\n#include \"{}\"\n{main}",
        autofusion_compiler::codegen::HOST_HEADER
    );
    std::fs::write(&src, code).map_err(|e| e.to_string())?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(autofusion_compiler::codegen::host::CFLAGS)
        .arg(format!("-I{}", include.display()))
        .arg("-O3")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-lm")
        .output()
        .map_err(|e| format!("cannot run `{cc}`: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let out = Command::new(&exe).output().map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let f: Vec<&str> = text.split_whitespace().collect();
    match (f.first(), f.get(1), f.get(2).and_then(|g| g.parse::<f64>().ok())) {
        (Some(isa), Some(tile), Some(g)) => Ok((format!("{isa} {tile}"), g)),
        _ => Err(format!("unexpected output `{text}`")),
    }
}

// ---------------------------------------------------------------- 2. GEMM

fn gemm(peak: f64, target: &Target, quick: bool) {
    let n = 1024usize;
    let src = format!(
        "#[fused_graph(dims(K = {n}, N = {n}), opt_level = 3)]
         fn gemm_{n}(a: Tensor<f32, {{[M, K]}}>, b: Tensor<f32, {{[K, N]}}>) -> Tensor<f32, {{[M, N]}}> {{ matmul(a, b) }}"
    );
    let m = load(&src, Variant::Fused, target);
    let a = Tensor::randn(&[n, n], 1.0, 1);
    let b = Tensor::randn(&[n, n], 1.0, 2);
    let ins = [&a, &b];
    let out = m.run(&ins).unwrap();
    // Spot-check 256 entries against a float64 dot product.
    let (av, bv, cv) = (a.to_f32_vec(), b.to_f32_vec(), out[0].to_f32_vec());
    let mut worst = 0.0f64;
    for s in 0..256usize {
        let (i, j) = ((s * 7919) % n, (s * 104_729) % n);
        let want: f64 = (0..n).map(|k| av[i * n + k] as f64 * bv[k * n + j] as f64).sum();
        worst = worst.max((cv[i * n + j] as f64 - want).abs() / (n as f64).sqrt());
    }
    assert!(worst < 1e-4, "gemm result off by {worst:e} (scaled by sqrt(K))");
    let reps = if quick { 5 } else { 30 };
    let mut t = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
        std::hint::black_box(m.run(&ins).unwrap());
        t.push(t0.elapsed().as_secs_f64());
    }
    let g = 2.0 * (n * n * n) as f64 / median(&t) / 1e9;
    println!("  gemm {n}x{n}x{n}: median {:.3} ms over {reps} runs, {} threads (spot check vs float64: {worst:.1e})", median(&t) * 1e3, threads());
    println!("gemm: {g:.1} GFLOP/s = {:.1}% of peak", 100.0 * g / peak);
}

// ---------------------------------------------------------------- 3. seed layer

fn seed_src(d: usize, h: usize) -> String {
    format!(
        "#[fused_graph(dims(D = {d}, H = {h}, F = {f}), hints(S = 256), opt_level = 3)]
        pub fn seed_d{d}(
            x: Tensor<f32, {{[S, D]}}>, ln1_g: Tensor<f32, {{[D]}}>, ln1_b: Tensor<f32, {{[D]}}>,
            w_q: Tensor<f32, {{[D, D]}}>, b_q: Tensor<f32, {{[D]}}>, w_k: Tensor<f32, {{[D, D]}}>, b_k: Tensor<f32, {{[D]}}>,
            w_v: Tensor<f32, {{[D, D]}}>, b_v: Tensor<f32, {{[D]}}>, w_o: Tensor<f32, {{[D, D]}}>, b_o: Tensor<f32, {{[D]}}>,
            ln2_g: Tensor<f32, {{[D]}}>, ln2_b: Tensor<f32, {{[D]}}>,
            w1: Tensor<f32, {{[D, F]}}>, b1: Tensor<f32, {{[F]}}>, w2: Tensor<f32, {{[F, D]}}>, b2: Tensor<f32, {{[D]}}>,
        ) -> Tensor<f32, {{[S, D]}}> {{
            let h = layer_norm(x, ln1_g, ln1_b, 1e-5);
            let q = split_heads(linear(h, w_q, b_q), H);
            let k = split_heads(linear(h, w_k, b_k), H);
            let v = split_heads(linear(h, w_v, b_v), H);
            let scores = matmul(q, transpose(k, -2, -1)) * (1.0 / sqrt(D / H));
            let a = merge_heads(matmul(softmax(scores, -1), v));
            let x1 = x + linear(a, w_o, b_o);
            let f = silu(linear(layer_norm(x1, ln2_g, ln2_b, 1e-5), w1, b1));
            x1 + linear(f, w2, b2)
        }}",
        f = 4 * d
    )
}

const PARAMS: [&str; 16] = [
    "ln1_g", "ln1_b", "w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o", "ln2_g", "ln2_b",
    "w1", "b1", "w2", "b2",
];

/// Weights ~ N(0, 0.02), gains 1 + N(0, 0.02) (deterministic per name).
fn weights(d: usize) -> Vec<Tensor> {
    PARAMS
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let shape: Vec<usize> = match *name {
                "w_q" | "w_k" | "w_v" | "w_o" => vec![d, d],
                "w1" => vec![d, 4 * d],
                "w2" => vec![4 * d, d],
                "b1" => vec![4 * d],
                _ => vec![d],
            };
            let t = Tensor::randn(&shape, 0.02, 100 + i as u64);
            if name.ends_with("_g") {
                Tensor::from_f32(&shape, t.to_f32_vec().iter().map(|v| v + 1.0).collect()).unwrap()
            } else {
                t
            }
        })
        .collect()
}

fn write_f32(path: &Path, t: &Tensor) {
    let bytes: Vec<u8> = t.to_f32_vec().iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

fn read_f32(path: &Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// `peers/ort_seed_layer.py serve` on a directory of weights.
struct Ort {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    version: String,
}

impl Ort {
    fn start(dir: &Path) -> Result<Ort, String> {
        let script = root().join("peers").join("ort_seed_layer.py");
        let mut child = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
            .arg(&script)
            .args(["serve", "--dir"])
            .arg(dir)
            .args(["--threads", &threads().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start python3: {e}"))?;
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut ort = Ort { child, stdin, stdout, version: String::new() };
        match ort.read() {
            Ok(v) => {
                ort.version = v["onnxruntime"].as_str().unwrap_or("?").to_string();
                Ok(ort)
            }
            Err(e) => {
                let mut err = String::new();
                if let Some(mut s) = ort.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut s, &mut err);
                }
                let last =
                    err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").to_string();
                Err(format!("{e}: {last} (pip install -r peers/requirements.txt)"))
            }
        }
    }
    fn read(&mut self) -> Result<serde_json::Value, String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.is_empty() {
            return Err("the onnxruntime peer exited".into());
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| format!("bad reply `{line}`: {e}"))?;
        match v.get("error") {
            Some(e) => Err(format!("onnxruntime peer: {e}")),
            None => Ok(v),
        }
    }
    fn ask(&mut self, cmd: &str) -> Result<serde_json::Value, String> {
        writeln!(self.stdin, "{cmd}").map_err(|e| e.to_string())?;
        self.stdin.flush().map_err(|e| e.to_string())?;
        self.read()
    }
    /// Load `x` (written to `path`) and return the float64 reference output and ORT's error.
    fn input(&mut self, path: &Path, s: usize) -> Result<(Vec<f32>, f64), String> {
        let v = self.ask(&format!("input {} {s}", path.display()))?;
        let refp = PathBuf::from(format!("{}.ref", path.display()));
        Ok((read_f32(&refp), v["max_rel_err"].as_f64().unwrap_or(f64::NAN)))
    }
    fn time(&mut self, n: usize) -> Result<Vec<f64>, String> {
        let v = self.ask(&format!("time {n}"))?;
        Ok(v["times_ms"]
            .as_array()
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default())
    }
}

impl Drop for Ort {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let _ = self.child.wait();
    }
}

/// Normwise relative error max |a - b| / max |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).abs()).fold(0.0, f64::max);
    let den = b.iter().map(|y| (*y as f64).abs()).fold(0.0, f64::max);
    num / den.max(1e-30)
}

/// One seed-layer configuration: modules, weights and (optionally) its onnxruntime peer.
struct Layer {
    d: usize,
    fused: Module,
    opt0: Module,
    weights: Vec<Tensor>,
    ort: Option<Ort>,
    dir: PathBuf,
}

impl Layer {
    fn new(d: usize, h: usize, target: &Target, with_ort: bool) -> Layer {
        let src = seed_src(d, h);
        let (fused, opt0) =
            (load(&src, Variant::Fused, target), load(&src, Variant::Unfused, target));
        let weights = weights(d);
        let dir = root().join("target").join("autofusion-bench").join(format!("seed_d{d}"));
        let mut ort = None;
        if with_ort {
            std::fs::create_dir_all(&dir).unwrap();
            let mut params = Vec::new();
            for (name, t) in PARAMS.iter().zip(&weights) {
                let file = format!("{name}.f32");
                write_f32(&dir.join(&file), t);
                params.push(serde_json::json!({"name": name, "shape": t.shape(), "file": file}));
            }
            let man = serde_json::json!({"d": d, "heads": h, "params": params});
            std::fs::write(dir.join("manifest.json"), man.to_string()).unwrap();
            match Ort::start(&dir) {
                Ok(o) => ort = Some(o),
                Err(e) => println!("  onnxruntime unavailable: {e}"),
            }
        }
        Layer { d, fused, opt0, weights, ort, dir }
    }

    /// Time fused, opt_level 0 and onnxruntime at sequence length `s`, interleaved by rounds.
    /// Returns (fused ms, opt0 ms, ort ms or NaN, fused error, opt0 error, ort error).
    fn run(&mut self, s: usize, rounds: usize, budget_s: f64) -> [f64; 6] {
        let x = Tensor::randn(&[s, self.d], 1.0, 7 + s as u64);
        let mut ins: Vec<&Tensor> = vec![&x];
        ins.extend(self.weights.iter());
        let (yf, y0) = (self.fused.run(&ins).unwrap(), self.opt0.run(&ins).unwrap());
        let (mut ef, mut e0, mut eo) = (f64::NAN, f64::NAN, f64::NAN);
        if let Some(ort) = self.ort.as_mut() {
            let xp = self.dir.join(format!("x_s{s}.f32"));
            write_f32(&xp, &x);
            match ort.input(&xp, s) {
                Ok((want, e)) => {
                    ef = rel_err(&yf[0].to_f32_vec(), &want);
                    e0 = rel_err(&y0[0].to_f32_vec(), &want);
                    eo = e;
                }
                Err(e) => {
                    println!("  onnxruntime failed: {e}");
                    self.ort = None;
                }
            }
        }
        if ef.is_nan() {
            // No float64 oracle without the peer: the reference interpreter (f32) instead.
            let want = self.fused.reference(&ins).unwrap()[0].to_f32_vec();
            ef = rel_err(&yf[0].to_f32_vec(), &want);
            e0 = rel_err(&y0[0].to_f32_vec(), &want);
        }
        // Repetitions per round from one timed run of each, so a round takes ~budget_s / rounds.
        let t0 = Instant::now();
        self.fused.run(&ins).unwrap();
        let one = t0.elapsed().as_secs_f64();
        let k = ((budget_s / rounds as f64 / 3.0 / one) as usize).clamp(1, 2000);
        let (mut tf, mut t0v, mut to) = (Vec::new(), Vec::new(), Vec::new());
        // The sides take turns at going first, so none always runs right after the same one.
        let mut warm_up = false;
        for round in 0..rounds {
            for side in (0..3).map(|i| (i + round) % 3) {
                let (m, t) = match side {
                    0 => (&self.fused, &mut tf),
                    1 => (&self.opt0, &mut t0v),
                    _ => {
                        if let Some(ort) = self.ort.as_mut() {
                            match ort.time(k) {
                                Ok(v) => to.extend(v),
                                Err(e) => println!("  onnxruntime failed: {e}"),
                            }
                            // Let onnxruntime's spinning workers go to sleep before our next run.
                            std::thread::sleep(std::time::Duration::from_millis(20));
                            warm_up = true;
                        }
                        continue;
                    }
                };
                if warm_up {
                    // Untimed runs first: a core that has just slept runs slowly for a while.
                    let w = Instant::now();
                    while w.elapsed().as_secs_f64() < 0.02 {
                        std::hint::black_box(m.run(&ins).unwrap());
                    }
                    warm_up = false;
                }
                for _ in 0..k {
                    let t0 = Instant::now();
                    std::hint::black_box(m.run(&ins).unwrap());
                    t.push(t0.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        [median(&tf), median(&t0v), median(&to), ef, e0, eo]
    }

    /// Median time of each kernel of both builds (kernels launched one by one).
    fn print_kernels(&self, s: usize) {
        let x = Tensor::randn(&[s, self.d], 1.0, 7 + s as u64);
        let mut ins: Vec<&Tensor> = vec![&x];
        ins.extend(self.weights.iter());
        for (name, m) in [("fused", &self.fused), ("opt0", &self.opt0)] {
            let t = m.time_kernels(&ins, 11).unwrap();
            println!(
                "    {name}: {} kernels, sum of medians {:.1} us",
                t.len(),
                t.iter().sum::<f64>()
            );
            for ((k, ops), us) in m.kernel_names().iter().zip(&t) {
                println!("      {k:<22} {us:>9.1} us  {ops}");
            }
        }
    }

    fn arena_bytes(&self, s: usize) -> (usize, usize) {
        let dims = [s as i64];
        (
            self.fused.shape_plan(&dims).unwrap().arena_bytes,
            self.opt0.shape_plan(&dims).unwrap().arena_bytes,
        )
    }
}

fn layer_flops(d: usize, s: usize) -> f64 {
    2.0 * s as f64 * 12.0 * (d * d) as f64 + 4.0 * (s * s * d) as f64
}

fn seed(peak: f64, target: &Target, a: &Args, mem: &mut Vec<String>) {
    let configs: &[(usize, usize, usize)] =
        if a.quick { &[(512, 8, 128)] } else { &[(512, 8, 128), (1024, 16, 512), (4096, 32, 256)] };
    for &(d, h, s) in configs {
        let mut l = Layer::new(d, h, target, a.ort);
        let [f, o0, ort, ef, e0, eo] =
            l.run(s, if a.quick { 3 } else { 7 }, if a.quick { 1.0 } else { 6.0 });
        if a.verbose {
            l.print_kernels(s);
        }
        let g = layer_flops(d, s) / (f * 1e-3) / 1e9;
        println!(
            "  d {d}, {h} heads, S {s}: fused {g:.1} GFLOP/s = {:.1}% of peak; fused vs opt0 {:.2}x; relative error vs float64: fused {ef:.1e}, opt0 {e0:.1e}, onnxruntime {eo:.1e}{}",
            100.0 * g / peak,
            o0 / f,
            l.ort.as_ref().map(|o| format!(" (onnxruntime {})", o.version)).unwrap_or_default()
        );
        assert!(ef <= 1e-4 && e0 <= 1e-4, "seed layer d={d}: outputs differ from the float64 reference (fused {ef:e}, opt0 {e0:e})");
        println!("seed_layer d={d} s={s}: fused {f:.3} ms, opt0 {o0:.3} ms, onnxruntime {ort:.3} ms, ratio {:.2}", f / ort);
        let (af, a0) = l.arena_bytes(s);
        mem.push(format!(
            "d {d} S {s}: arena fused {:.1} MB, opt0 {:.1} MB; weights {:.1} MB, packed copies {:.1} MB held once for both modules (fused uses {:.1} MB, opt0 {:.1} MB)",
            af as f64 / 1e6,
            a0 as f64 / 1e6,
            weight_bytes(&l) as f64 / 1e6,
            autofusion_runtime::packs::live_bytes() as f64 / 1e6,
            l.fused.packed_bytes() as f64 / 1e6,
            l.opt0.packed_bytes() as f64 / 1e6
        ));
    }
}

fn weight_bytes(l: &Layer) -> usize {
    l.weights.iter().map(|t| t.shape().iter().product::<usize>() * 4).sum()
}

// ---------------------------------------------------------------- 5. f16 and bf16 layers

fn dtypes(target: &Target, a: &Args) {
    let (d, h) = (512, 8);
    let names = ["f32", "f16", "bf16"];
    let mut layers = Vec::new();
    for dt in names {
        let src = seed_src(d, h)
            .replace("Tensor<f32", &format!("Tensor<{dt}"))
            .replace(&format!("fn seed_d{d}("), &format!("fn seed_d{d}_{dt}("));
        let m = load(&src, Variant::Fused, target);
        let dt = m.graph().node(m.graph().param_nodes()[0]).dtype;
        let ins: Vec<Tensor> = weights(d).into_iter().map(|t| t.to_dtype(dt).unwrap()).collect();
        layers.push((m, ins));
    }
    // A prefill-sized call, then decode (one row: the weights' bytes dominate).
    for s in [128, 1] {
        dtypes_at(&names, &layers, (d, s), a);
    }
    let packed = layers.iter().map(|(m, _)| format!("{:.2}", m.packed_bytes() as f64 / 1e6));
    println!(
        "dtypes: packed weights f32 / f16 / bf16: {} MB",
        packed.collect::<Vec<_>>().join(" / ")
    );
}

/// Times the f32, f16 and bf16 layers (weights in `layers`) side by side at `S = s`.
fn dtypes_at(names: &[&str], layers: &[(Module, Vec<Tensor>)], (d, s): (usize, usize), a: &Args) {
    let xs: Vec<Tensor> = layers
        .iter()
        .map(|(_, w)| Tensor::randn(&[s, d], 1.0, 7).to_dtype(w[0].dtype()).unwrap())
        .collect();
    let rounds = if a.quick { 5 } else { 21 } * if s == 1 { 20 } else { 1 };
    let mut times = vec![Vec::new(); names.len()];
    for _ in 0..rounds {
        for (k, (m, w)) in layers.iter().enumerate() {
            let refs: Vec<&Tensor> = std::iter::once(&xs[k]).chain(w).collect();
            let t0 = Instant::now();
            m.run(&refs).unwrap();
            times[k].push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    let med: Vec<f64> = times.iter().map(|t| median(t)).collect();
    if a.verbose {
        for (k, (dt, (m, w))) in names.iter().zip(layers).enumerate() {
            let refs: Vec<&Tensor> = std::iter::once(&xs[k]).chain(w).collect();
            let t = m.time_kernels(&refs, 5).unwrap();
            for ((name, ops), us) in m.kernel_names().iter().zip(t) {
                println!("    {dt} {name}: {us:.1} us ({ops})");
            }
        }
    }
    println!(
        "dtypes d {d} S {s} fused: f32 {:.3} ms, f16 {:.3} ms ({:.2}x f32), bf16 {:.3} ms ({:.2}x f32)",
        med[0],
        med[1],
        med[1] / med[0],
        med[2],
        med[2] / med[0]
    );
}

// ---------------------------------------------------------------- 4. decode and dispatch

fn decode(target: &Target, a: &Args) {
    let mut l = Layer::new(512, 8, target, a.ort);
    let mut s1 = (f64::NAN, f64::NAN);
    for s in [1usize, 4, 16] {
        let [f, o0, ort, ef, ..] =
            l.run(s, if a.quick { 3 } else { 9 }, if a.quick { 0.3 } else { 2.0 });
        assert!(ef <= 1e-4, "decode S={s}: fused output differs from the reference ({ef:e})");
        println!(
            "  decode d 512 S {s}: fused {:.1} us, opt0 {:.1} us, onnxruntime {:.1} us",
            f * 1e3,
            o0 * 1e3,
            ort * 1e3
        );
        if s == 1 {
            s1 = (f, ort);
        }
    }
    // Dispatch overheads on cached shapes: a graph of 1 and of 16 tiny kernels (opt_level 0,
    // one kernel per op, a single block each) and an empty SPMD launch across the pool.
    let chain = |n: usize| {
        let body: String = (0..n).map(|i| format!("let y = y * 1.0001 + {}.0;\n", i % 3)).collect();
        format!("#[fused_graph(dims(C = 8), opt_level = 0)] fn chain{n}(x: Tensor<f32, {{[S, C]}}>) -> Tensor<f32, {{[S, C]}}> {{ let y = x; {body} y }}")
    };
    let (m1, m16) =
        (load(&chain(1), Variant::Fused, target), load(&chain(16), Variant::Fused, target));
    let (k1, k16) = (m1.kernel_names().len(), m16.kernel_names().len());
    let x = Tensor::randn(&[1, 8], 1.0, 3);
    let per_run = |m: &Module| {
        let mut t = Vec::new();
        for _ in 0..if a.quick { 2000 } else { 20000 } {
            let t0 = Instant::now();
            std::hint::black_box(m.run(&[&x]).unwrap());
            t.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        median(&t)
    };
    let (t1, t16) = (per_run(&m1), per_run(&m16));
    let per_kernel = (t16 - t1) / (k16 - k1) as f64;
    let pool = autofusion_runtime::pool::pool();
    let mut t = Vec::new();
    for _ in 0..if a.quick { 2000 } else { 20000 } {
        let t0 = Instant::now();
        pool.run(pool.threads(), &|b| {
            std::hint::black_box(b);
        });
        t.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    let launch = median(&t);
    println!("  dispatch: call {t1:.2} us ({k1} kernel), {per_kernel:.3} us per further kernel ({k16} kernels: {t16:.2} us), SPMD launch + barrier over {} threads {launch:.2} us", pool.threads());
    println!(
        "decode: S=1 fused {:.1} us, onnxruntime {:.1} us, ratio {:.2}; dispatch {:.2} us per kernel + {:.2} us per launch",
        s1.0 * 1e3,
        s1.1 * 1e3,
        s1.0 / s1.1,
        per_kernel,
        launch
    );
}

// ---------------------------------------------------------------- 5. memory

fn rss() -> (f64, f64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = |key: &str| {
        s.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (kb("VmRSS:") / 1024.0, kb("VmHWM:") / 1024.0)
}

fn main() {
    let a = args();
    let want = |p: &str| a.only.as_deref().is_none_or(|o| o == p);
    let target = common::calibrated_host();
    println!(
        "kernels bench: {} threads, micro-kernel ISA from CPUID{}",
        threads(),
        std::env::var("AUTOFUSION_ISA")
            .map(|v| format!(" (AUTOFUSION_ISA={v})"))
            .unwrap_or_default()
    );
    println!(
        "cpu: {}; features: {}; matmul kernels: {}",
        autofusion::machine::cpu_model(),
        autofusion::machine::cpu_features_line(),
        autofusion::machine::isa_level()
    );
    let peak = fma_peak(a.quick);
    println!("fma peak: {peak:.1} GFLOP/s ({} threads)", threads());
    isa_peak_lines(a.quick);
    match micro_kernel(a.quick) {
        Ok((isa, g)) => {
            let per_core = peak / threads() as f64;
            println!("micro-kernel: {g:.1} GFLOP/s on one core ({isa}, kc 256, operands in L1) = {:.1}% of the per-core peak", 100.0 * g / per_core)
        }
        Err(e) => println!("micro-kernel: not measured ({e})"),
    }
    if want("gemm") {
        gemm(peak, &target, a.quick);
    }
    let mut mem = Vec::new();
    if want("seed") {
        seed(peak, &target, &a, &mut mem);
    }
    if want("decode") {
        decode(&target, &a);
    }
    if want("dtypes") {
        dtypes(&target, &a);
    }
    let (now, hwm) = rss();
    for m in &mem {
        println!("  {m}");
    }
    println!("memory: peak RSS {hwm:.0} MB (now {now:.0} MB)");
}
