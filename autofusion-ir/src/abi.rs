//! The kernel ABI shared by the generated code and the runtime.
//!
//! Every kernel is `void k(void *const *bufs, const int64_t *dims, const af_tiling *t,
//! int64_t block, float *scratch)`: `bufs` holds the kernel's input buffers then its output
//! buffers, `dims` the values of the graph's dynamic dims in `Graph::dyn_dims` order, `t` the
//! tiling chosen at run time, `block` this block's index (0..t->block_num) and `scratch` this
//! block's scratch memory (`Work::scratch_floats` floats). The tiling struct is defined once
//! here and emitted both as C and (checked field by field) as `#[repr(C)]` Rust.
//!
//! A matmul whose B operand is read from a graph parameter (a weight) does not pack B itself:
//! its `KernelMeta::packs` name a pack function per such operand, with the kernel signature,
//! that writes the whole operand in the micro-kernel's sliver layout (`PackMeta`). The runtime
//! runs it once per parameter tensor (again only when another tensor is passed) and appends
//! the packed buffers to the kernel's `bufs` after its outputs, in `packs` order. The module's
//! function table holds the kernels, then every kernel's pack functions in order.

use crate::dim::DimExpr;
use crate::ir::DType;

/// Bumped whenever the layout of `af_tiling`, `af_module` or the kernel signature changes.
pub const ABI_VERSION: u32 = 4;

/// Largest micro-kernel tile of the host matmul template (rows of A, columns of B per sliver);
/// the prelude's `AF_MR_MAX` / `AF_NR_MAX`.
pub const MR_MAX: i64 = 8;
pub const NR_MAX: i64 = 32;

/// Host matmul blocking limits of DynamicTiling: rows and columns of C per work unit, depth
/// per packed block. The host profile's `runtime_blocking` is these, so the cost model prices
/// the tilings the runtime picks.
pub const MC_MAX: i64 = 256;
pub const NC_MAX: i64 = 512;
pub const KC_MAX: i64 = 256;
/// Host flash-attention query and key block limits.
pub const BR_MAX: i64 = 64;
pub const BC_MAX: i64 = 128;

/// `af_tiling` fields, all `int64_t`, in order. `splits` is the number of key ranges a
/// flash kernel's few-queries path (a decode step) splits each KV group's keys into, merged
/// by the last range to finish (0: the tiled path).
pub const TILING_FIELDS: [&str; 8] =
    ["block_num", "rows_per_block", "mc", "nc", "kc", "units", "splits", "reserved1"];

/// The C declarations of the ABI, with layout assertions.
pub fn c_decls() -> String {
    let mut s = String::from("typedef struct af_tiling {\n");
    for f in TILING_FIELDS {
        s += &format!("    int64_t {f};\n");
    }
    s += "} af_tiling;\n";
    s += &format!(
        "_Static_assert(sizeof(af_tiling) == {}, \"af_tiling size\");\n",
        TILING_FIELDS.len() * 8
    );
    for (i, f) in TILING_FIELDS.iter().enumerate() {
        s +=
            &format!("_Static_assert(offsetof(af_tiling, {f}) == {}, \"af_tiling.{f}\");\n", i * 8);
    }
    s += "typedef void (*af_kernel_fn)(void *const *bufs, const int64_t *dims, const af_tiling *t, int64_t block, float *scratch);\n";
    s += "typedef struct af_module {\n    uint32_t abi;\n    uint32_t tiling_size;\n    const char *json;\n    uint64_t json_len;\n    const af_kernel_fn *kernels;\n    uint64_t n_kernels;\n} af_module;\n";
    s
}

/// The work of a kernel, from which DynamicTiling picks the blocking at run time.
#[derive(Clone, Debug, PartialEq)]
pub enum Work {
    /// `rows` rows of `n` elements; `row_buffers` rows of `n` floats of scratch per block.
    Rows { rows: DimExpr, n: DimExpr, row_buffers: u32 },
    /// `batch` independent `m x k` by `k x n` products; scratch holds the packed panels.
    /// `products` matmuls of the same A and shape are computed per output tile (one, or a
    /// matmul with the siblings its epilogue reads: SwiGLU's gate and up), each with its own
    /// C block of scratch (host) or C tile of workspace per AIV (Ascend).
    /// `nc_step`: NC is a multiple of it (1 but for an epilogue walking the output as heads
    /// of that width, `group::NaturalSplit`: each C block holds whole heads).
    MatMul { batch: DimExpr, m: DimExpr, n: DimExpr, k: DimExpr, products: u32, nc_step: DimExpr },
    /// `batch` attention problems of `sq` queries over `sk` keys, head dims `d` (QK) and `dv`
    /// (V); `mc`/`nc` of the tiling are the query and key block sizes. Each `group` of
    /// consecutive problems reads the same K and V (grouped-query attention; 1 without).
    Flash { batch: DimExpr, sq: DimExpr, sk: DimExpr, d: DimExpr, dv: DimExpr, group: DimExpr },
    /// Matmuls launched together, each `(batch, m, n, k)`, sharing one blocking (NC a
    /// multiple of `nc_step`, as for `MatMul`).
    Horizontal { parts: Vec<(DimExpr, DimExpr, DimExpr, DimExpr)>, nc_step: DimExpr },
}

/// What the runtime needs to launch one kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelMeta {
    /// The C function name (readable: kernel index and first output).
    pub name: String,
    /// Values passed in `bufs`: `n_inputs` inputs, then outputs.
    pub buffers: Vec<crate::ir::NodeId>,
    pub n_inputs: usize,
    pub work: Work,
    /// The ops it holds, for error messages and reports.
    pub ops: String,
    /// B operands read from parameters, packed once per parameter tensor by the runtime.
    pub packs: Vec<PackMeta>,
}

/// One matmul B operand packed ahead of the kernel: `batch` matrices of `k x n`, each stored as
/// slivers of NR columns (NR = the micro-kernel's, chosen at run time), sliver `s` of matrix
/// `b` at elements `((b * ceil(n / NR) + s) * k) * NR`, row `kk` of the sliver at `+ kk * NR`,
/// columns past `n` zero. The pack function runs with `t->units` = `batch * ceil(n / NR_MAX)`
/// column groups of `NR_MAX` columns, `t->rows_per_block` groups per block.
///
/// The elements keep the weight's own dtype (`dtype`): an f16 or bf16 weight is packed as its
/// bits and widened, exactly, by the micro-kernel as it loads B, so a 16-bit weight's packed
/// copy is half the size of an f32 one and the products are the same.
///
/// What the packed operand holds is fixed by the weight tensor and `(dtype, batch_dims, k, n,
/// offset, strides)` evaluated at the call's dims: element `(b.., kk, j)` of B is element
/// `offset + sum(index * stride)` of the weight. The runtime shares one packed copy between
/// every kernel and module of the process whose pack agrees on all of these for one tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct PackMeta {
    /// The C function (`<kernel>_pack<i>`).
    pub func: String,
    /// The parameter the operand is read from (through views).
    pub param: crate::ir::NodeId,
    /// Element type of the packed operand (the parameter's dtype).
    pub dtype: DType,
    pub batch: DimExpr,
    pub k: DimExpr,
    pub n: DimExpr,
    /// B's batch extents (their product is `batch`; broadcast batch axes have stride 0).
    pub batch_dims: Vec<DimExpr>,
    /// Where B's element (0.., 0, 0) is in the parameter, in elements.
    pub offset: DimExpr,
    /// Strides of B's axes (batch dims, K, N) in the parameter, in elements.
    pub strides: Vec<DimExpr>,
}

/// Elements a packed operand takes for any NR dividing `NR_MAX` (columns rounded up to
/// `NR_MAX`).
pub fn packed_elems(batch: i64, k: i64, n: i64) -> i64 {
    batch.max(0) * ((n.max(0) + NR_MAX - 1) / NR_MAX * NR_MAX) * k.max(0)
}

/// Dynamic dims at the start of an Ascend kernel's args table (int64 each), before the
/// module's buffer addresses (uint64 each).
pub const ASCEND_MAX_DIMS: usize = 16;

/// `AfTiling` int64 fields of an Ascend kernel, in order (emitted in the generated Ascend C
/// and mirrored by the runtime): launch size, UB chunk columns, matmul / flash tile sizes and
/// the user-workspace floats per AIV, the matmul's tile order (`ascend_n_major`), and the key
/// ranges of a flash-decoding launch.
pub const ASCEND_TILING_FIELDS: [&str; 9] =
    ["block_num", "chunk", "mc", "nc", "br", "bc", "ws_floats", "n_major", "splits"];

/// Share of an Ascend chip's L2 (192 MB on the 910B, an assumption of the `ascend910b`
/// profile) a matmul's resident operand may take: the rest holds the streamed panels.
pub const ASCEND_L2_RESIDENT_BYTES: f64 = 0.8 * (192u64 << 20) as f64;

/// The order an Ascend matmul walks its `mt` x `nt` output tiles in. The cores take
/// consecutive tiles at once, so in row-panel order (M-major) they share an A panel and each
/// pass over the row panels reads all of B; in column-panel order (N-major) they share a B
/// panel, B is read from memory once and A once per column panel. Column panels when A stays
/// in L2 between them (then each operand leaves memory once: it is also the order whose A
/// reads all happen at the start, while A may still be in L2 from its producer); otherwise the
/// order whose re-reads cost less. Bytes as the cube reads the operands.
pub fn ascend_n_major(a_bytes: f64, b_bytes: f64, mt: f64, nt: f64) -> bool {
    let l2 = ASCEND_L2_RESIDENT_BYTES;
    if a_bytes <= l2 {
        return true;
    }
    let m_major = a_bytes + if b_bytes <= l2 { b_bytes } else { b_bytes * mt };
    let n_major = b_bytes + a_bytes * nt;
    n_major < m_major
}

/// The `TCubeTiling` fields DynamicTiling fills (doc `ADV/矩阵计算/Matmul-Tiling类/TCubeTiling结构体.md`),
/// carried as int32 by name so the toolkit's own struct layout may differ between versions.
pub const ASCEND_CUBE_FIELDS: [&str; 23] = [
    "usedCoreNum",
    "M",
    "N",
    "Ka",
    "Kb",
    "singleCoreM",
    "singleCoreN",
    "singleCoreK",
    "baseM",
    "baseN",
    "baseK",
    "depthA1",
    "depthB1",
    "stepM",
    "stepN",
    "isBias",
    "transLength",
    "iterateOrder",
    "stepKa",
    "stepKb",
    "dbL0A",
    "dbL0B",
    "dbL0C",
];

/// Size of `AfTiling`: the int64 fields and two cube field sets (a multiple of 8 bytes).
pub const fn ascend_tiling_bytes() -> usize {
    ASCEND_TILING_FIELDS.len() * 8 + 2 * ASCEND_CUBE_FIELDS.len() * 4
}

/// Fewest keys a flash-decoding range gets on Ascend: IFA's `SplitBNS` lowers its split count
/// while a range would hold fewer than 512 (docs/ascend-decode.md).
pub const ASCEND_SPLIT_MIN_KEYS: i64 = 512;
/// Most ranges a query block is split into (the merge keeps one weight per range in the
/// kernel's 64-float row state).
pub const ASCEND_SPLITS_MAX: i64 = 64;

/// Key ranges per query block of an Ascend flash kernel (flash-decoding), as DynamicTiling
/// chooses them and the cost model prices them: when `units` (query blocks of `sk` keys,
/// key blocks of `bc`) leave at least half of the `aivs` idle, as many ranges as fill them,
/// each of at least `ASCEND_SPLIT_MIN_KEYS` keys and one key block; 1 otherwise.
pub fn ascend_flash_splits(units: i64, sk: i64, bc: i64, aivs: i64) -> i64 {
    if units <= 0 || 2 * units > aivs {
        return 1;
    }
    let key_blocks = (sk + bc.max(1) - 1) / bc.max(1);
    (aivs / units).min(sk / ASCEND_SPLIT_MIN_KEYS).min(key_blocks).clamp(1, ASCEND_SPLITS_MAX)
}

#[cfg(test)]
mod tile_order_tests {
    use super::ascend_n_major;

    #[test]
    fn column_panels_when_a_stays_in_l2_else_the_cheaper_order() {
        let mb = |x: f64| x * (1u64 << 20) as f64;
        // FFN at S 2048, d 4096 as the cube reads it (f32): A 32 MB stays, B streams once.
        assert!(ascend_n_major(mb(32.0), mb(256.0), 16.0, 128.0));
        // A too big, B fits: row panels read A once and B from L2.
        assert!(!ascend_n_major(mb(1024.0), mb(16.0), 512.0, 4.0));
        // Neither fits: the order with fewer re-read bytes.
        assert!(ascend_n_major(mb(200.0), mb(4000.0), 64.0, 2.0));
        assert!(!ascend_n_major(mb(4000.0), mb(200.0), 2.0, 64.0));
    }
}
