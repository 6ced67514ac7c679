//! Sessions of a decoder-only model: token ids in, logits out, with every layer's KV caches
//! and the position kept between calls.
//!
//! A `Decoder` is three fused graphs and their weights: `embed` (token ids `[S]` to hidden
//! states `[S, D]`), one `layer` graph run once per layer (hidden states first, then that
//! layer's other inputs, its caches as state parameters, the position as its one caller dim),
//! and `head` (hidden states to logits). A `Session` owns the caches of every layer, sized
//! to a maximum length when it is made (their bytes checked against the layer module's
//! memory limit before anything is allocated), and the position: `prefill(ids)` runs S
//! tokens at the current position, `step(id)` one; `truncate(n)` goes back to position n
//! (later rows of the caches are overwritten before they are read again), `reset()` to 0.
//! Sessions borrow the model: several run on different threads at once, each with its own
//! caches. The graphs run wherever their `Runner` runs them: a host `Module`, or (feature
//! `ascend`) an `OnDevice` Ascend module, which keeps each session's caches on the device
//! between calls.

use crate::error::{Error, Result};
use crate::exec::{caller_dims, Module};
use crate::memory::{tensor_bytes, Footprint};
use crate::tensor::Tensor;
use autofusion_ir::ir::Graph;

/// What runs one graph of a session: a host `Module`, or an Ascend module on one device.
pub trait Runner: Sync {
    fn graph(&self) -> &Graph;
    /// Bytes a session may give this graph's caches.
    fn memory_limit(&self) -> usize;
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>>;
    fn run_with_state(
        &self,
        inputs: &[&Tensor],
        state: &mut [&mut Tensor],
        call_dims: &[(&str, i64)],
    ) -> Result<Vec<Tensor>>;
    /// For errors.
    fn symbol(&self) -> &str;
}

impl Runner for Module {
    fn graph(&self) -> &Graph {
        Module::graph(self)
    }
    fn memory_limit(&self) -> usize {
        Module::memory_limit(self)
    }
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        Module::run(self, inputs)
    }
    fn run_with_state(
        &self,
        inputs: &[&Tensor],
        state: &mut [&mut Tensor],
        call_dims: &[(&str, i64)],
    ) -> Result<Vec<Tensor>> {
        Module::run_with_state(self, inputs, state, call_dims)
    }
    fn symbol(&self) -> &str {
        Module::symbol(self)
    }
}

/// An Ascend module bound to device `device` (feature `ascend`); the memory limit is the
/// process default (`AUTOFUSION_MEMORY_LIMIT`).
#[cfg(feature = "ascend")]
pub struct OnDevice<'m> {
    pub module: &'m crate::ascend::AscendModule,
    pub device: u32,
}

#[cfg(feature = "ascend")]
impl Runner for OnDevice<'_> {
    fn graph(&self) -> &Graph {
        self.module.graph()
    }
    fn memory_limit(&self) -> usize {
        crate::memory::default_limit()
    }
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.module.run(self.device, inputs)
    }
    fn run_with_state(
        &self,
        inputs: &[&Tensor],
        state: &mut [&mut Tensor],
        call_dims: &[(&str, i64)],
    ) -> Result<Vec<Tensor>> {
        self.module.run_with_state(self.device, inputs, state, call_dims)
    }
    fn symbol(&self) -> &str {
        self.module.symbol()
    }
}

/// A decoder-only model as fused graphs with their weights (see the module docs).
pub struct Decoder<'m> {
    /// Token ids `[S]` (i64), then `embed_inputs`, to hidden states `[S, D]`.
    pub embed: &'m dyn Runner,
    pub embed_inputs: Vec<&'m Tensor>,
    /// Hidden states `[S, D]`, then `layer_inputs[l]`, then the caches (state), with the
    /// position as its one caller dim, to hidden states `[S, D]`.
    pub layer: &'m dyn Runner,
    pub layer_inputs: Vec<Vec<&'m Tensor>>,
    /// Hidden states `[S, D]`, then `head_inputs`, to logits `[S, V]`.
    pub head: &'m dyn Runner,
    pub head_inputs: Vec<&'m Tensor>,
}

impl Decoder<'_> {
    pub fn layers(&self) -> usize {
        self.layer_inputs.len()
    }
}

/// One conversation with a `Decoder`: its caches and position.
pub struct Session<'m> {
    model: &'m Decoder<'m>,
    /// Per layer, its state tensors in the layer graph's order.
    caches: Vec<Vec<Tensor>>,
    /// The caller dim of the layer graph (the position).
    pos_dim: String,
    pos: usize,
    max_len: usize,
}

impl<'m> Session<'m> {
    /// A session of at most `max_len` positions: every layer's caches allocated (zeroed)
    /// after their total is checked against the layer module's memory limit.
    pub fn new(model: &'m Decoder<'m>, max_len: usize) -> Result<Session<'m>> {
        let g = model.layer.graph();
        let err = |msg: String| Error::Dims { graph: g.name.clone(), msg };
        let pos_dim = match &caller_dims(g)[..] {
            [p] => p.clone(),
            other => {
                return Err(err(format!(
                    "a session's layer graph takes one dim from the caller (the position), not {other:?}"
                )))
            }
        };
        if g.state.is_empty() {
            return Err(err("a session's layer graph keeps no cache (no state parameter)".into()));
        }
        let first = model.layer_inputs.first().map(Vec::as_slice).unwrap_or(&[]);
        let shapes = cache_shapes(model.layer, first, max_len)?;
        let mut footprint = Footprint::default();
        let per_layer = shapes
            .iter()
            .try_fold(0usize, |acc, (s, d)| acc.checked_add(tensor_bytes(s, d.size())?));
        footprint.add("KV caches", per_layer.and_then(|b| b.checked_mul(model.layers())));
        let dims = format!("{} layers, {max_len} positions", model.layers());
        footprint.check(&g.name, &dims, model.layer.memory_limit())?;
        let mut caches = Vec::with_capacity(model.layers());
        for _ in 0..model.layers() {
            let layer: Result<Vec<Tensor>> =
                shapes.iter().map(|(s, d)| Tensor::try_zeros(*d, s, &g.name)).collect();
            caches.push(layer?);
        }
        Ok(Session { model, caches, pos_dim, pos: 0, max_len })
    }

    /// Tokens processed so far (the position the next token goes to).
    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Bytes of the caches this session holds.
    pub fn cache_bytes(&self) -> usize {
        self.caches.iter().flatten().map(|t| t.numel() * t.dtype().size()).sum()
    }

    /// Run `ids` at the current position; the logits of every one of them (`[S, V]`). An
    /// error leaves the position where it was (and, when the ids do not fit, the caches too).
    pub fn prefill(&mut self, ids: &[i64]) -> Result<Tensor> {
        self.run(ids, false)
    }

    /// `prefill` that computes the logits of the last token only (`[1, V]`): what generation
    /// needs, without the output projection of every prompt position.
    pub fn prefill_last(&mut self, ids: &[i64]) -> Result<Tensor> {
        self.run(ids, true)
    }

    /// One token at the current position: its logits (`[1, V]`).
    pub fn step(&mut self, id: i64) -> Result<Tensor> {
        self.run(&[id], true)
    }

    /// `ids` through the embedding and every layer at the current position, then the head
    /// over every position or (`last_only`) the last one.
    fn run(&mut self, ids: &[i64], last_only: bool) -> Result<Tensor> {
        let g = self.model.layer.graph();
        if ids.is_empty() || self.pos + ids.len() > self.max_len {
            return Err(Error::Dims {
                graph: g.name.clone(),
                msg: format!(
                    "{} tokens at position {} of a session of {} positions",
                    ids.len(),
                    self.pos,
                    self.max_len
                ),
            });
        }
        let ids = Tensor::from_i64(&[ids.len()], ids.to_vec())?;
        let mut ins = vec![&ids];
        ins.extend(self.model.embed_inputs.iter().copied());
        let mut x = one(self.model.embed.run(&ins)?, self.model.embed)?;
        let p = i64::try_from(self.pos).map_err(|_| Error::Dims {
            graph: g.name.clone(),
            msg: format!("position {} does not fit in i64", self.pos),
        })?;
        let dims = [(self.pos_dim.as_str(), p)];
        for (inputs, caches) in self.model.layer_inputs.iter().zip(&mut self.caches) {
            let mut ins = vec![&x];
            ins.extend(inputs.iter().copied());
            let mut state: Vec<&mut Tensor> = caches.iter_mut().collect();
            x = one(self.model.layer.run_with_state(&ins, &mut state, &dims)?, self.model.layer)?;
        }
        if last_only && ids.numel() > 1 {
            x = x.rows(ids.numel() - 1, ids.numel())?;
        }
        let mut ins = vec![&x];
        ins.extend(self.model.head_inputs.iter().copied());
        let logits = one(self.model.head.run(&ins)?, self.model.head)?;
        self.pos += ids.numel();
        Ok(logits)
    }

    /// Back to position `n` (at most the current one): the next token goes to `n`.
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if n > self.pos {
            return Err(Error::Dims {
                graph: self.model.layer.graph().name.clone(),
                msg: format!("truncate to {n} past the session's position {}", self.pos),
            });
        }
        self.pos = n;
        Ok(())
    }

    /// Back to position 0 (the caches are kept and overwritten as tokens come).
    pub fn reset(&mut self) {
        self.pos = 0;
    }
}

/// The caches' shapes for `max_len` positions. Every dim of a cache but its length is bound
/// from the layer's inputs (`inputs`: the first layer's, after the hidden states), where a
/// dim is an axis of its own; the one dim left (no input binds it, it is not the caller's)
/// is the length.
fn cache_shapes(
    layer: &dyn Runner,
    inputs: &[&Tensor],
    max_len: usize,
) -> Result<Vec<(Vec<usize>, crate::DType)>> {
    let g = layer.graph();
    let pnodes = g.param_nodes();
    let free = caller_dims(g);
    let err = |msg: String| Error::Dims { graph: g.name.clone(), msg };
    let mut bound: std::collections::HashMap<String, i64> = Default::default();
    for (t, &p) in inputs.iter().zip(pnodes.iter().skip(1)) {
        for (d, &n) in g.node(p).shape.iter().zip(t.shape()) {
            if let Some(s) = d.as_sym() {
                bound.entry(s.to_string()).or_insert(n as i64);
            }
        }
    }
    g.state
        .iter()
        .map(|&i| {
            let n = g.node(pnodes[i]);
            let mut syms: Vec<String> = n.shape.iter().flat_map(|d| d.symbols()).collect();
            syms.sort();
            syms.dedup();
            syms.retain(|s| !free.contains(s));
            let unbound: Vec<String> =
                syms.iter().filter(|s| !bound.contains_key(*s)).cloned().collect();
            let len = match (&syms[..], &unbound[..]) {
                ([t], _) | (_, [t]) => t.clone(),
                _ => {
                    return Err(err(format!(
                        "cache `{}` has shape {}: a session needs one dim in it (its length) that no layer input binds, not {unbound:?}",
                        g.params[i],
                        autofusion_ir::dim::shape_str(&n.shape)
                    )))
                }
            };
            if let Some(&b) = bound.get(&len).filter(|&&b| b != max_len as i64) {
                return Err(err(format!(
                    "the layer's inputs bind the cache length `{len}` to {b} (position tables of {b} rows?): a session of {max_len} positions needs them of {max_len}"
                )));
            }
            let bind = |s: &str| if s == len { Some(max_len as i64) } else { bound.get(s).copied() };
            let shape = n
                .shape
                .iter()
                .map(|d| d.eval(&bind).map(|v| v.max(0) as usize))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(err)?;
            Ok((shape, n.dtype))
        })
        .collect()
}

/// The one output of a graph.
fn one(mut v: Vec<Tensor>, m: &dyn Runner) -> Result<Tensor> {
    match v.len() {
        1 => Ok(v.pop().unwrap()),
        n => Err(Error::Module {
            symbol: m.symbol().to_string(),
            msg: format!("a session's graphs return one tensor; `{}` returns {n}", m.graph().name),
        }),
    }
}
