//! Ascend C code generation (Atlas A2 / Ascend 910B, arch 2201): one `.asc` translation unit
//! per graph variant, holding one `extern "C" __global__ __aicore__` kernel per fused group,
//! an `extern "C"` launcher (bisheng compiles the `<<<>>>` launch; Rust cannot) and a module
//! descriptor for the runtime. API facts come from the asc-devkit headers and docs
//! (`mirror-cann/asc-devkit`, `docs/zh/api/SIMD-API/...`) and its samples, cited by path.
//!
//! Every kernel has the same signature, `k(GM_ADDR args, GM_ADDR tilings, GM_ADDR workspace)`:
//! `args` is a device table of `ASCEND_MAX_DIMS` dynamic dims (int64) followed by one device
//! address per module buffer (uint64); `tilings` is one `AfTiling` per kernel, filled by the
//! runtime's DynamicTiling from the actual shapes (the kernel direct-launch dynamic flow of
//! CATLASS's `examples/102_dynamic_optimized_matmul`: a device copy of the struct; the kernel
//! copies its struct from GM once); `workspace` is the system workspace of the Matmul API
//! followed by the user workspace. One signature lets the opt_level-3 pipeline call every
//! kernel body from one launch (as hicann/graph-autofusion's SuperKernel calls compiled kernel
//! bodies from one `__global__` entry) with nothing but the same three pointers.
//!
//! Kernel kinds:
//! - rows (elementwise chains, reductions with their epilogues, add + norm, concat): vector
//!   only (`KERNEL_TYPE_AIV_ONLY`). Rows are spread over the AIVs; each row is streamed in
//!   chunks of `chunk` columns through the TPipe/TQue CopyIn -> Compute -> CopyOut pipeline
//!   (double-buffered queues, `DataCopyPad` so any row length works, the count form of the
//!   vector APIs, 32-byte aligned UB slots: `basic_api/kernel_tpipe.h`,
//!   `kernel_operator_data_copy_intf.h`). Reductions split a row into
//!   phases: a phase that needs a value computed before a reduction recomputes it from the
//!   inputs rather than keeping a whole row on chip, so UB use does not grow with the row.
//! - matmul with prologue/epilogue: mix 1:2 (`KERNEL_TYPE_MIX_AIC_1_2`). The Matmul high-level
//!   API runs on the cube (the AIVs issue the calls: `lib/matmul_intf.h`); each AIV owns output tiles of
//!   `mc x nc`, has the cube write its tile into the AIV's slice of the user workspace, then
//!   applies the epilogue in UB and writes the output (the explicit cube -> GM -> vector split
//!   of the devkit's `matmul_leakyrelu_advanced_api` sample). A norm prologue (or an operand view the Matmul API cannot address) is
//!   applied by the AIVs first, writing the operand once to the workspace, then `SyncAll`: the
//!   split the devkit's fusion-operator guide recommends for LayerNorm + Linear (A = normalised rows written by
//!   the AIVs to a GM workspace), because the cube cannot apply elementwise ops while loading
//!   A and recomputing the statistics per N tile would repeat the vector work. The cube reads
//!   A and B in their own type when they share one: half and bfloat16_t products accumulate
//!   in f32 in L0C (as the cube computes, and as the cost model's 16-bit operand bytes and
//!   fp16 cube rate assume); operands of different types are staged as f32.
//! - flash attention: mix 1:2 with two Matmul objects: S = Q K^T on the cube into the AIV's
//!   BR x BC score tile, the chain (scale, mask) and the online softmax on the AIV (row max,
//!   P = exp(S - max) in place, running max and sum in UB), O += P V on the cube with atomic
//!   accumulation into the AIV's output tile after the AIV rescaled it; no S x S buffer.
//! - horizontal matmul groups: the parts one after the other in one mix launch, each as a
//!   matmul body, sharing the blocking, the C tiles and (per operand layout and type) the
//!   Matmul objects (`kernels/horizontal/ascend.rs`).
//! - the opt_level-3 pipeline: one mix launch calling every body in order, with `SyncAll`
//!   between dependent kernels, AIV-only when neither side uses the cube (SuperKernel syncs only
//!   the core types that need it).

pub(crate) mod cube;
pub(crate) mod vector;

use super::emit::{c_string, Code, Emitter};
use super::{file_header, Backend, Source, Toolchain};
use crate::abi::{Work, ASCEND_CUBE_FIELDS, ASCEND_MAX_DIMS, ASCEND_TILING_FIELDS};
use crate::dim::numel;
use crate::ir::{Graph, NodeId};
use crate::plan::{describe, Group, Plan};
use crate::target::Target;
use crate::{Unit, Variant};
pub use autofusion_ir::meta::AscendKernel;
use autofusion_ir::meta::AscendMeta;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use vector::*;

/// The Ascend backend (Atlas A2 / 910B): Ascend C compiled by the CANN toolkit's bisheng,
/// launched through AscendCL.
pub struct Ascend {
    target: Target,
}

impl Ascend {
    /// Plans with `target` (normally `Target::ascend910b()`).
    pub fn new(target: Target) -> Ascend {
        Ascend { target }
    }
}

impl Default for Ascend {
    fn default() -> Ascend {
        Ascend::new(Target::ascend910b())
    }
}

impl Backend for Ascend {
    fn name(&self) -> &'static str {
        "ascend"
    }
    fn profile(&self) -> &Target {
        &self.target
    }
    fn generate(
        &self,
        unit: &Unit,
        v: Variant,
        plan: &Plan,
        symbol: &str,
    ) -> Result<Source, String> {
        let g = &unit.graph;
        if g.dyn_dims.len() > ASCEND_MAX_DIMS {
            return Err(format!(
                "graph `{}` has {} dynamic dims; the Ascend kernels take at most {ASCEND_MAX_DIMS}",
                g.name,
                g.dyn_dims.len(),
            ));
        }
        let src = generate(g, plan, symbol, &file_header(unit, v, plan))?;
        Ok(Source {
            code: src.code,
            extension: "asc",
            entries: vec![src.launch, src.entry],
            meta_json: src.meta_json,
        })
    }
    fn toolchain(&self) -> Toolchain {
        Toolchain::Bisheng
    }
}

/// Generated Ascend C for one graph variant.
pub struct AscendSource {
    pub code: String,
    /// `extern "C" int32_t <launch>(uint32_t kernel, uint32_t block_dim, void *stream,
    /// uint8_t *args, uint8_t *tilings, uint8_t *workspace)`; kernel = n_kernels launches the
    /// pipeline kernel.
    pub launch: String,
    /// `extern "C" const char *<entry>(void)`: the module JSON.
    pub entry: String,
    /// That JSON (`AscendMeta`).
    pub meta_json: String,
}

/// The files' common part: includes, the tiling struct (mirrored in Rust, offsets asserted
/// there), and small helpers.
fn prelude(c: &mut Code) {
    c.line("#include \"kernel_operator.h\"");
    c.line("#include \"lib/matmul_intf.h\"");
    c.line("#include <stdint.h>");
    c.line("");
    let _ = writeln!(c, "#define AF_MAX_DIMS {ASCEND_MAX_DIMS}");
    let _ = writeln!(c, "#define AF_TF {}", ASCEND_TILING_FIELDS.len());
    let _ = writeln!(c, "#define AF_CF {}", ASCEND_CUBE_FIELDS.len());
    c.line("/* DynamicTiling's per-kernel struct (int64 fields, then two TCubeTiling field sets as int32). */");
    c.open("struct AfTiling");
    for f in ASCEND_TILING_FIELDS {
        let _ = writeln!(c, "int64_t {f};");
    }
    c.line("int32_t cube[2][AF_CF];");
    c.close_with(";");
    let _ = writeln!(
        c,
        "static_assert(sizeof(AfTiling) == {}, \"AfTiling layout\");",
        crate::abi::ascend_tiling_bytes()
    );
    let _ = writeln!(c, "#include \"{}\"", super::ASCEND_HEADER);
}

/// Fill a TCubeTiling from our int32 field set (named fields, so the toolkit's own struct
/// layout may differ between CANN versions).
fn cube_fill(c: &mut Code) {
    c.open("__aicore__ inline void af_cube_tiling(const AfTiling &t, int i, AscendC::tiling::TCubeTiling &c)");
    for (j, f) in ASCEND_CUBE_FIELDS.iter().enumerate() {
        let _ = writeln!(c, "c.{f} = t.cube[i][{j}];");
    }
    c.close();
    c.line("");
}

/// Generate the Ascend C file of one plan.
pub fn generate(
    g: &Graph,
    plan: &Plan,
    symbol: &str,
    header: &str,
) -> Result<AscendSource, String> {
    let mut code = Code::new();
    let _ = writeln!(code, "/* {header}");
    let _ = writeln!(
        code,
        " * Ascend C for Atlas A2 (dav-2201). Generated by autofusion-compiler {}. Do not edit. */",
        env!("CARGO_PKG_VERSION")
    );
    prelude(&mut code);
    cube_fill(&mut code);
    let table = module_table(plan);
    let mut kernels = Vec::new();
    let mut bodies = Vec::new();
    for (ki, grp) in plan.groups.iter().enumerate() {
        let (kernel, fname) = gen_kernel(&mut code, g, &table, symbol, ki, grp)?;
        bodies.push((fname, kernel.mix));
        kernels.push(kernel);
    }
    pipeline(&mut code, symbol, &bodies);
    let launch = launcher(&mut code, symbol, &bodies);
    let json = autofusion_ir::json::write(&AscendMeta {
        kernels,
        buffers: table,
        pipeline: plan.pipeline,
    });
    let entry = format!("{symbol}_ascend_json");
    let _ = writeln!(code, "static const char af_ascend_json[] = {};", c_string(&json));
    let _ = writeln!(code, "extern \"C\" const char *{entry}(void) {{ return af_ascend_json; }}");
    Ok(AscendSource { code: code.finish(), launch, entry, meta_json: json })
}

/// Module buffers: every value a kernel reads or writes, in first-use order.
fn module_table(plan: &Plan) -> Vec<NodeId> {
    let mut table: Vec<NodeId> = Vec::new();
    for grp in &plan.groups {
        for v in grp.inputs.iter().chain(&grp.outputs) {
            if !table.contains(v) {
                table.push(*v);
            }
        }
    }
    table
}

/// What a kernel generator made besides code: the work DynamicTiling splits, whether the
/// kernel uses the cube (mix 1:2) and with how many Matmul objects, and which operands it
/// stages.
pub(crate) struct Emitted {
    pub(crate) work: Work,
    pub(crate) mix: bool,
    pub(crate) cube: u32,
    pub(crate) stage_a: bool,
    pub(crate) stage_b: bool,
    /// Per Matmul object, the bytes of the A / B elements the cube reads.
    pub(crate) cube_bytes: Vec<u32>,
}

impl Emitted {
    /// A kernel of the vector cores alone (`KERNEL_TYPE_AIV_ONLY`).
    pub(crate) fn vector(work: Work) -> Emitted {
        Emitted { work, mix: false, cube: 0, stage_a: false, stage_b: false, cube_bytes: vec![] }
    }
}

/// Kernel `ki` (group `grp`): its comment, its body as a device function and its `__global__`
/// entry. Returns its metadata and its C name.
fn gen_kernel(
    code: &mut Code,
    g: &Graph,
    table: &[NodeId],
    symbol: &str,
    ki: usize,
    grp: &Group,
) -> Result<(AscendKernel, String), String> {
    let mut buf = BTreeMap::new();
    let mut buffers = Vec::new();
    for &v in grp.inputs.iter().chain(&grp.outputs) {
        buf.insert(v, buffers.len());
        buffers.push(v);
    }
    let name = super::kernel_name(g, ki, grp);
    let mut k = K {
        em: Emitter::new(g, buf, &name),
        table: buffers.iter().map(|b| table.iter().position(|x| x == b).unwrap()).collect(),
        ub: Ub::default(),
        setup: Code::new(),
        body: Code::new(),
    };
    let built = crate::kernels::of(grp.kind).ascend(&mut k, grp, &name)?;
    let ops = describe(g, grp);
    kernel_comment(code, g, grp, &name, &ops, built.mix);
    // Global names carry the module symbol: several modules link into one binary.
    let fname = format!("{symbol}_{name}");
    kernel_body_fn(code, &k, ki, &fname, &buffers, built.mix);
    kernel_entry(code, &fname, built.mix);
    let kernel = AscendKernel {
        name,
        buffers,
        n_inputs: grp.inputs.len(),
        work: built.work,
        ops,
        mix: built.mix,
        ub_per_col: k.ub.per_col(),
        ub_fixed: k.ub.fixed(),
        cube: built.cube,
        stage_a: built.stage_a,
        stage_b: built.stage_b,
        cube_bytes: built.cube_bytes,
    };
    Ok((kernel, fname))
}

/// The comment above a kernel: what it computes, why it is fused, what it writes, on which
/// cores, and its source lines.
fn kernel_comment(c: &mut Code, g: &Graph, grp: &Group, name: &str, ops: &str, mix: bool) {
    let why = if grp.rules.is_empty() {
        "one op: nothing fused".to_string()
    } else {
        format!("fused by {}", grp.rules.iter().map(|r| r.name()).collect::<Vec<_>>().join(", "))
    };
    let writes = grp.outputs.iter().map(|o| g.node(*o).name.clone()).collect::<Vec<_>>();
    let cores = if mix { "cube + vector (mix 1:2)" } else { "vector only" };
    let lines: BTreeSet<u32> =
        grp.nodes.iter().map(|n| g.node(*n).line).filter(|l| *l > 0).collect();
    let _ = writeln!(c, "/* {name}: {ops}");
    let _ = writeln!(c, " * {why}; writes {}; {cores}.", writes.join(", "));
    if !lines.is_empty() {
        let lines: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        let _ = writeln!(c, " * source lines: {}", lines.join(", "));
    }
    c.line(" */");
}

/// The kernel as a device function `<fname>_body` (its entry and the pipeline call it): the
/// tiling, dims and buffers bound, the access declarations, the pipe, then the generator's
/// setup, the UB buffers and the body.
fn kernel_body_fn(c: &mut Code, k: &K, ki: usize, fname: &str, buffers: &[NodeId], mix: bool) {
    c.line(format!(
        "__aicore__ inline void {fname}_body(GM_ADDR args, GM_ADDR tilings, GM_ADDR workspace) {{"
    ));
    c.indented(|c| kernel_prologue(c, k, ki, buffers, mix));
    // The access declarations are written one level in already.
    c.append(&k.em.decls);
    c.indented(|c| {
        c.line("AscendC::TPipe pipe;");
        c.append(&k.setup);
        k.ub.decls(c);
        c.append(&k.body);
    });
    c.line("}");
}

/// The start of every kernel body: the tiling and dims loaded, the chunk width, this AIV and
/// the AIV count, and the kernel's buffers as `g<i>`.
fn kernel_prologue(c: &mut Code, k: &K, ki: usize, buffers: &[NodeId], mix: bool) {
    let g = k.em.g;
    if !mix {
        c.line("if ASCEND_IS_AIC { return; } /* vector work: in a mix launch (the pipeline) the cube idles */");
    }
    c.line("AfTiling t;");
    let _ = writeln!(c, "af_load_tiling(tilings, {ki}, t);");
    c.line("int64_t dims[AF_MAX_DIMS];");
    c.line("af_load_dims(args, dims);");
    c.line("(void)dims;");
    c.line("const int64_t CH = t.chunk; /* columns per UB chunk (DynamicTiling, multiple of 8) */");
    c.line("const int64_t aiv = AscendC::GetBlockIdx(), naiv = AscendC::GetBlockNum() * AscendC::GetTaskRatio();");
    for (i, v) in buffers.iter().enumerate() {
        let n = g.node(*v);
        let ty = ascend_type(n.dtype);
        let _ = writeln!(c, "AscendC::GlobalTensor<{ty}> g{i}; /* {} */", n.name);
        let _ = writeln!(
            c,
            "g{i}.SetGlobalBuffer((__gm__ {ty} *)af_buf(args, {}), (uint64_t)({}));",
            k.table[i],
            k.em.dim(&numel(&n.shape))
        );
    }
}

/// The `__global__` head of kernel `fname`. Its kernel type is written on the function: with
/// several kernels in one file bisheng cannot infer it, and `KERNEL_TASK_TYPE_DEFAULT` is
/// read only by the op-project precompile step (asc-devkit `docs/zh/guide/编程指南/编译与运行/
/// 算子编译/约束说明.md`; `impl/basic_api/utils/kernel_utils_macros.h` `ENABLE_FEATURE_FOR_COMPILE`).
/// A mix kernel marks its workspace `__kfc_workspace__`: on arch 2201 `GetSysWorkSpacePtr()`
/// and `GetUserWorkspace()` read the kfc workspace register the launch sets from that parameter
/// (`include/basic_api/kernel_operator_swap_mem_intf.h`, `impl/basic_api/dav_c220/
/// kernel_operator_common_impl.h`), as in the devkit's `matmul_leakyrelu_advanced_api.asc`.
fn global_head(fname: &str, mix: bool) -> String {
    if mix {
        format!("extern \"C\" __global__ __mix__(1, 2) void {fname}(GM_ADDR args, GM_ADDR tilings, __kfc_workspace__ GM_ADDR workspace)")
    } else {
        format!("extern \"C\" __global__ __vector__ void {fname}(GM_ADDR args, GM_ADDR tilings, GM_ADDR workspace)")
    }
}

/// The kernel's `__global__` entry: a call of its body.
fn kernel_entry(c: &mut Code, fname: &str, mix: bool) {
    c.open(global_head(fname, mix));
    let _ = writeln!(c, "{fname}_body(args, tilings, workspace);");
    c.close();
    c.line("");
}

/// The pipeline: every body (named, with whether it is mix) in one mix launch, synchronised
/// by kernel type.
fn pipeline(c: &mut Code, symbol: &str, bodies: &[(String, bool)]) {
    c.line(
        "/* The opt_level-3 pipeline: all kernels in one launch (SuperKernel style). Between two",
    );
    c.line(" * vector kernels only the AIVs synchronise; around a cube kernel every core does. */");
    c.open(global_head(&format!("{symbol}_pipeline"), true));
    for (i, (name, mix)) in bodies.iter().enumerate() {
        if i > 0 {
            let prev_mix = bodies[i - 1].1;
            if *mix || prev_mix {
                c.line("AscendC::SyncAll<false>();");
            } else {
                c.line("if ASCEND_IS_AIV { AscendC::SyncAll(); }");
            }
        }
        let _ = writeln!(c, "{name}_body(args, tilings, workspace);");
    }
    c.close();
    c.line("");
}

/// The host-side launcher of every kernel and of the pipeline (kernel == the kernel count);
/// returns its name.
fn launcher(c: &mut Code, symbol: &str, bodies: &[(String, bool)]) -> String {
    let launch = format!("{symbol}_launch");
    let n = bodies.len();
    let _ = writeln!(
        c,
        "/* Host side: one launcher for every kernel (kernel == {n} launches the pipeline). */"
    );
    c.open(format!("extern \"C\" int32_t {launch}(uint32_t kernel, uint32_t block_dim, void *stream, uint8_t *args, uint8_t *tilings, uint8_t *workspace)"));
    // The case labels sit at the level of the switch.
    c.line("switch (kernel) {");
    for (i, (fname, _)) in bodies.iter().enumerate() {
        let _ = writeln!(c, "case {i}: {fname}<<<block_dim, nullptr, stream>>>(args, tilings, workspace); return 0;");
    }
    let _ = writeln!(c, "case {n}: {symbol}_pipeline<<<block_dim, nullptr, stream>>>(args, tilings, workspace); return 0;");
    c.line("default: return -1;");
    c.line("}");
    c.close();
    launch
}
