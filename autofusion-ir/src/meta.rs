//! What a generated module tells the runtime about itself: the JSON embedded in every host
//! library (`ModuleMeta`) and every Ascend library (`AscendMeta`).

use crate::abi::{KernelMeta, Work};
use crate::ir::{Graph, NodeId};

/// Which build of a graph: the planned one, or one kernel per op (the unfused baseline).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    Fused,
    Unfused,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Fused => "fused",
            Variant::Unfused => "unfused",
        }
    }
}

/// What a generated host library embeds for the runtime (as JSON in its module descriptor).
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleMeta {
    pub abi: u32,
    pub hash: String,
    pub variant: String,
    pub graph: Graph,
    pub kernels: Vec<KernelMeta>,
    /// The plan summary lines, without the generated-files line.
    pub summary: Vec<String>,
    /// Run all kernels in one parallel region (the `pipeline` rule).
    pub pipeline: bool,
}

/// The JSON a generated Ascend module exports through `<symbol>_ascend_json`.
#[derive(Clone, Debug, PartialEq)]
pub struct AscendMeta {
    pub kernels: Vec<AscendKernel>,
    /// Module buffers in args-table order (after the dims).
    pub buffers: Vec<NodeId>,
    pub pipeline: bool,
}

/// What the runtime needs to launch one Ascend kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct AscendKernel {
    pub name: String,
    /// Module buffers this kernel reads (first `n_inputs`) and writes.
    pub buffers: Vec<NodeId>,
    pub n_inputs: usize,
    pub work: Work,
    pub ops: String,
    /// Uses the cube (mix 1:2 launch: `block_num` AI-core groups) or vector only
    /// (`block_num` AIVs).
    pub mix: bool,
    /// UB bytes per column of a chunk, and fixed UB bytes, of its vector part: DynamicTiling
    /// picks `chunk = (UB - fixed) / per_col`, rounded down to 8 columns.
    pub ub_per_col: u32,
    pub ub_fixed: u32,
    /// `TCubeTiling`s it reads from `AfTiling::cube` (0, 1 or 2). Its Matmul objects use
    /// them: flash attention's two products one each; a matmul's sibling product and a
    /// horizontal kernel's objects share one.
    pub cube: u32,
    /// Whether the user workspace holds a staged A / B operand (contiguous, in the element
    /// type its Matmul object reads).
    pub stage_a: bool,
    pub stage_b: bool,
    /// Per `TCubeTiling` (per Matmul object in a horizontal kernel, whose objects share the
    /// first), the bytes of one A / B element the cube reads: 2 (half or bfloat16_t,
    /// accumulated in f32 in L0C, as the cube computes) or 4 (f32).
    pub cube_bytes: Vec<u32>,
}
