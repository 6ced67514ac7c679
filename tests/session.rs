//! Sessions of a small random decoder (an embedding table, two layers of
//! `tests/decoder_graphs` with their own weights, RMSNorm + output projection): prefill,
//! steps, truncate and reset agree with one another and with the reference interpreter; the
//! caches' memory is checked when a session is made; sessions on 8 threads equal serial ones.

mod common;

#[path = "decoder_graphs/mod.rs"]
mod decoder_graphs;

use autofusion::{Decoder, Module, Session, Tensor};
use autofusion_compiler::{target::Target, Options, Unit, Variant};
use decoder_graphs::{
    caches, decoder_layer, decoder_layer_dyn, embed_graph, head_graph, rope_tables, weights, SMALL,
    V,
};
use std::path::PathBuf;

const T: usize = 24;

fn load(graph: autofusion_compiler::ir::Graph) -> Module {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("session");
    let unit = Unit::from_graph(graph, Options { opt_level: 3, ..Options::default() }).unwrap();
    common::load(&unit, Variant::Fused, &Target::host(), &dir, &[]).unwrap()
}

struct Model {
    embed: Module,
    layer: Module,
    head: Module,
    table: Tensor,
    cos: Tensor,
    sin: Tensor,
    layer_weights: Vec<Vec<Tensor>>,
    norm: Tensor,
    w_out: Tensor,
}

impl Model {
    fn new() -> Model {
        let (cos, sin) = rope_tables(T, SMALL.dh as usize);
        let norm = Tensor::from_f32(&[32], vec![1.0; 32]).unwrap();
        Model {
            embed: load(embed_graph()),
            layer: load(decoder_layer(SMALL)),
            head: load(head_graph()),
            table: Tensor::randn(&[V, 32], 1.0, 1),
            cos,
            sin,
            layer_weights: vec![weights(SMALL, 10), weights(SMALL, 20)],
            norm,
            w_out: Tensor::randn(&[32, V], 0.2, 2),
        }
    }
    /// The same model with the layer declared shape-generic (`decoder_layer_dyn`): its query
    /// weight comes in as `[D, KVH, G, DH]`.
    fn new_dyn() -> Model {
        let mut m = Model::new();
        m.layer = load(decoder_layer_dyn(1.0 / (SMALL.dh as f64).sqrt()));
        let (kvh, g, dh) = (SMALL.kvh as usize, (SMALL.h / SMALL.kvh) as usize, SMALL.dh as usize);
        for w in &mut m.layer_weights {
            w[1] = w[1].reshape(&[SMALL.d as usize, kvh, g, dh]).unwrap();
        }
        m
    }
    fn decoder(&self) -> Decoder<'_> {
        Decoder {
            embed: &self.embed,
            embed_inputs: vec![&self.table],
            layer: &self.layer,
            layer_inputs: self
                .layer_weights
                .iter()
                .map(|w| [&self.cos, &self.sin].into_iter().chain(w.iter()).collect())
                .collect(),
            head: &self.head,
            head_inputs: vec![&self.norm, &self.w_out],
        }
    }
    /// The whole sequence through the reference interpreter, from position 0.
    fn reference(&self, ids: &[i64]) -> Vec<f32> {
        let ids = Tensor::from_i64(&[ids.len()], ids.to_vec()).unwrap();
        let mut x = self.embed.reference(&[&ids, &self.table]).unwrap().remove(0);
        for w in &self.layer_weights {
            let (mut k, mut v) = caches(SMALL, T);
            let mut ins = vec![&x, &self.cos, &self.sin];
            ins.extend(w.iter());
            let y = self.layer.reference_with_state(&ins, &mut [&mut k, &mut v], &[("P", 0)]);
            x = y.unwrap().remove(0);
        }
        self.head.reference(&[&x, &self.norm, &self.w_out]).unwrap().remove(0).to_f32_vec()
    }
}

fn close(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}");
    let d = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
    assert!(d <= 1e-4, "{what}: max |difference| {d}");
}

fn rows(t: &Tensor, from: usize, to: usize) -> Vec<f32> {
    t.to_f32_vec()[from * V..to * V].to_vec()
}

const IDS: [i64; 9] = [3, 17, 4, 49, 0, 8, 21, 5, 33];

#[test]
fn prefill_steps_truncate_and_reset_agree() {
    let model = Model::new();
    let dec = model.decoder();
    let mut a = Session::new(&dec, T).unwrap();
    assert_eq!(a.cache_bytes(), 2 * 2 * (2 * T * 8) * 4, "2 layers x (k, v) x [2, 1, T, 8] f32");
    let first = a.prefill(&IDS[..6]).unwrap();
    let steps: Vec<Vec<f32>> =
        IDS[6..].iter().map(|&id| a.step(id).unwrap().to_f32_vec()).collect();
    assert_eq!(a.position(), 9);
    let mut b = Session::new(&dec, T).unwrap();
    let all = b.prefill(&IDS).unwrap();
    close("prefill 6 = rows 0..6 of prefill 9", &first.to_f32_vec(), &rows(&all, 0, 6));
    for (i, s) in steps.iter().enumerate() {
        close(
            &format!("step {} = row {} of prefill 9", i + 6, i + 6),
            s,
            &rows(&all, i + 6, i + 7),
        );
    }
    close("prefill 9 = the reference", &all.to_f32_vec(), &model.reference(&IDS));
    // Back to 4 and on with other tokens: what a session given those from the start computes.
    a.truncate(4).unwrap();
    let other = [7i64, 7, 12];
    let after = a.prefill(&other).unwrap();
    let mut seq = IDS[..4].to_vec();
    seq.extend(other);
    let mut c = Session::new(&dec, T).unwrap();
    let want = c.prefill(&seq).unwrap();
    close("truncate(4) then 3 tokens", &after.to_f32_vec(), &rows(&want, 4, 7));
    a.reset();
    assert_eq!(a.position(), 0);
    close("reset then prefill 9", &a.prefill(&IDS).unwrap().to_f32_vec(), &all.to_f32_vec());
    // The last token's logits alone, as generation asks for them.
    a.reset();
    let last = a.prefill_last(&IDS).unwrap();
    assert_eq!(last.shape(), &[1, V]);
    assert_eq!(a.position(), 9);
    close("prefill_last 9 = row 8 of prefill 9", &last.to_f32_vec(), &rows(&all, 8, 9));
}

#[test]
fn session_errors_leave_it_as_it_was() {
    let model = Model::new();
    let dec = model.decoder();
    let mut s = Session::new(&dec, T).unwrap();
    let long: Vec<i64> = (0..20).map(|i| i % V as i64).collect();
    s.prefill(&long).unwrap();
    let e = s.prefill(&IDS[..5]).unwrap_err().to_string();
    assert!(e.contains("5 tokens at position 20") && e.contains("24 positions"), "{e}");
    assert_eq!(s.position(), 20);
    assert!(s.prefill(&[]).is_err());
    let e = s.truncate(21).unwrap_err().to_string();
    assert!(e.contains("truncate to 21"), "{e}");
    // A token outside the table: the embedding's error, the position unchanged.
    let e = s.step(V as i64).unwrap_err().to_string();
    assert!(e.contains(&V.to_string()), "{e}");
    assert_eq!(s.position(), 20);
    // Caches of another length than the layer's tables, where one dim sizes both: refused
    // when the session is made.
    let e = Session::new(&dec, 8).err().unwrap().to_string();
    assert!(e.contains("cache length `T` to 24") && e.contains("8 positions"), "{e}");
    // The caches' memory is checked before they are allocated (a layer whose caches' length
    // is their own dim).
    let model = Model::new_dyn();
    let dec = model.decoder();
    let e = Session::new(&dec, usize::MAX / 4).err().unwrap().to_string();
    assert!(e.contains("KV caches"), "{e}");
    model.layer.set_memory_limit(4096);
    let e = Session::new(&dec, 64).err().unwrap().to_string();
    assert!(e.contains("KV caches") && e.contains("memory limit"), "{e}");
}

/// A layer with every size a dynamic dim: the session binds its caches' other dims from the
/// layer's inputs, and computes what the fixed-size layer computes, at any cache length
/// within the tables.
#[test]
fn a_shape_generic_layer_runs_in_sessions() {
    let (fixed, generic) = (Model::new(), Model::new_dyn());
    let (fd, gd) = (fixed.decoder(), generic.decoder());
    let mut a = Session::new(&fd, T).unwrap();
    for max_len in [T, 12] {
        let mut b = Session::new(&gd, max_len).unwrap();
        assert_eq!(
            b.cache_bytes(),
            2 * 2 * (2 * max_len * 8) * 4,
            "[KVH = 2, 1, {max_len}, DH = 8]"
        );
        a.reset();
        let want = a.prefill(&IDS[..6]).unwrap().to_f32_vec();
        close(
            &format!("prefill, caches of {max_len}"),
            &b.prefill(&IDS[..6]).unwrap().to_f32_vec(),
            &want,
        );
        for &id in &IDS[6..] {
            let want = a.step(id).unwrap().to_f32_vec();
            close(&format!("step, caches of {max_len}"), &b.step(id).unwrap().to_f32_vec(), &want);
        }
    }
}

/// Greedy decoding of `n` tokens after `prompt`: the tokens and every step's logits.
fn greedy(dec: &Decoder, prompt: &[i64], n: usize) -> (Vec<i64>, Vec<Vec<f32>>) {
    let mut s = Session::new(dec, T).unwrap();
    let mut logits = s.prefill(prompt).unwrap().to_f32_vec()[(prompt.len() - 1) * V..].to_vec();
    let (mut out, mut all) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let next = (0..V).max_by(|&i, &j| logits[i].total_cmp(&logits[j])).unwrap() as i64;
        out.push(next);
        all.push(logits.clone());
        logits = s.step(next).unwrap().to_f32_vec();
    }
    (out, all)
}

#[test]
fn sessions_on_eight_threads_equal_serial_ones() {
    let model = Model::new();
    let dec = model.decoder();
    let prompts: Vec<Vec<i64>> =
        (0..8).map(|i| (0..3 + i % 4).map(|j| ((i * 7 + j * 3) % V) as i64).collect()).collect();
    let serial: Vec<_> = prompts.iter().map(|p| greedy(&dec, p, 6)).collect();
    let threaded: Vec<_> = std::thread::scope(|sc| {
        let handles: Vec<_> = prompts.iter().map(|p| sc.spawn(|| greedy(&dec, p, 6))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, b)) in serial.iter().zip(&threaded).enumerate() {
        assert_eq!(a.0, b.0, "session {i}: tokens");
        assert!(a.1 == b.1, "session {i}: logits differ from the serial run's");
    }
    eprintln!("greedy tokens of session 0: {:?}", serial[0].0);
}
