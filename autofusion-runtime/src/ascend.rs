//! The Ascend device (feature `ascend`): AscendCL through bindgen-generated FFI, and
//! `AscendModule`, a graph variant's generated Ascend C kernels launched on a stream.
//!
//! Per call: inputs are checked and the dims bound (as on the CPU), the per-shape launch plan
//! (DynamicTiling of every kernel, buffer sizes, workspace) is taken from the cache or made,
//! each parameter keeps one device copy that is reused while the same tensor (same contents
//! stamp) comes back, so weights are uploaded once and new activations each call, the args table (dims, then one device address
//! per module buffer) and the tiling structs are copied to the device, the kernels (or the
//! opt_level-3 pipeline kernel) are launched through the module's `extern "C"` launcher and
//! the stream is synchronised; outputs are copied back. Every ACL return code is checked and
//! reported with `aclGetRecentErrMsg`.

use crate::error::{Error, Result};
use crate::exec::bind_inputs;
use crate::tensor::Tensor;
use crate::tiling::{choose_ascend, AscendCores, AscendLaunch, AscendTiling, ASCEND_SYS_WORKSPACE};
use autofusion_ir::abi::ASCEND_MAX_DIMS;
use autofusion_ir::ir::{Graph, NodeId, Op};
use autofusion_ir::meta::AscendMeta;
use once_cell::sync::OnceCell;
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::sync::{Arc, Mutex};

use autofusion_ascend_sys::acl as sys;

/// `extern "C" int32_t <symbol>_launch(kernel, block_dim, stream, args, tilings, workspace)`.
pub type LaunchFn = unsafe extern "C" fn(u32, u32, *mut c_void, *mut u8, *mut u8, *mut u8) -> i32;

fn device_name(n: u32) -> String {
    format!("Ascend({n})")
}

fn recent_msg() -> String {
    // SAFETY: aclGetRecentErrMsg returns null or a valid C string owned by ACL.
    unsafe {
        let p = sys::aclGetRecentErrMsg();
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().trim().to_string()
        }
    }
}

/// An ACL return code as an error naming the call.
fn check(device: u32, call: &str, code: sys::aclError) -> Result<()> {
    if code == sys::ACL_SUCCESS as sys::aclError {
        return Ok(());
    }
    let msg = recent_msg();
    Err(Error::Device {
        device: device_name(device),
        msg: format!(
            "{call} failed with ACL error {code}{}",
            if msg.is_empty() { String::new() } else { format!(": {msg}") }
        ),
    })
}

/// `aclInit` once per process (never finalised: ACL forbids a second `aclInit`).
fn acl_init(device: u32) -> Result<()> {
    static INIT: OnceCell<std::result::Result<(), Error>> = OnceCell::new();
    INIT.get_or_init(|| {
        // SAFETY: a null config path is allowed.
        check(device, "aclInit", unsafe { sys::aclInit(std::ptr::null()) })
    })
    .clone()
}

thread_local! {
    static CURRENT: Cell<Option<u32>> = const { Cell::new(None) };
}

/// Make `device` current on this thread (`aclrtSetDevice` binds the device's default context
/// to the calling thread).
fn use_device(device: u32) -> Result<()> {
    acl_init(device)?;
    if CURRENT.with(|c| c.get()) == Some(device) {
        return Ok(());
    }
    let mut count = 0u32;
    // SAFETY: plain out-parameter.
    check(device, "aclrtGetDeviceCount", unsafe { sys::aclrtGetDeviceCount(&mut count) })?;
    if device >= count {
        return Err(Error::Device {
            device: device_name(device),
            msg: format!("this machine has {count} Ascend device(s)"),
        });
    }
    // SAFETY: the id was checked against the count.
    check(device, "aclrtSetDevice", unsafe { sys::aclrtSetDevice(device as i32) })?;
    CURRENT.with(|c| c.set(Some(device)));
    Ok(())
}

/// Check that `device` is usable (initialises ACL and binds the device to this thread).
pub fn check_device(device: u32) -> Result<()> {
    use_device(device)
}

/// The cube and vector cores of `device`, asked of AscendCL once (`aclGetDeviceCapability`,
/// `ACL_DEVICE_INFO_AI_CORE_NUM` / `ACL_DEVICE_INFO_VECTOR_CORE_NUM`, acl_base_rt.h): the
/// 910B SKUs differ (24 cube cores on a 910B2, 20 on a 910B3 / B4), and a launch of more blocks
/// than the chip has hangs in `SyncAll`.
fn device_cores(device: u32) -> Result<AscendCores> {
    static CORES: OnceCell<Mutex<HashMap<u32, AscendCores>>> = OnceCell::new();
    let cache = CORES.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(c) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&device) {
        return Ok(*c);
    }
    use_device(device)?;
    let ask = |info: sys::aclDeviceInfo, what: &str| -> Result<i64> {
        let mut v = 0i64;
        // SAFETY: plain out-parameter; the device was made current above.
        check(device, what, unsafe { sys::aclGetDeviceCapability(device, info, &mut v) })?;
        Ok(v)
    };
    let aic =
        ask(sys::aclDeviceInfo_ACL_DEVICE_INFO_AI_CORE_NUM, "aclGetDeviceCapability(AI_CORE_NUM)")?;
    let aiv = ask(
        sys::aclDeviceInfo_ACL_DEVICE_INFO_VECTOR_CORE_NUM,
        "aclGetDeviceCapability(VECTOR_CORE_NUM)",
    )?;
    if aic < 1 || aiv < 2 {
        return Err(Error::Device {
            device: device_name(device),
            msg: format!("AscendCL reports {aic} cube and {aiv} vector cores; mix 1:2 kernels need at least 1 and 2"),
        });
    }
    let cores = AscendCores { aic, aiv };
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(device, cores);
    Ok(cores)
}

/// Device memory (freed on drop).
struct DevBuf {
    ptr: *mut c_void,
    bytes: usize,
    device: u32,
}

// SAFETY: a device address is a plain number to the host; every use goes through ACL calls
// made under the owning module's lock.
unsafe impl Send for DevBuf {}

impl DevBuf {
    fn new(device: u32, bytes: usize) -> Result<DevBuf> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: out-parameter; the size is at least 1.
        check(device, &format!("aclrtMalloc({bytes} bytes)"), unsafe {
            sys::aclrtMalloc(
                &mut ptr,
                bytes.max(1),
                sys::aclrtMemMallocPolicy_ACL_MEM_MALLOC_HUGE_FIRST,
            )
        })?;
        Ok(DevBuf { ptr, bytes: bytes.max(1), device })
    }
    fn addr(&self, off: usize) -> u64 {
        self.ptr as u64 + off as u64
    }
    /// Copy `src` to the device at byte offset `off`.
    fn upload(&self, off: usize, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        assert!(off + src.len() <= self.bytes, "upload past the end of a device buffer");
        // SAFETY: the destination range lies inside this allocation (asserted), the source is
        // a live host slice.
        check(self.device, "aclrtMemcpy(host to device)", unsafe {
            sys::aclrtMemcpy(
                (self.ptr as *mut u8).add(off) as *mut c_void,
                self.bytes - off,
                src.as_ptr() as *const c_void,
                src.len(),
                sys::aclrtMemcpyKind_ACL_MEMCPY_HOST_TO_DEVICE,
            )
        })
    }
    /// Copy `dst.len()` bytes from the device at byte offset `off`.
    fn download(&self, off: usize, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        assert!(off + dst.len() <= self.bytes, "download past the end of a device buffer");
        // SAFETY: as in `upload`, the other way.
        check(self.device, "aclrtMemcpy(device to host)", unsafe {
            sys::aclrtMemcpy(
                dst.as_mut_ptr() as *mut c_void,
                dst.len(),
                (self.ptr as *const u8).add(off) as *const c_void,
                dst.len(),
                sys::aclrtMemcpyKind_ACL_MEMCPY_DEVICE_TO_HOST,
            )
        })
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by aclrtMalloc and freed once. An error here cannot be reported.
        unsafe {
            let _ = sys::aclrtFree(self.ptr);
        }
    }
}

/// Everything that depends only on the bound dims.
#[derive(Debug)]
pub struct AscendPlan {
    pub dims: Vec<i64>,
    pub launches: Vec<AscendLaunch>,
    /// Block dim of the pipeline kernel (1:2 groups) when the module runs as one launch.
    pub pipeline_groups: Option<u32>,
    /// Bytes of every module buffer.
    pub bytes: Vec<usize>,
    /// Offset of each non-parameter buffer in the device arena.
    offsets: Vec<Option<usize>>,
    /// Arena layout: buffers, then args table, tilings, workspace.
    args_off: usize,
    tilings_off: usize,
    ws_off: usize,
    pub arena_bytes: usize,
    out_shapes: Vec<Vec<usize>>,
}

struct DevState {
    stream: sys::aclrtStream,
    /// Per parameter: the stamp of the tensor whose contents are on the device, and the copy.
    params: HashMap<usize, (u64, DevBuf)>,
    arena: Option<DevBuf>,
}

// SAFETY: the stream handle is used only under the module's lock.
unsafe impl Send for DevState {}

impl Drop for DevState {
    fn drop(&mut self) {
        // SAFETY: created by aclrtCreateStream; synchronised before destruction.
        unsafe {
            let _ = sys::aclrtSynchronizeStream(self.stream);
            let _ = sys::aclrtDestroyStream(self.stream);
        }
    }
}

/// What an Ascend launch plan depends on: the device's cores and the bound dims.
type PlanKey = (AscendCores, Vec<i64>);

/// A loaded Ascend graph variant.
pub struct AscendModule {
    symbol: String,
    graph: Graph,
    meta: AscendMeta,
    launch: LaunchFn,
    /// Launch plans by the device's cores and the bound dims.
    plans: Mutex<HashMap<PlanKey, Arc<AscendPlan>>>,
    devices: Mutex<HashMap<u32, DevState>>,
    /// Gathers whose ids a kernel computes: checked after that kernel (found once, at load).
    index_checks: Vec<crate::exec::IndexCheck>,
}

impl AscendModule {
    /// A module from its graph, launcher and JSON.
    ///
    /// # Safety
    /// `launch` and `json` must be the `<symbol>_launch` and `<symbol>_ascend_json` functions
    /// generated for this graph by autofusion's Ascend C generator.
    pub unsafe fn from_raw(
        graph: Graph,
        launch: LaunchFn,
        json: unsafe extern "C" fn() -> *const c_char,
        symbol: &str,
    ) -> Result<AscendModule> {
        let err = |msg: String| Error::Module { symbol: symbol.to_string(), msg };
        let p = json();
        if p.is_null() {
            return Err(err("the Ascend module JSON is null".into()));
        }
        let meta: AscendMeta = autofusion_ir::json::parse(CStr::from_ptr(p).to_bytes())
            .map_err(|e| err(format!("bad Ascend metadata: {e}")))?;
        if graph.dyn_dims.len() > ASCEND_MAX_DIMS {
            return Err(err(format!(
                "{} dynamic dims; the Ascend args table holds {ASCEND_MAX_DIMS}",
                graph.dyn_dims.len()
            )));
        }
        for b in &meta.buffers {
            if b.0 as usize >= graph.nodes.len() {
                return Err(err(format!("buffer {b} is not a node of graph `{}`", graph.name)));
            }
        }
        let index_checks = crate::exec::computed_indices(
            &graph,
            meta.kernels.iter().map(|k| (k.buffers.as_slice(), k.n_inputs)),
        );
        Ok(AscendModule {
            index_checks,
            symbol: symbol.into(),
            graph,
            meta,
            launch,
            plans: Mutex::new(HashMap::new()),
            devices: Mutex::new(HashMap::new()),
        })
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    pub fn meta(&self) -> &AscendMeta {
        &self.meta
    }
    pub fn symbol(&self) -> &str {
        &self.symbol
    }

    /// The launch plan for these dims on an Ascend910B2 (24 cube, 48 vector cores), for
    /// reports; `run` plans for the cores of the device it runs on.
    pub fn shape_plan(&self, dims: &[i64]) -> Result<Arc<AscendPlan>> {
        self.plan_for(AscendCores::A2_24, dims)
    }

    /// The launch plan for these dims on a device with `cores` (cached).
    pub fn plan_for(&self, cores: AscendCores, dims: &[i64]) -> Result<Arc<AscendPlan>> {
        let key = (cores, dims.to_vec());
        if let Some(p) = self.plans.lock().unwrap().get(&key) {
            return Ok(p.clone());
        }
        let p = Arc::new(self.make_plan(cores, dims)?);
        crate::exec::keep_plan(&mut self.plans.lock().unwrap(), key, p.clone());
        Ok(p)
    }

    fn make_plan(&self, cores: AscendCores, dims: &[i64]) -> Result<AscendPlan> {
        let g = &self.graph;
        let bind = |s: &str| g.dyn_dims.iter().position(|d| d == s).map(|i| dims[i]);
        let dim_err = |msg: String| Error::Dims { graph: g.name.clone(), msg };
        let eval = |d: &autofusion_ir::dim::DimExpr| d.eval(&bind).unwrap_or(0);
        let shape = |id: NodeId| -> Result<Vec<usize>> {
            g.node(id)
                .shape
                .iter()
                .map(|d| {
                    let v = d.eval(&bind).map_err(dim_err)?;
                    usize::try_from(v).map_err(|_| dim_err(format!("extent {d} = {v}")))
                })
                .collect()
        };
        let kerr = |msg: String| Error::Module { symbol: self.symbol.clone(), msg };
        // The pipeline runs every kernel in one mix launch of all 1:2 groups.
        let pipeline_aivs = self.meta.pipeline.then_some(2 * cores.groups());
        let mut launches = Vec::new();
        let mut ws = 0usize;
        for k in &self.meta.kernels {
            let (l, w) = choose_ascend(k, &eval, cores, pipeline_aivs).map_err(kerr)?;
            launches.push(l);
            ws = ws.max(w);
        }
        for w in g.state_writes() {
            crate::exec::cache_write_fits(g, w, &bind)?;
        }
        let mut bytes = Vec::new();
        let mut offsets = Vec::new();
        let mut off = 0usize;
        // Device buffers: sizes checked for overflow before anything is allocated.
        let overflow = |what: &'static str| {
            let mut f = crate::memory::Footprint::default();
            f.add(what, None);
            f.check(&g.name, &format!("dims {dims:?}"), 0).unwrap_err()
        };
        for &b in &self.meta.buffers {
            let n = crate::memory::tensor_bytes(&shape(b)?, g.node(b).dtype.size())
                .ok_or_else(|| overflow("device buffers"))?;
            bytes.push(n);
            if param_of(g, b).is_some() {
                offsets.push(None);
            } else {
                offsets.push(Some(off));
                off = n
                    .checked_next_multiple_of(512)
                    .and_then(|n| off.checked_add(n))
                    .ok_or_else(|| overflow("device arena"))?;
            }
        }
        let args_off = off;
        off += ((ASCEND_MAX_DIMS + self.meta.buffers.len()) * 8).div_ceil(512) * 512;
        let tilings_off = off;
        off += (self.meta.kernels.len() * std::mem::size_of::<AscendTiling>()).div_ceil(512) * 512;
        let ws_off = off;
        off += ASCEND_SYS_WORKSPACE + ws;
        let out_shapes = g.outputs.iter().map(|o| shape(*o)).collect::<Result<Vec<_>>>()?;
        Ok(AscendPlan {
            dims: dims.to_vec(),
            launches,
            pipeline_groups: pipeline_aivs.map(|a| (a / 2) as u32),
            bytes,
            offsets,
            args_off,
            tilings_off,
            ws_off,
            arena_bytes: off,
            out_shapes,
        })
    }

    /// Run the kernels on `device`.
    pub fn run(&self, device: u32, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        crate::exec::stateless(&self.graph)?;
        let dims = bind_inputs(&self.graph, inputs)?;
        Ok(self.run_on(device, inputs, &dims)?.0)
    }

    /// `Module::run_with_state` on `device`. The device keeps its copy of each cache between
    /// calls (the host tensor, updated from it after each call, keeps its identity there).
    pub fn run_with_state(
        &self,
        device: u32,
        inputs: &[&Tensor],
        state: &mut [&mut Tensor],
        call_dims: &[(&str, i64)],
    ) -> Result<Vec<Tensor>> {
        let g = &self.graph;
        let dims = crate::exec::bind_with_state(g, inputs, state, call_dims)?;
        let all = crate::exec::merge_state(g, inputs, state.iter().map(|t| &**t).collect());
        let (outs, after) = self.run_on(device, &all, &dims)?;
        drop(all);
        let mut devs = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        let st = devs.get_mut(&device).expect("the call made the device state");
        for ((t, chunks), &i) in state.iter_mut().zip(after).zip(&g.state) {
            let base = t.as_mut_ptr();
            for (off, bytes) in chunks {
                // SAFETY: `written_bytes` keeps every chunk inside the cache's `nbytes`.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(off), bytes.len())
                };
            }
            if let Some(held) = st.params.get_mut(&i) {
                held.0 = t.stamp(); // the device copy is what the tensor now holds
            }
        }
        Ok(outs)
    }

    /// The kernels on `device` with every parameter in `inputs`; returns the outputs and what
    /// the call wrote into each state parameter (in `Graph::state` order).
    fn run_on(
        &self,
        device: u32,
        inputs: &[&Tensor],
        dims: &[i64],
    ) -> Result<(Vec<Tensor>, Vec<Written>)> {
        let g = &self.graph;
        let dims = dims.to_vec();
        let plan = self.plan_for(device_cores(device)?, &dims)?;
        use_device(device)?;
        let mut devs = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        let st = match devs.entry(device) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let mut stream = std::ptr::null_mut();
                // SAFETY: out-parameter; the device is current on this thread.
                check(device, "aclrtCreateStream", unsafe { sys::aclrtCreateStream(&mut stream) })?;
                v.insert(DevState { stream, params: HashMap::new(), arena: None })
            }
        };
        if st.arena.as_ref().is_none_or(|a| a.bytes < plan.arena_bytes) {
            st.arena = None;
            st.arena = Some(DevBuf::new(device, plan.arena_bytes)?);
        }
        // Parameters: reuse the device copy while the same tensor comes back.
        let pnodes = g.param_nodes();
        for (i, t) in inputs.iter().enumerate() {
            if !self.meta.buffers.contains(&pnodes[i]) {
                continue;
            }
            let fresh = st
                .params
                .get(&i)
                .is_none_or(|(stamp, buf)| *stamp != t.stamp() || buf.bytes < t.nbytes());
            if fresh {
                st.params.remove(&i);
                let buf = DevBuf::new(device, t.nbytes())?;
                // SAFETY: `as_ptr` points at `nbytes` bytes of the tensor's storage.
                buf.upload(0, unsafe { std::slice::from_raw_parts(t.as_ptr(), t.nbytes()) })?;
                st.params.insert(i, (t.stamp(), buf));
            }
        }
        let arena = st.arena.as_ref().unwrap();
        // The args table: dims, then buffer addresses.
        let mut args: Vec<u64> = vec![0; ASCEND_MAX_DIMS + self.meta.buffers.len()];
        for (i, d) in dims.iter().enumerate() {
            args[i] = *d as u64;
        }
        for (j, b) in self.meta.buffers.iter().enumerate() {
            args[ASCEND_MAX_DIMS + j] = match plan.offsets[j] {
                Some(off) => arena.addr(off),
                None => {
                    let i = param_of(g, *b).expect("a buffer outside the arena is a parameter");
                    st.params[&i].1.addr(0)
                }
            };
        }
        let as_bytes = |v: &[u64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).collect() };
        arena.upload(plan.args_off, &as_bytes(&args))?;
        let tilings: Vec<AscendTiling> = plan.launches.iter().map(|l| l.tiling).collect();
        // SAFETY: AscendTiling is repr(C) plain data.
        let tb = unsafe {
            std::slice::from_raw_parts(
                tilings.as_ptr() as *const u8,
                std::mem::size_of_val(&tilings[..]),
            )
        };
        arena.upload(plan.tilings_off, tb)?;
        let (pa, pt, pw) = (
            arena.addr(plan.args_off) as *mut u8,
            arena.addr(plan.tilings_off) as *mut u8,
            arena.addr(plan.ws_off) as *mut u8,
        );
        let launch = |k: usize, block_dim: u32| -> Result<()> {
            // SAFETY: the launcher was generated with this module; the three pointers are
            // device addresses inside the arena, laid out as the kernels read them.
            let rc = unsafe { (self.launch)(k as u32, block_dim, st.stream, pa, pt, pw) };
            if rc != 0 {
                return Err(Error::Module {
                    symbol: self.symbol.clone(),
                    msg: format!("the launcher rejected kernel {k} (code {rc})"),
                });
            }
            Ok(())
        };
        let kname = |k: usize| {
            self.meta.kernels.get(k).map_or_else(
                || "the pipeline".to_string(),
                |k| format!("kernel `{}` ({})", k.name, k.ops),
            )
        };
        let sync = |what: String| -> Result<()> {
            // SAFETY: the stream belongs to this device state.
            check(device, &format!("aclrtSynchronizeStream after {what} of `{}`", g.name), unsafe {
                sys::aclrtSynchronizeStream(st.stream)
            })
        };
        match plan.pipeline_groups {
            Some(groups) if plan.launches.iter().any(|l| !l.empty) => {
                launch(self.meta.kernels.len(), groups)?;
                sync(kname(self.meta.kernels.len()))?;
            }
            Some(_) => {}
            None => {
                for (k, l) in plan.launches.iter().enumerate() {
                    if !l.empty {
                        launch(k, l.block_dim)?;
                        sync(kname(k))?;
                    }
                    // Ids this kernel computed, before a gather reads them.
                    for c in self.index_checks.iter().filter(|c| c.kernel == k) {
                        // The ids are a kernel's output: a module buffer in the arena.
                        let j = self.meta.buffers.iter().position(|b| *b == c.ids);
                        let Some(off) = j.and_then(|j| plan.offsets[j]) else { continue };
                        let mut bytes = vec![0u8; crate::exec::index_bytes(g, c, &dims)?];
                        arena.download(off, &mut bytes)?;
                        crate::exec::check_computed_indices(g, c, &bytes, &dims)?;
                    }
                }
            }
        }
        // Outputs.
        let mut outs = Vec::new();
        for (o, s) in g.outputs.iter().zip(&plan.out_shapes) {
            let mut t = Tensor::zeros(g.node(*o).dtype, s);
            let j = self.meta.buffers.iter().position(|b| b == o).ok_or_else(|| Error::Module {
                symbol: self.symbol.clone(),
                msg: format!("output `{}` is not a module buffer", g.node(*o).name),
            })?;
            let n = t.nbytes();
            // SAFETY: `as_mut_ptr` points at `nbytes` bytes of the new tensor's storage.
            let dst = unsafe { std::slice::from_raw_parts_mut(t.as_mut_ptr(), n) };
            match plan.offsets[j] {
                Some(off) => arena.download(off, dst)?,
                None => {
                    // An output that is a parameter (identity graph): copy the input.
                    let i = pnodes.iter().position(|p| p == o).unwrap();
                    st.params[&i].1.download(0, dst)?
                }
            }
            outs.push(t);
        }
        // The rows each cache write wrote, back to the host (not the whole cache: decode
        // writes one row per KV head).
        let mut after = Vec::new();
        for (&i, w) in g.state.iter().zip(g.state_writes()) {
            let mut chunks = Vec::new();
            for (off, len) in written_bytes(g, w, &dims, inputs[i].nbytes())? {
                let mut bytes = vec![0u8; len];
                st.params[&i].1.download(off, &mut bytes)?;
                chunks.push((off, bytes));
            }
            after.push(chunks);
        }
        Ok((outs, after))
    }

    /// `reference` of a graph with state (see `Module::reference_with_state`).
    pub fn reference_with_state(
        &self,
        inputs: &[&Tensor],
        state: &mut [&mut Tensor],
        call_dims: &[(&str, i64)],
    ) -> Result<Vec<Tensor>> {
        crate::exec::reference_with_state(&self.graph, inputs, state, call_dims)
    }

    /// Run the reference interpreter on the same graph.
    pub fn reference(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let dims = bind_inputs(&self.graph, inputs)?;
        crate::reference::run(&self.graph, inputs, &dims)
    }
}

/// The parameter whose device copy buffer `b` is: a parameter itself, or a cache write (whose
/// result is its cache, written in place).
fn param_of(g: &Graph, b: NodeId) -> Option<usize> {
    match &g.node(b).op {
        Op::Param { index } => Some(*index),
        Op::CacheWrite { .. } => param_of(g, g.node(b).inputs[0]),
        _ => None,
    }
}

/// Bytes a call wrote into one cache: (byte offset, bytes) chunks.
type Written = Vec<(usize, Vec<u8>)>;

/// The byte ranges cache write `w` writes at `dims` in a cache of `total` bytes: the rows
/// `P .. P + S` along its axis for every index of the axes before it, merged into the whole
/// cache when that would take more than 64 copies (a cache written along a late axis).
fn written_bytes(g: &Graph, w: NodeId, dims: &[i64], total: usize) -> Result<Vec<(usize, usize)>> {
    let n = g.node(w);
    let Op::CacheWrite { axis, start } = &n.op else { return Ok(vec![(0, total)]) };
    let bind = |s: &str| g.dyn_dims.iter().position(|d| d == s).map(|i| dims[i]);
    let eval = |d: &autofusion_ir::dim::DimExpr| -> Result<usize> {
        let v = d.eval(&bind).map_err(|msg| Error::Dims { graph: g.name.clone(), msg })?;
        Ok(v.max(0) as usize)
    };
    let shape: Vec<usize> = n.shape.iter().map(eval).collect::<Result<_>>()?;
    let (p, s) = (eval(start)?, eval(&g.node(n.inputs[1]).shape[*axis])?);
    let outer: usize = shape[..*axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product::<usize>() * n.dtype.size();
    let t = shape[*axis];
    if outer > 64 {
        return Ok(vec![(0, total)]);
    }
    // `cache_write_fits` held p + s <= t when the plan was made.
    Ok((0..outer).map(|o| ((o * t + p) * inner, s * inner)).filter(|r| r.1 > 0).collect())
}
