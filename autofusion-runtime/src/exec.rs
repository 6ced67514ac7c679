//! The executor: validates inputs and binds dynamic dims, looks up (or computes and caches)
//! the per-shape launch plan (tilings from DynamicTiling and an arena laid out by liveness),
//! and runs the kernels as SPMD blocks on the thread pool.

use crate::error::{Error, Result};
use crate::memory::{self, Footprint};
use crate::packs::{self, PackKey, Packed};
use crate::pool::pool;
use crate::reference;
use crate::tensor::Tensor;
use crate::tiling::{choose, choose_pack, workspace_bytes, Tiling};
use autofusion_ir::abi::ABI_VERSION;
use autofusion_ir::dim::shape_str;
use autofusion_ir::ir::{Graph, NodeId, Op};
use autofusion_ir::meta::ModuleMeta;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A generated kernel (see `autofusion_ir::abi`).
pub type KernelFn = unsafe extern "C" fn(
    bufs: *const *mut c_void,
    dims: *const i64,
    t: *const Tiling,
    block: i64,
    scratch: *mut f32,
);

/// `af_module` of the kernel ABI.
#[repr(C)]
pub struct AfModule {
    pub abi: u32,
    pub tiling_size: u32,
    pub json: *const u8,
    pub json_len: u64,
    pub kernels: *const Option<KernelFn>,
    pub n_kernels: u64,
}

/// Where a value lives during a call.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Loc {
    Param(usize),
    Output(usize),
    Arena(usize),
}

/// An intermediate value in the arena: written by kernel `from`, last read by kernel `to`.
struct Live {
    id: NodeId,
    from: usize,
    to: usize,
    /// Rounded up to 64 bytes; `None` when the size overflows.
    bytes: Option<usize>,
}

impl Live {
    fn size(&self) -> usize {
        self.bytes.unwrap_or(usize::MAX)
    }
}

/// Place the intermediates, largest first, each at the lowest offset clear of every value
/// live at the same time; returns the arena's size.
fn layout_arena(live: &[Live], locs: &mut HashMap<NodeId, Loc>) -> usize {
    let mut order: Vec<usize> = (0..live.len()).collect();
    order.sort_by(|a, b| live[*b].size().cmp(&live[*a].size()).then(a.cmp(b)));
    let mut placed: Vec<(usize, usize, usize, usize)> = Vec::new(); // (start, end, from, to)
    let mut arena_bytes = 0;
    for i in order {
        let v = &live[i];
        let mut conflicts: Vec<(usize, usize)> =
            placed.iter().filter(|p| p.2 <= v.to && v.from <= p.3).map(|p| (p.0, p.1)).collect();
        conflicts.sort();
        let mut off = 0usize;
        for (s, e) in conflicts {
            if off.saturating_add(v.size()) <= s {
                break;
            }
            off = off.max(e);
        }
        let end = off.saturating_add(v.size());
        placed.push((off, end, v.from, v.to));
        arena_bytes = arena_bytes.max(end);
        locs.insert(v.id, Loc::Arena(off));
    }
    arena_bytes
}

/// `S = 128, T = 7` (or `no dynamic dims`).
fn dims_text(g: &Graph, dims: &[i64]) -> String {
    if g.dyn_dims.is_empty() {
        return "no dynamic dims".into();
    }
    let pairs: Vec<String> =
        g.dyn_dims.iter().zip(dims).map(|(n, v)| format!("{n} = {v}")).collect();
    pairs.join(", ")
}

/// Everything that depends only on the bound dims: computed once per shape, then cached.
#[derive(Debug)]
pub struct ShapePlan {
    pub dims: Vec<i64>,
    pub tilings: Vec<Tiling>,
    pub scratch_floats: Vec<usize>,
    /// Arena bytes (intermediates laid out by liveness, then the workspaces).
    pub arena_bytes: usize,
    /// Per kernel, the arena offset and bytes of the memory its blocks share in one launch
    /// (`tiling::workspace_bytes`; 0 bytes for most), zeroed before each launch.
    pub workspaces: Vec<(usize, usize)>,
    /// Bytes all intermediates would take without reuse.
    pub intermediate_bytes: usize,
    /// For the pipeline: the earlier kernels each kernel must wait for (it reads their
    /// outputs, or its outputs reuse arena memory they read or write).
    pub deps: Vec<Vec<usize>>,
    /// What a call at these dims allocates, by part (checked against the memory limit before
    /// each call).
    pub footprint: Footprint,
    /// The bound dims as `S = 128, T = 7`, for messages.
    pub dims_text: String,
    locs: HashMap<NodeId, Loc>,
    out_shapes: Vec<Vec<usize>>,
}

/// A packed copy a module holds, while the tensor it was packed from lives.
struct HeldPack {
    /// `Tensor::liveness` of the weight.
    tensor: std::sync::Weak<()>,
    packed: Arc<Packed>,
}

/// A loaded graph variant: metadata and kernel table from the generated library.
pub struct Module {
    symbol: String,
    meta: ModuleMeta,
    kernels: Vec<KernelFn>,
    /// Each kernel's pack functions (`KernelMeta::packs` order).
    pack_fns: Vec<Vec<KernelFn>>,
    /// Launch plans by dims, at most `PLANS_KEPT` (decode makes one per position).
    cache: Mutex<HashMap<Vec<i64>, Arc<ShapePlan>>>,
    arena: Mutex<Vec<u64>>,
    /// Packed B operands by (kernel, pack): one per weight tensor passed there that is still
    /// alive (a layer module run over the weights of many layers keeps each layer's copy),
    /// shared with other kernels and modules packing the same tensor alike (see `packs`).
    packed: Mutex<HashMap<(usize, usize), Vec<HeldPack>>>,
    /// Operands this module packed itself (neither its cache nor the process had them).
    packs_done: AtomicUsize,
    /// Bytes a call may allocate (see `memory`).
    memory_limit: AtomicUsize,
    /// An arena larger than this is freed after the call that grew it.
    arena_retain: AtomicUsize,
    /// Gathers whose ids a kernel computes: checked after that kernel (found once, at load).
    index_checks: Vec<IndexCheck>,
}

thread_local! {
    /// Each thread's kernel scratch, with the release epoch it was allocated in.
    static SCRATCH: RefCell<(usize, Vec<f32>)> = const { RefCell::new((0, Vec::new())) };
}

/// Bumped by `Module::release_memory`: a thread whose scratch is from an older epoch frees it
/// at its next use (pool workers cannot be reached from the releasing thread).
static SCRATCH_EPOCH: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Copy)]
struct SendPtr(*const *mut c_void);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl Module {
    /// Load a module descriptor exported by generated code.
    ///
    /// # Safety
    /// `ptr` must be null or point to an `af_module` produced by autofusion's code generator
    /// (the macro passes the address returned by the generated `af_*` function).
    pub unsafe fn from_raw(ptr: *const AfModule, symbol: &str) -> Result<Module> {
        let err = |msg: String| Error::Module { symbol: symbol.to_string(), msg };
        if ptr.is_null() {
            return Err(err("the module descriptor is null".into()));
        }
        let m = &*ptr;
        if m.abi != ABI_VERSION {
            return Err(err(format!(
                "built for kernel ABI {} but the runtime speaks ABI {ABI_VERSION}; rebuild",
                m.abi
            )));
        }
        if m.tiling_size as usize != std::mem::size_of::<Tiling>() {
            return Err(err(format!(
                "af_tiling is {} bytes in C but {} in Rust",
                m.tiling_size,
                std::mem::size_of::<Tiling>()
            )));
        }
        let json = std::slice::from_raw_parts(m.json, m.json_len as usize);
        let meta: ModuleMeta =
            autofusion_ir::json::parse(json).map_err(|e| err(format!("bad metadata: {e}")))?;
        let n_packs: usize = meta.kernels.iter().map(|k| k.packs.len()).sum();
        if meta.kernels.len() + n_packs != m.n_kernels as usize {
            return Err(err(format!("{} functions in the table, {} kernels and {n_packs} pack functions in the metadata", m.n_kernels, meta.kernels.len())));
        }
        let table = std::slice::from_raw_parts(m.kernels, m.n_kernels as usize);
        let mut fns = table
            .iter()
            .enumerate()
            .map(|(i, k)| k.ok_or_else(|| err(format!("function {i} of the table is null"))))
            .collect::<Result<Vec<_>>>()?
            .into_iter();
        let kernels: Vec<KernelFn> = fns.by_ref().take(meta.kernels.len()).collect();
        let pack_fns =
            meta.kernels.iter().map(|k| fns.by_ref().take(k.packs.len()).collect()).collect();
        let index_checks = computed_indices(
            &meta.graph,
            meta.kernels.iter().map(|k| (k.buffers.as_slice(), k.n_inputs)),
        );
        Ok(Module {
            index_checks,
            symbol: symbol.to_string(),
            meta,
            kernels,
            pack_fns,
            cache: Mutex::new(HashMap::new()),
            arena: Mutex::new(Vec::new()),
            packed: Mutex::new(HashMap::new()),
            packs_done: AtomicUsize::new(0),
            memory_limit: AtomicUsize::new(memory::default_limit()),
            arena_retain: AtomicUsize::new(usize::MAX),
        })
    }

    /// Bytes one call may allocate (arena, outputs, scratch, packed weights); a call that
    /// would need more returns `Error::Memory` before allocating anything.
    pub fn set_memory_limit(&self, bytes: usize) {
        self.memory_limit.store(bytes, Ordering::Relaxed);
    }
    pub fn memory_limit(&self) -> usize {
        self.memory_limit.load(Ordering::Relaxed)
    }

    /// Free the arena after any call that grew it past `bytes` (default: keep it, so calls
    /// of one shape reuse it). `0` frees it after every call.
    pub fn set_arena_retain(&self, bytes: usize) {
        self.arena_retain.store(bytes, Ordering::Relaxed);
    }

    /// Return what the module holds between calls: the arena, the per-shape plans, the packed
    /// weights, and every thread's kernel scratch (freed at the thread's next use). The next
    /// call allocates what it needs again.
    pub fn release_memory(&self) {
        *self.arena.lock().unwrap_or_else(|e| e.into_inner()) = Vec::new();
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.packed.lock().unwrap_or_else(|e| e.into_inner()).clear();
        SCRATCH_EPOCH.fetch_add(1, Ordering::Relaxed);
        SCRATCH.with(|s| *s.borrow_mut() = (0, Vec::new()));
    }

    /// Bytes held between calls: the arena and the packed weights.
    pub fn held_bytes(&self) -> usize {
        let arena = self.arena.lock().unwrap_or_else(|e| e.into_inner()).capacity() * 8;
        arena + self.packed_bytes()
    }

    pub fn graph(&self) -> &Graph {
        &self.meta.graph
    }
    pub fn meta(&self) -> &ModuleMeta {
        &self.meta
    }
    pub fn symbol(&self) -> &str {
        &self.symbol
    }

    /// Check dtypes and shapes of `inputs` and bind the dynamic dims.
    pub fn bind(&self, inputs: &[&Tensor]) -> Result<Vec<i64>> {
        bind_inputs(&self.meta.graph, inputs)
    }

    /// The launch plan for these dims (cached).
    pub fn shape_plan(&self, dims: &[i64]) -> Result<Arc<ShapePlan>> {
        if let Some(p) = self.cache.lock().unwrap().get(dims) {
            return Ok(p.clone());
        }
        let p = Arc::new(self.make_plan(dims)?);
        keep_plan(&mut self.cache.lock().unwrap(), dims.to_vec(), p.clone());
        Ok(p)
    }

    /// How many launch plans the module holds (at most `PLANS_KEPT`).
    pub fn plans_held(&self) -> usize {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn make_plan(&self, dims: &[i64]) -> Result<ShapePlan> {
        let g = &self.meta.graph;
        let dims_text = dims_text(g, dims);
        let bind = |s: &str| g.dyn_dims.iter().position(|d| d == s).map(|i| dims[i]);
        let dim_err = |msg: String| Error::Dims { graph: g.name.clone(), msg };
        let shape = |id: NodeId| -> Result<Vec<usize>> {
            let n = g.node(id);
            n.shape
                .iter()
                .map(|d| match d.eval(&bind) {
                    Ok(v) => usize::try_from(v).map_err(|_| {
                        dim_err(format!("`{}` has extent {d} = {v} with {dims_text}", n.name))
                    }),
                    Err(e) => Err(dim_err(e)),
                })
                .collect()
        };
        // Locations: parameters, graph outputs, and arena slots for the rest.
        let mut locs = HashMap::new();
        for (i, p) in g.param_nodes().iter().enumerate() {
            locs.insert(*p, Loc::Param(i));
        }
        // A cache_write's result is its cache, written in place: checked to fit first.
        for w in g.state_writes() {
            cache_write_fits(g, w, &bind)?;
            if let Op::Param { index } = g.node(g.node(w).inputs[0]).op {
                locs.insert(w, Loc::Param(index));
            }
        }
        let mut footprint = Footprint::default();
        let mut out_shapes = Vec::new();
        let mut out_bytes = Some(0usize);
        for (i, o) in g.outputs.iter().enumerate() {
            locs.insert(*o, Loc::Output(i));
            let s = shape(*o)?;
            out_bytes = out_bytes
                .zip(memory::tensor_bytes(&s, g.node(*o).dtype.size()))
                .and_then(|(a, b)| a.checked_add(b));
            out_shapes.push(s);
        }
        footprint.add("outputs", out_bytes);
        let live = self.liveness(&shape, &mut locs)?;
        if live.iter().any(|v| v.bytes.is_none()) {
            footprint.add("arena of intermediates", None);
            return Err(footprint.check(&g.name, &dims_text, 0).unwrap_err());
        }
        // Tilings only for sizes that fit: their arithmetic assumes it.
        let eval = |d: &autofusion_ir::dim::DimExpr| d.eval(&bind).unwrap_or(0);
        let threads = pool().threads();
        let (tilings, scratch_floats): (Vec<Tiling>, Vec<usize>) =
            self.meta.kernels.iter().map(|k| choose(&k.work, &eval, threads)).unzip();
        let mut arena_bytes = layout_arena(&live, &mut locs);
        // Workspaces after the intermediates, each 64-byte aligned (kernels in a pipeline
        // run at once, so they never share one).
        let mut workspaces = Vec::with_capacity(tilings.len());
        for (k, t) in self.meta.kernels.iter().zip(&tilings) {
            let bytes = workspace_bytes(&k.work, t, &eval).next_multiple_of(64);
            workspaces.push((arena_bytes, bytes));
            arena_bytes += bytes;
        }
        footprint.add("arena of intermediates", Some(arena_bytes));
        let widest = scratch_floats.iter().max().copied().unwrap_or(0);
        footprint.add("per-thread kernel scratch", widest.checked_mul(4 * threads));
        footprint.add("packed weights", self.packed_weight_bytes(&eval));
        let deps = self.kernel_deps(&live, &locs);
        Ok(ShapePlan {
            dims: dims.to_vec(),
            tilings,
            scratch_floats,
            arena_bytes,
            workspaces,
            intermediate_bytes: live.iter().filter_map(|v| v.bytes).sum(),
            deps,
            footprint,
            dims_text,
            locs,
            out_shapes,
        })
    }

    /// The intermediates (values written by a kernel that are not graph outputs), each with
    /// the kernel steps it lives in and its 64-byte rounded size (`None` on overflow); their
    /// locations are entered in `locs` as unplaced arena slots.
    fn liveness(
        &self,
        shape: &dyn Fn(NodeId) -> Result<Vec<usize>>,
        locs: &mut HashMap<NodeId, Loc>,
    ) -> Result<Vec<Live>> {
        let g = &self.meta.graph;
        let mut live: Vec<Live> = Vec::new();
        for (ki, k) in self.meta.kernels.iter().enumerate() {
            for &o in &k.buffers[k.n_inputs..] {
                if let std::collections::hash_map::Entry::Vacant(e) = locs.entry(o) {
                    let bytes = memory::tensor_bytes(&shape(o)?, g.node(o).dtype.size())
                        .and_then(|b| b.checked_next_multiple_of(64));
                    live.push(Live { id: o, from: ki, to: ki, bytes });
                    e.insert(Loc::Arena(usize::MAX));
                }
            }
        }
        for (ki, k) in self.meta.kernels.iter().enumerate() {
            for &i in &k.buffers[..k.n_inputs] {
                if let Some(e) = live.iter_mut().find(|e| e.id == i) {
                    e.to = e.to.max(ki);
                }
            }
        }
        Ok(live)
    }

    /// Bytes of every packed weight operand at these dims (`None` on overflow): the most
    /// this module can make the process hold (less when copies are shared).
    fn packed_weight_bytes(
        &self,
        eval: &dyn Fn(&autofusion_ir::dim::DimExpr) -> i64,
    ) -> Option<usize> {
        let mut packs = self.meta.kernels.iter().flat_map(|k| &k.packs);
        packs.try_fold(0usize, |acc, p| acc.checked_add(packs::packed_bytes(p, eval)?))
    }

    /// For the pipeline: the earlier kernels each kernel must wait for (it reads their
    /// outputs, or writes memory they read or write).
    fn kernel_deps(&self, live: &[Live], locs: &HashMap<NodeId, Loc>) -> Vec<Vec<usize>> {
        let range = |id: NodeId| -> Option<(usize, usize)> {
            match locs[&id] {
                Loc::Arena(off) => live.iter().find(|e| e.id == id).map(|e| (off, off + e.size())),
                _ => None,
            }
        };
        let overlap = |a: Option<(usize, usize)>, b: Option<(usize, usize)>| matches!((a, b), (Some(x), Some(y)) if x.0 < y.1 && y.0 < x.1);
        let ks = &self.meta.kernels;
        (0..ks.len())
            .map(|k| {
                (0..k)
                    .filter(|&j| {
                        let (rj, wj) =
                            (&ks[j].buffers[..ks[j].n_inputs], &ks[j].buffers[ks[j].n_inputs..]);
                        let (rk, wk) =
                            (&ks[k].buffers[..ks[k].n_inputs], &ks[k].buffers[ks[k].n_inputs..]);
                        let raw = wj.iter().any(|o| rk.contains(o));
                        let war = rj
                            .iter()
                            .chain(wj)
                            .any(|x| wk.iter().any(|y| x == y || overlap(range(*x), range(*y))));
                        raw || war
                    })
                    .collect()
            })
            .collect()
    }

    /// Run the fused kernels.
    pub fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.stateless()?;
        let dims = self.bind(inputs)?;
        self.run_inner(&CallParams::of(inputs), &dims, None)
    }

    /// Run a graph that keeps state between calls (`Graph::state`: KV caches it writes in
    /// place): `inputs` are its other parameters in order, `state` its state parameters in
    /// order (written by the call), `call_dims` the dims no parameter's shape carries (the
    /// position `P` of a KV cache's first new row). A call that would write outside a cache is
    /// an `Err` before anything runs.
    pub fn run_with_state(
        &self,
        inputs: &[&Tensor],
        state: &mut [&mut Tensor],
        call_dims: &[(&str, i64)],
    ) -> Result<Vec<Tensor>> {
        let dims = self.bind_with_state(inputs, state, call_dims)?;
        let params = CallParams::with_state(&self.meta.graph, inputs, state);
        self.run_inner(&params, &dims, None)
    }

    /// `run_with_state` in the reference interpreter.
    pub fn reference_with_state(
        &self,
        inputs: &[&Tensor],
        state: &mut [&mut Tensor],
        call_dims: &[(&str, i64)],
    ) -> Result<Vec<Tensor>> {
        reference_with_state(&self.meta.graph, inputs, state, call_dims)
    }

    fn stateless(&self) -> Result<()> {
        stateless(&self.meta.graph)
    }

    fn bind_with_state(
        &self,
        inputs: &[&Tensor],
        state: &[&mut Tensor],
        call_dims: &[(&str, i64)],
    ) -> Result<Vec<i64>> {
        bind_with_state(&self.meta.graph, inputs, state, call_dims)
    }

    /// Median wall time of each kernel over `reps` runs, in microseconds (kernels launched one
    /// by one, pipeline off): for benchmarks of the cost model.
    pub fn time_kernels(&self, inputs: &[&Tensor], reps: usize) -> Result<Vec<f64>> {
        self.stateless()?;
        let dims = self.bind(inputs)?;
        self.median_kernel_times(&CallParams::of(inputs), &dims, reps)
    }

    /// `time_kernels` of a graph with state (a decode step): every rep writes the caches at
    /// the same position, so each one times the same call.
    pub fn time_kernels_with_state(
        &self,
        inputs: &[&Tensor],
        state: &mut [&mut Tensor],
        call_dims: &[(&str, i64)],
        reps: usize,
    ) -> Result<Vec<f64>> {
        let dims = self.bind_with_state(inputs, state, call_dims)?;
        let params = CallParams::with_state(&self.meta.graph, inputs, state);
        self.median_kernel_times(&params, &dims, reps)
    }

    fn median_kernel_times(
        &self,
        params: &CallParams,
        dims: &[i64],
        reps: usize,
    ) -> Result<Vec<f64>> {
        let mut all: Vec<Vec<f64>> = vec![Vec::new(); self.meta.kernels.len()];
        for _ in 0..reps.max(1) {
            let mut t = vec![0.0; self.meta.kernels.len()];
            self.run_inner(params, dims, Some(&mut t))?;
            for (k, v) in t.into_iter().enumerate() {
                all[k].push(v);
            }
        }
        Ok(all
            .into_iter()
            .map(|mut v| {
                v.sort_by(|a, b| a.total_cmp(b));
                v[v.len() / 2]
            })
            .collect())
    }

    fn run_inner(
        &self,
        params: &CallParams,
        dims: &[i64],
        mut times: Option<&mut Vec<f64>>,
    ) -> Result<Vec<Tensor>> {
        let dims = dims.to_vec();
        let plan = self.shape_plan(&dims)?;
        let g = &self.meta.graph;
        plan.footprint.check(&g.name, &plan.dims_text, self.memory_limit())?;
        let mut outputs: Vec<Tensor> = g
            .outputs
            .iter()
            .zip(&plan.out_shapes)
            .map(|(o, s)| Tensor::try_zeros(g.node(*o).dtype, s, &g.name))
            .collect::<Result<_>>()?;
        let mut own_arena;
        let mut guard = self.arena.try_lock().ok();
        let arena: &mut Vec<u64> = match guard.as_deref_mut() {
            Some(a) => a,
            None => {
                own_arena = Vec::new();
                &mut own_arena
            }
        };
        let words = plan.arena_bytes / 8;
        if arena.len() < words {
            arena.try_reserve_exact(words - arena.len()).map_err(|_| Error::Alloc {
                graph: g.name.clone(),
                what: "arena of intermediates".into(),
                bytes: plan.arena_bytes,
            })?;
            arena.resize(words, 0);
        }
        let arena_ptr = arena.as_mut_ptr() as *mut u8;
        let out_ptrs: Vec<*mut u8> = outputs.iter_mut().map(|t| t.as_mut_ptr()).collect();
        let ptr_of = |id: NodeId| -> *mut c_void {
            match *plan.locs.get(&id).unwrap_or_else(|| panic!("{}: no location for {id}", g.name))
            {
                Loc::Param(i) => params.ptrs[i],
                Loc::Output(i) => out_ptrs[i] as *mut c_void,
                // SAFETY: offsets are within `arena_bytes`, which the arena holds.
                Loc::Arena(off) => unsafe { arena_ptr.add(off) as *mut c_void },
            }
        };
        let mut all_bufs: Vec<Vec<*mut c_void>> = self
            .meta
            .kernels
            .iter()
            .map(|k| k.buffers.iter().map(|b| ptr_of(*b)).collect())
            .collect();
        // Packed B operands after each kernel's buffers (packed now if the tensor is new).
        let mut held = Vec::new();
        for (ki, k) in self.meta.kernels.iter().enumerate() {
            for j in 0..k.packs.len() {
                let p = self.packed_operand(ki, j, params, &dims, &mut all_bufs[ki], &plan)?;
                all_bufs[ki].push(p.data.as_ptr() as *mut c_void);
                held.push(p);
            }
        }
        // A kernel's workspace after its packed operands, zeroed (its counters start at 0).
        for (ki, &(off, bytes)) in plan.workspaces.iter().enumerate() {
            if bytes > 0 {
                // SAFETY: the workspace lies within `arena_bytes`, which the arena holds.
                let ws = unsafe { arena_ptr.add(off) };
                unsafe { std::ptr::write_bytes(ws, 0, bytes) };
                all_bufs[ki].push(ws as *mut c_void);
            }
        }
        let bufs: Vec<SendPtr> = all_bufs.iter().map(|b| SendPtr(b.as_ptr())).collect();
        let dims_ptr = dims.as_ptr() as usize;
        let run_block = |ki: usize, b: usize| {
            let scratch = plan.scratch_floats[ki];
            let t = &plan.tilings[ki];
            let f = self.kernels[ki];
            let bp = bufs[ki];
            SCRATCH.with(|s| {
                let (epoch, s) = &mut *s.borrow_mut();
                let now = SCRATCH_EPOCH.load(Ordering::Relaxed);
                if *epoch != now {
                    *s = Vec::new(); // released since this thread last ran a kernel
                    *epoch = now;
                }
                if s.len() < scratch.max(1) {
                    s.resize(scratch.max(1), 0.0);
                }
                // SAFETY: the buffers are sized from the same shapes the kernel computes
                // with; each block writes a disjoint range of rows or tiles.
                unsafe { f(bp.0, dims_ptr as *const i64, t, b as i64, s.as_mut_ptr()) };
            });
        };
        let threads = pool().threads();
        let index_checks = &self.index_checks;
        if self.meta.pipeline && threads > 1 && times.is_none() && index_checks.is_empty() {
            // One parallel region for the whole graph: workers walk the kernels in order,
            // claim blocks, and wait only for the kernels a kernel depends on.
            let n = self.meta.kernels.len();
            let next: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            let done: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool().run(threads, &|_| {
                for k in 0..n {
                    let nb = plan.tilings[k].block_num as usize;
                    let mut waited = false;
                    loop {
                        let b = next[k].fetch_add(1, Ordering::Relaxed);
                        if b >= nb {
                            break;
                        }
                        if !waited {
                            for &j in &plan.deps[k] {
                                let need = plan.tilings[j].block_num as usize;
                                let mut spins = 0u32;
                                while done[j].load(Ordering::Acquire) < need {
                                    spins += 1;
                                    if spins < 1 << 10 {
                                        std::hint::spin_loop();
                                    } else {
                                        std::thread::yield_now();
                                    }
                                }
                            }
                            waited = true;
                        }
                        run_block(k, b);
                        done[k].fetch_add(1, Ordering::Release);
                    }
                }
            });
        } else {
            for ki in 0..self.meta.kernels.len() {
                let nb = plan.tilings[ki].block_num as usize;
                let t0 = std::time::Instant::now();
                pool().run(nb, &|b| run_block(ki, b));
                if let Some(t) = times.as_deref_mut() {
                    t[ki] = t0.elapsed().as_secs_f64() * 1e6;
                }
                for c in index_checks.iter().filter(|c| c.kernel == ki) {
                    let nbytes = index_bytes(g, c, &dims)?;
                    // SAFETY: the buffer holds the materialised ids, `nbytes` bytes the kernel
                    // that just finished wrote.
                    let bytes = unsafe {
                        std::slice::from_raw_parts(all_bufs[ki][c.buffer] as *const u8, nbytes)
                    };
                    check_computed_indices(g, c, bytes, &dims)?;
                }
            }
        }
        if let Some(a) = guard.as_deref_mut() {
            if a.capacity() * 8 > self.arena_retain.load(Ordering::Relaxed) {
                *a = Vec::new();
            }
        }
        drop(guard);
        Ok(outputs)
    }

    /// Packed operand `j` of kernel `ki` for these inputs: this module's when it was packed
    /// from the same tensor alike, else the process's (`packs`), else packed now (on the
    /// pool) and published. `bufs` is the kernel's buffer table (the pack function reads its
    /// operand from it).
    fn packed_operand(
        &self,
        ki: usize,
        j: usize,
        params: &CallParams,
        dims: &[i64],
        bufs: &mut Vec<*mut c_void>,
        plan: &ShapePlan,
    ) -> Result<Arc<Packed>> {
        let g = &self.meta.graph;
        let p = &self.meta.kernels[ki].packs[j];
        let Some(Loc::Param(pi)) = plan.locs.get(&p.param).copied() else {
            return Err(Error::Module {
                symbol: self.symbol.clone(),
                msg: format!(
                    "pack {} reads `{}`, which is not a parameter",
                    p.func,
                    g.node(p.param).name
                ),
            });
        };
        // The compiler never packs a state parameter (its contents change in place).
        let Some(weight) = params.tensors[pi] else {
            return Err(Error::Module {
                symbol: self.symbol.clone(),
                msg: format!("pack {} reads state parameter `{}`", p.func, g.params[pi]),
            });
        };
        let bind = |s: &str| g.dyn_dims.iter().position(|d| d == s).map(|i| dims[i]);
        let eval = |d: &autofusion_ir::dim::DimExpr| d.eval(&bind).unwrap_or(0);
        let key = PackKey::new(weight.stamp(), p, &eval);
        let mine = self
            .held_packs()
            .get(&(ki, j))
            .and_then(|list| list.iter().find(|h| h.packed.key == key).map(|h| h.packed.clone()));
        if let Some(packed) = mine {
            return Ok(packed);
        }
        let packed = match packs::lookup(&key) {
            Some(shared) => shared,
            None => packs::publish(self.pack_now(ki, j, key, dims, bufs)?),
        };
        let mut held = self.held_packs();
        let list = held.entry((ki, j)).or_default();
        // One copy per tensor: the same tensor read at other extents replaces its old copy.
        list.retain(|h| h.packed.key.stamp() != packed.key.stamp());
        list.push(HeldPack { tensor: weight.liveness(), packed: packed.clone() });
        Ok(packed)
    }

    /// This module's packed copies, those of dropped tensors let go first.
    fn held_packs(&self) -> std::sync::MutexGuard<'_, HashMap<(usize, usize), Vec<HeldPack>>> {
        let mut held = self.packed.lock().unwrap_or_else(|e| e.into_inner());
        for list in held.values_mut() {
            list.retain(|h| h.tensor.strong_count() > 0);
        }
        held
    }

    /// Run pack function `j` of kernel `ki` into new storage for `key`.
    fn pack_now(
        &self,
        ki: usize,
        j: usize,
        key: PackKey,
        dims: &[i64],
        bufs: &mut Vec<*mut c_void>,
    ) -> Result<Packed> {
        let mut packed = Packed::alloc(key, &self.meta.graph.name)?;
        let [b, k, n] = packed.key.batch_k_n();
        let (t, _) = choose_pack(b, k, n, pool().threads());
        bufs.push(packed.data.as_mut_ptr() as *mut c_void);
        let bp = SendPtr(bufs.as_ptr());
        let f = self.pack_fns[ki][j];
        let dims_ptr = dims.as_ptr() as usize;
        // SAFETY: `bufs` holds the kernel's buffers and the destination, sized by
        // `packed_elems` and the dtype for these extents; blocks write disjoint column
        // groups; scratch is unused by pack functions.
        pool().run(t.block_num as usize, &|blk| unsafe {
            // Rebinding captures the Send wrapper whole (a 2021 closure would capture only
            // its raw-pointer field, which is not Sync).
            #[allow(clippy::redundant_locals)]
            let bp = bp;
            f(bp.0, dims_ptr as *const i64, &t, blk as i64, std::ptr::null_mut())
        });
        bufs.pop();
        self.packs_done.fetch_add(1, Ordering::Relaxed);
        Ok(packed)
    }

    /// How many times this module packed a weight operand (a call packs only operands whose
    /// tensor or extents changed since the last call and that no module of the process holds
    /// packed alike).
    pub fn packs_done(&self) -> usize {
        self.packs_done.load(Ordering::Relaxed)
    }

    /// Number of weight operands this module packs ahead of its kernels.
    pub fn packed_operands(&self) -> usize {
        self.meta.kernels.iter().map(|k| k.packs.len()).sum()
    }

    /// Bytes of the packed operands this module holds (one per weight operand and live weight
    /// tensor; copies shared with other modules count here too, see `packs::live_bytes`).
    pub fn packed_bytes(&self) -> usize {
        let held = self.held_packs();
        // Two kernels of this module may share one copy: count it once.
        let mut seen = std::collections::HashSet::new();
        let copies = held.values().flatten().map(|h| &h.packed);
        copies.filter(|p| seen.insert(Arc::as_ptr(p))).map(|p| p.bytes()).sum()
    }

    /// Run the reference interpreter on the same graph.
    pub fn reference(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let dims = self.bind(inputs)?;
        reference::run(&self.meta.graph, inputs, &dims)
    }

    /// Kernels as (name, ops) for reports.
    pub fn kernel_names(&self) -> Vec<(String, String)> {
        self.meta.kernels.iter().map(|k| (k.name.clone(), k.ops.clone())).collect()
    }

    /// Number of ops that run as kernels in the unfused graph.
    pub fn op_count(&self) -> usize {
        self.meta.graph.kernel_op_count()
    }
}

/// Launch plans a module keeps. A decoder's dims change at every step (the position `P`), so
/// an unbounded cache would grow with every token generated; plans are cheap to make again.
pub const PLANS_KEPT: usize = 64;

/// Insert a plan into a per-dims cache, emptying it first when it is full.
pub(crate) fn keep_plan<K: std::hash::Hash + Eq, V>(cache: &mut HashMap<K, V>, key: K, plan: V) {
    if cache.len() >= PLANS_KEPT {
        cache.clear();
    }
    cache.insert(key, plan);
}

/// A stateful call in the reference interpreter: the outputs, and `state` left as the graph
/// leaves it.
pub(crate) fn reference_with_state(
    g: &Graph,
    inputs: &[&Tensor],
    state: &mut [&mut Tensor],
    call_dims: &[(&str, i64)],
) -> Result<Vec<Tensor>> {
    let dims = bind_with_state(g, inputs, state, call_dims)?;
    let all = merge_state(g, inputs, state.iter().map(|t| &**t).collect());
    let (outputs, after) = reference::run_with_state(g, &all, &dims)?;
    drop(all);
    for (t, new) in state.iter_mut().zip(after) {
        **t = new;
    }
    Ok(outputs)
}

/// `run`'s refusal of a graph that needs state or dims from the caller.
pub(crate) fn stateless(g: &Graph) -> Result<()> {
    let free = caller_dims(g);
    if g.state.is_empty() && free.is_empty() {
        return Ok(());
    }
    Err(Error::Dims {
        graph: g.name.clone(),
        msg: format!(
            "the graph keeps state ({}) or takes dims from the caller ({}): call it with run_with_state",
            g.state.iter().map(|&i| g.params[i].as_str()).collect::<Vec<_>>().join(", "),
            free.join(", ")
        ),
    })
}

/// Check a stateful call's arguments and bind its dims (see `run_with_state`).
pub(crate) fn bind_with_state(
    g: &Graph,
    inputs: &[&Tensor],
    state: &[&mut Tensor],
    call_dims: &[(&str, i64)],
) -> Result<Vec<i64>> {
    if state.len() != g.state.len() || inputs.len() + state.len() != g.params.len() {
        return Err(Error::Dims {
            graph: g.name.clone(),
            msg: format!(
                "takes {} inputs and {} state tensors, got {} and {}",
                g.params.len() - g.state.len(),
                g.state.len(),
                inputs.len(),
                state.len()
            ),
        });
    }
    let all = merge_state(g, inputs, state.iter().map(|t| &**t).collect());
    let mut dims = bind_inputs(g, &all)?;
    let free = caller_dims(g);
    for (name, v) in call_dims {
        let Some(k) = free.iter().position(|d| d == name) else {
            let why = if g.dyn_dims.iter().any(|d| d == name) {
                "is bound from the parameters' shapes"
            } else {
                "is not a dim of the graph"
            };
            return Err(Error::Dims {
                graph: g.name.clone(),
                msg: format!("call dim `{name}` {why} (the caller gives {free:?})"),
            });
        };
        if *v < 0 {
            return Err(Error::Dims {
                graph: g.name.clone(),
                msg: format!("call dim `{name}` = {v} is negative"),
            });
        }
        dims[g.dim_index(&free[k])] = *v;
    }
    if let Some(missing) = free.iter().find(|d| !call_dims.iter().any(|(n, _)| n == d)) {
        return Err(Error::Dims {
            graph: g.name.clone(),
            msg: format!("call dim `{missing}` is not given"),
        });
    }
    Ok(dims)
}

/// `Err` unless cache_write `w` writes inside its cache at these dims.
pub(crate) fn cache_write_fits(
    g: &Graph,
    w: NodeId,
    bind: &dyn Fn(&str) -> Option<i64>,
) -> Result<()> {
    let n = g.node(w);
    let Op::CacheWrite { axis, start } = &n.op else { return Ok(()) };
    let eval = |d: &autofusion_ir::dim::DimExpr| {
        d.eval(bind).map_err(|msg| Error::Dims { graph: g.name.clone(), msg })
    };
    let (cache, new) = (g.node(n.inputs[0]), g.node(n.inputs[1]));
    let (p, s, t) = (eval(start)?, eval(&new.shape[*axis])?, eval(&cache.shape[*axis])?);
    if p < 0 || p.checked_add(s).is_none_or(|end| end > t) {
        return Err(Error::Dims {
            graph: g.name.clone(),
            msg: format!(
                "cache_write `{}` would write positions {p} .. {} of state `{}`, which holds {t} ({start} = {p}, {} new); nothing was written",
                n.name,
                p.saturating_add(s),
                cache.name,
                s
            ),
        });
    }
    Ok(())
}

/// A call's parameters by parameter index: the tensors the module may read as weights (`None`
/// for state, which is never packed) and where each parameter's memory is.
struct CallParams<'a> {
    tensors: Vec<Option<&'a Tensor>>,
    ptrs: Vec<*mut c_void>,
}

impl<'a> CallParams<'a> {
    fn of(inputs: &[&'a Tensor]) -> CallParams<'a> {
        CallParams {
            tensors: inputs.iter().map(|t| Some(*t)).collect(),
            // Kernels never write a parameter that is not state.
            ptrs: inputs.iter().map(|t| t.as_ptr() as *mut c_void).collect(),
        }
    }
    /// The state tensors get new stamps: their contents are about to change.
    fn with_state(g: &Graph, inputs: &[&'a Tensor], state: &mut [&mut Tensor]) -> CallParams<'a> {
        let n = g.params.len();
        let (mut tensors, mut ptrs) = (vec![None; n], vec![std::ptr::null_mut(); n]);
        let mut ins = inputs.iter();
        let mut st = state.iter_mut();
        for i in 0..n {
            if g.state.contains(&i) {
                ptrs[i] = st.next().expect("counts checked").as_mut_ptr() as *mut c_void;
            } else {
                let t = ins.next().expect("counts checked");
                tensors[i] = Some(*t);
                ptrs[i] = t.as_ptr() as *mut c_void;
            }
        }
        CallParams { tensors, ptrs }
    }
}

/// All parameters of `g` in order: `inputs` and `state` interleaved as `g.state` says.
pub(crate) fn merge_state<'a>(
    g: &Graph,
    inputs: &[&'a Tensor],
    state: Vec<&'a Tensor>,
) -> Vec<&'a Tensor> {
    let (mut ins, mut st) = (inputs.iter().copied(), state.into_iter());
    (0..g.params.len())
        .filter_map(|i| if g.state.contains(&i) { st.next() } else { ins.next() })
        .collect()
}

/// The dims the caller gives (`Graph::caller_dims`).
pub fn caller_dims(g: &Graph) -> Vec<String> {
    g.caller_dims()
}

/// Check dtypes and shapes of `inputs` against `g`'s parameters and bind the dynamic dims.
pub fn bind_inputs(g: &Graph, inputs: &[&Tensor]) -> Result<Vec<i64>> {
    if inputs.len() != g.params.len() {
        return Err(Error::Arity {
            graph: g.name.clone(),
            expected: g.params.len(),
            got: inputs.len(),
        });
    }
    let pnodes = g.param_nodes();
    let mut dims: Vec<Option<(i64, usize)>> = vec![None; g.dyn_dims.len()];
    for (i, t) in inputs.iter().enumerate() {
        let n = g.node(pnodes[i]);
        if t.dtype() != n.dtype {
            return Err(Error::DType {
                graph: g.name.clone(),
                param: g.params[i].clone(),
                expected: n.dtype.name().into(),
                got: t.dtype().name().into(),
            });
        }
        if t.shape().len() != n.shape.len() {
            return Err(Error::Shape {
                graph: g.name.clone(),
                param: g.params[i].clone(),
                expected: shape_str(&n.shape),
                got: t.shape().to_vec(),
            });
        }
        for (d, e) in n.shape.iter().enumerate() {
            if let Some(s) = e.as_sym() {
                let k = g.dim_index(s);
                let v = t.shape()[d] as i64;
                match dims[k] {
                    None => dims[k] = Some((v, i)),
                    Some((w, j)) if w != v => {
                        return Err(Error::DimConflict {
                            graph: g.name.clone(),
                            dim: s.to_string(),
                            first: w,
                            first_param: g.params[j].clone(),
                            second: v,
                            second_param: g.params[i].clone(),
                        })
                    }
                    _ => {}
                }
            }
        }
    }
    let dims: Vec<i64> = dims.iter().map(|d| d.map(|x| x.0).unwrap_or(0)).collect();
    let bind = |s: &str| g.dyn_dims.iter().position(|d| d == s).map(|i| dims[i]);
    for (i, t) in inputs.iter().enumerate() {
        let n = g.node(pnodes[i]);
        for (d, e) in n.shape.iter().enumerate() {
            let want = e.eval(&bind).map_err(|msg| Error::Dims {
                graph: g.name.clone(),
                msg: format!("parameter `{}`: {msg}", g.params[i]),
            })?;
            if want != t.shape()[d] as i64 {
                // Only the dims this parameter's shape uses: a weight's error is not about S.
                let used: Vec<String> = n.shape.iter().flat_map(|d| d.symbols()).collect();
                let bound: Vec<String> = g
                    .dyn_dims
                    .iter()
                    .zip(&dims)
                    .filter(|(n, _)| used.contains(n))
                    .map(|(n, v)| format!("{n} = {v}"))
                    .collect();
                let expected = if bound.is_empty() {
                    shape_str(&n.shape)
                } else {
                    format!("{} with {}", shape_str(&n.shape), bound.join(", "))
                };
                return Err(Error::Shape {
                    graph: g.name.clone(),
                    param: g.params[i].clone(),
                    expected,
                    got: t.shape().to_vec(),
                });
            }
        }
    }
    check_slices(g, &dims)?;
    check_indices(g, inputs, &dims)?;
    Ok(dims)
}

/// Every slice within the axis it views at these dims (a slice of a dynamic axis, `x[0]` of
/// a sequence, is checked here, when the call binds it): an `Err` naming the slice otherwise.
fn check_slices(g: &Graph, dims: &[i64]) -> Result<()> {
    let bind = |s: &str| g.dyn_dims.iter().position(|d| d == s).map(|i| dims[i]);
    let eval = |d: &autofusion_ir::dim::DimExpr| {
        d.eval(&bind).map_err(|msg| Error::Dims { graph: g.name.clone(), msg })
    };
    for n in &g.nodes {
        let Op::Slice { axis, start, end } = &n.op else { continue };
        let extent = eval(&g.node(n.inputs[0]).shape[*axis])?;
        let (a, b) = (eval(start)?, eval(end)?);
        if !(0 <= a && a <= b && b <= extent) {
            let bound: Vec<String> =
                g.dyn_dims.iter().zip(dims).map(|(d, v)| format!("{d} = {v}")).collect();
            return Err(Error::Dims {
                graph: g.name.clone(),
                msg: format!(
                    "`{}` takes [{a}, {b}) of axis {axis} of `{}`, which has {extent} elements at {}",
                    n.name,
                    g.node(n.inputs[0]).name,
                    bound.join(", ")
                ),
            });
        }
    }
    Ok(())
}

/// Indices a gather reads that a kernel computed: checked when that kernel is done, before
/// the kernel holding the gather runs (the gather reads them from memory, as the rows kind
/// requires, and plans with such gathers are not pipelined).
pub(crate) struct IndexCheck {
    pub(crate) gather: NodeId,
    /// The kernel writing the ids (a materialised value), and their place in its buffers.
    pub(crate) kernel: usize,
    pub(crate) buffer: usize,
    pub(crate) ids: NodeId,
}

/// The checks of `g`'s gathers whose ids one of `kernels` (each: its buffers, the first
/// `n_inputs` read) writes.
pub(crate) fn computed_indices<'a>(
    g: &Graph,
    kernels: impl Iterator<Item = (&'a [NodeId], usize)> + Clone,
) -> Vec<IndexCheck> {
    let mut out = Vec::new();
    for (id, n) in g.nodes.iter().enumerate() {
        let Op::Gather { .. } = n.op else { continue };
        let ids = n.inputs[1];
        for (kernel, (buffers, n_inputs)) in kernels.clone().enumerate() {
            if let Some(b) = buffers[n_inputs..].iter().position(|b| *b == ids) {
                let gather = NodeId(id as u32);
                out.push(IndexCheck { gather, kernel, buffer: n_inputs + b, ids });
            }
        }
    }
    out
}

/// Bytes of the ids value of `c` at `dims`.
pub(crate) fn index_bytes(g: &Graph, c: &IndexCheck, dims: &[i64]) -> Result<usize> {
    let ids = g.node(c.ids);
    let bind = |s: &str| g.dyn_dims.iter().position(|d| d == s).map(|i| dims[i]);
    let len = ids
        .shape
        .iter()
        .map(|d| d.eval(&bind).map_err(|msg| Error::Dims { graph: g.name.clone(), msg }))
        .product::<Result<i64>>()? as usize;
    Ok(len * ids.dtype.size())
}

/// The ids of `c` (their little-endian bytes, as a kernel wrote them) against their table.
pub(crate) fn check_computed_indices(
    g: &Graph,
    c: &IndexCheck,
    bytes: &[u8],
    dims: &[i64],
) -> Result<()> {
    let n = g.node(c.gather);
    let Op::Gather { axis } = n.op else { return Ok(()) };
    let (table, ids) = (g.node(n.inputs[0]), g.node(c.ids));
    let bind = |s: &str| g.dyn_dims.iter().position(|d| d == s).map(|i| dims[i]);
    let size =
        table.shape[axis].eval(&bind).map_err(|msg| Error::Dims { graph: g.name.clone(), msg })?;
    let values =
        Tensor::from_le_bytes(ids.dtype, &[bytes.len() / ids.dtype.size()], bytes)?.to_i64_vec();
    match values.iter().position(|i| !(-size..size).contains(i)) {
        None => Ok(()),
        Some(at) => Err(Error::Index {
            graph: g.name.clone(),
            param: ids.name.clone(),
            at,
            index: values[at],
            table: table.name.clone(),
            size,
        }),
    }
}

/// Every index a `gather` reads from a parameter (token ids, positions) against the extent of
/// the axis it indexes, before any kernel runs: an id outside the table is an `Err` naming the
/// parameter, the id and the table. (Kernels also clamp each index they compute themselves
/// into the table, so no read is ever out of bounds.)
fn check_indices(g: &Graph, inputs: &[&Tensor], dims: &[i64]) -> Result<()> {
    let bind = |s: &str| g.dyn_dims.iter().position(|d| d == s).map(|i| dims[i]);
    for n in &g.nodes {
        let Op::Gather { axis } = n.op else { continue };
        let (table, ids) = (g.node(n.inputs[0]), g.node(n.inputs[1]));
        let Op::Param { index } = ids.op else { continue };
        let size = table.shape[axis]
            .eval(&bind)
            .map_err(|msg| Error::Dims { graph: g.name.clone(), msg })?;
        let bad = inputs[index]
            .to_i64_vec()
            .into_iter()
            .enumerate()
            .find(|(_, i)| !(-size..size).contains(i));
        if let Some((at, i)) = bad {
            return Err(Error::Index {
                graph: g.name.clone(),
                param: g.params[index].clone(),
                at,
                index: i,
                table: table.name.clone(),
                size,
            });
        }
    }
    Ok(())
}
