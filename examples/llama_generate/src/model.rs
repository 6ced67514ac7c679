//! A loaded model as the graphs take it: the weights as tensors (the attention scale folded
//! into the query weight, which comes in as `[D, KVH, G, DH]`), the RoPE tables for the
//! positions a session may reach, and the `Decoder` over the fused (or opt_level 0) modules.

use crate::graphs::{llama_embed, llama_head, llama_head_tied, llama_layer};
use crate::{Config, Result, Weights};
use autofusion::{Decoder, Runner, Tensor};

/// Which build of the graphs runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exec {
    /// The fused kernels (the graphs' opt_level) on the host.
    Fused,
    /// One kernel per op (opt_level 0): the baseline.
    Unfused,
    /// The fused Ascend C kernels on NPU `n` (the caches stay on the device between calls).
    #[cfg(feature = "ascend")]
    Ascend(u32),
}

/// The runners of the four graphs (embed, layer, head, tied head) for `exec`.
fn runners(exec: Exec) -> Result<[&'static dyn Runner; 4]> {
    Ok(match exec {
        Exec::Fused => [
            llama_embed::module()?,
            llama_layer::module()?,
            llama_head::module()?,
            llama_head_tied::module()?,
        ],
        Exec::Unfused => [
            llama_embed::unfused_module()?,
            llama_layer::unfused_module()?,
            llama_head::unfused_module()?,
            llama_head_tied::unfused_module()?,
        ],
        #[cfg(feature = "ascend")]
        Exec::Ascend(n) => {
            use autofusion::OnDevice;
            use std::collections::BTreeMap;
            use std::sync::Mutex;
            // One set of bindings per device for the process: a `Decoder` borrows its runners.
            static BOUND: Mutex<BTreeMap<u32, &'static [OnDevice<'static>; 4]>> =
                Mutex::new(BTreeMap::new());
            let mut bound = BOUND.lock().unwrap_or_else(|e| e.into_inner());
            let r = match bound.get(&n) {
                Some(r) => *r,
                None => {
                    let on = |module| OnDevice { module, device: n };
                    let r: &'static [OnDevice<'static>; 4] = Box::leak(Box::new([
                        on(llama_embed::ascend_module()?),
                        on(llama_layer::ascend_module()?),
                        on(llama_head::ascend_module()?),
                        on(llama_head_tied::ascend_module()?),
                    ]));
                    bound.insert(n, r);
                    r
                }
            };
            [&r[0], &r[1], &r[2], &r[3]]
        }
    })
}

pub struct Model {
    pub config: Config,
    /// Positions the RoPE tables cover: the longest session.
    pub max_len: usize,
    eps: Tensor,
    cos: Tensor,
    sin: Tensor,
    table: Tensor,
    layers: Vec<Vec<Tensor>>,
    norm: Tensor,
    w_out: Option<Tensor>,
}

impl Model {
    /// `w` as tensors, with RoPE tables for `max_len` positions.
    pub fn new(w: &Weights, max_len: usize) -> Result<Model> {
        let c = &w.config;
        let (d, kvh, dh) = (c.hidden, c.kv_heads, c.head_dim);
        let g = c.heads / c.kv_heads;
        let t = |shape: &[usize], data: Vec<f32>| Tensor::from_f32(shape, data);
        let scale = 1.0 / (dh as f32).sqrt();
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let wq: Vec<f32> = l.wq.iter().map(|v| v * scale).collect();
            layers.push(vec![
                t(&[d], l.attn_norm.clone())?,
                t(&[d, kvh, g, dh], wq)?,
                t(&[d, kvh * dh], l.wk.clone())?,
                t(&[d, kvh * dh], l.wv.clone())?,
                t(&[c.heads * dh, d], l.wo.clone())?,
                t(&[d], l.mlp_norm.clone())?,
                t(&[d, c.intermediate], l.w_gate.clone())?,
                t(&[d, c.intermediate], l.w_up.clone())?,
                t(&[c.intermediate, d], l.w_down.clone())?,
            ]);
        }
        let (cos, sin) = rope_tables(max_len, dh, c.rope_theta);
        Ok(Model {
            config: c.clone(),
            max_len,
            eps: t(&[1], vec![c.rms_eps as f32])?,
            cos: t(&[max_len, dh], cos)?,
            sin: t(&[max_len, dh], sin)?,
            table: t(&[c.vocab, d], w.embed.clone())?,
            layers,
            norm: t(&[d], w.final_norm.clone())?,
            w_out: w.output.as_ref().map(|o| t(&[d, c.vocab], o.clone())).transpose()?,
        })
    }

    /// Weight bytes a decode step reads: every layer's tensors, the final norm and the output
    /// projection (the embedding table when tied; the one row of it the step gathers is left
    /// out).
    pub fn weight_bytes_per_token(&self) -> usize {
        let out = self.w_out.as_ref().unwrap_or(&self.table);
        self.layers
            .iter()
            .flatten()
            .chain([&self.norm, out])
            .map(|t| t.numel() * t.dtype().size())
            .sum()
    }

    /// The decoder over `exec`'s modules (sessions of at most `max_len` positions).
    pub fn decoder(&self, exec: Exec) -> Result<Decoder<'_>> {
        let [embed, layer, head, head_tied] = runners(exec)?;
        let (head, out) = match &self.w_out {
            Some(w) => (head, w),
            None => (head_tied, &self.table),
        };
        Ok(Decoder {
            embed,
            embed_inputs: vec![&self.table],
            layer,
            layer_inputs: self
                .layers
                .iter()
                .map(|l| [&self.eps, &self.cos, &self.sin].into_iter().chain(l.iter()).collect())
                .collect(),
            head,
            head_inputs: vec![&self.eps, &self.norm, out],
        })
    }
}

/// Hugging Face's RoPE tables (rotate-half: column j and j + DH/2 share the frequency
/// `theta^(-2 (j mod DH/2) / DH)`), rows for positions `0 .. n`, computed in f64.
pub fn rope_tables(n: usize, dh: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
    let (mut cos, mut sin) = (Vec::with_capacity(n * dh), Vec::with_capacity(n * dh));
    for pos in 0..n {
        for j in 0..dh {
            let inv = theta.powf(-((2 * (j % (dh / 2))) as f64) / dh as f64);
            let a = pos as f64 * inv;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (cos, sin)
}
