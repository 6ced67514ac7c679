//! What the kernel kinds that use the cube share (matmul, flash attention): Matmul API
//! objects and their GM types, operands read in place or staged through the user workspace.

use crate::codegen::ascend::vector::*;
use crate::codegen::emit::{Code, Emitter, Space};
use crate::ir::{DType, Graph, NodeId};
use crate::layout::resolve;
use std::collections::BTreeMap;
use std::fmt::Write;

/// How the Matmul API addresses an operand of `space` (`[batch.., rows, cols]`): `Some((trans,
/// ld))` when one of the last two strides is 1 (ld = the other), `None` otherwise.
pub(crate) fn mm_layout(
    em: &Emitter,
    sp: &Space,
    v: NodeId,
    cube: DType,
) -> Option<(bool, String)> {
    let a = sp.accesses[&v];
    let r = sp.shape.len();
    let view = resolve(em.g, v);
    let strides = crate::layout::space_strides(&view, &em.g.node(v).shape, r);
    if em.g.node(v).dtype != cube {
        return None;
    }
    if strides[r - 1].as_const() == Some(1) {
        Some((false, format!("ac{a}_s{}", r - 2)))
    } else if strides[r - 2].as_const() == Some(1) {
        Some((true, format!("ac{a}_s{}", r - 1)))
    } else {
        None
    }
}

/// How the Matmul API reads an operand: `trans` and leading dimension `ld` as in `mm_layout`,
/// from the operand's own buffer or (`staged`) from the contiguous f32 copy the AIVs wrote to
/// the user workspace.
pub(crate) struct Operand {
    /// The operand and the space it is read in (its access declared).
    pub(crate) v: NodeId,
    pub(crate) sp: Space,
    pub(crate) trans: bool,
    pub(crate) ld: String,
    pub(crate) staged: bool,
    /// The element type the cube reads it in (its own, or its staged copy's).
    pub(crate) ty: DType,
}

/// The element type a Matmul object reads A and B in: their own when both are the same
/// (half and bfloat16_t products accumulate in f32 in L0C, which is how the cube computes:
/// the devkit's `matmul` samples take half A / B into a float C), else f32, the operands
/// staged as f32 copies.
pub(crate) fn cube_type(g: &Graph, a: NodeId, b: NodeId) -> DType {
    let (da, db) = (g.node(a).dtype, g.node(b).dtype);
    if da == db {
        da
    } else {
        DType::F32
    }
}

/// A `matmul::MatmulType` of a GM matrix of `ty` in ND format (`trans` for A and B; C is a
/// float matrix, `None`).
pub(crate) fn gm_matrix(trans: Option<bool>, ty: DType) -> String {
    let t = ascend_type(ty);
    match trans {
        Some(tr) => {
            format!("matmul::MatmulType<AscendC::TPosition::GM, CubeFormat::ND, {t}, {tr}>")
        }
        None => format!("matmul::MatmulType<AscendC::TPosition::GM, CubeFormat::ND, {t}>"),
    }
}

/// The Matmul object `name` of an A (`ta`) by B (`tb`) product of `ty` elements into a GM
/// float C.
pub(crate) fn matmul_object(name: &str, ta: bool, tb: bool, ty: DType) -> String {
    format!(
        "matmul::Matmul<{}, {}, {}> {name};",
        gm_matrix(Some(ta), ty),
        gm_matrix(Some(tb), ty),
        gm_matrix(None, DType::F32)
    )
}

/// A staged operand `name`: `elems` elements of `ty` at the current end of the staged part
/// of the user workspace (counted in floats; a 16-bit copy takes half as many, rounded up).
pub(crate) fn stage_decl(c: &mut Code, name: &str, ty: DType, elems: &str) {
    let t = ascend_type(ty);
    let _ = writeln!(
        c,
        "AscendC::GlobalTensor<{t}> {name}; {name}.SetGlobalBuffer((__gm__ {t} *)(uws + stage), {elems});"
    );
}

/// Move the staged end past `elems` elements of `ty` (floats of the user workspace).
pub(crate) fn stage_advance(c: &mut Code, ty: DType, elems: &str) {
    if ty.size() == 4 {
        let _ = writeln!(c, "stage += {elems};");
    } else {
        let _ = writeln!(c, "stage += (({elems}) + 1) / 2;");
    }
}

/// The user workspace (after the Matmul API's system workspace) and the running size of what
/// is staged at its start.
pub(crate) fn user_workspace(c: &mut Code) {
    c.line("__gm__ float *uws = (__gm__ float *)AscendC::GetUserWorkspace(workspace);");
    c.line("int64_t stage = 0; /* floats of staged operands at the start of the user workspace */");
}

/// The barrier after staging operands.
pub(crate) fn sync_staged(c: &mut Code) {
    c.line(
        "AscendC::SyncAll(); /* every AIV's staged rows are in GM before any tile reads them */",
    );
}

/// How the Matmul API reads operand `v` of space `sp` (rows `rows` = the space's row count,
/// `ncols` columns): directly, or from an f32 copy `w<tag>` the AIVs stage in the user
/// workspace (the staging written here, advancing `stage`).
pub(crate) fn operand(
    k: &mut K,
    mut sp: Space,
    v: NodeId,
    rows: &str,
    ncols: &str,
    cube: DType,
) -> Operand {
    let g = k.em.g;
    k.em.access(&mut sp, v);
    if let Some((trans, ld)) = mm_layout(&k.em, &sp, v, cube) {
        return Operand { v, sp, trans, ld, staged: false, ty: cube };
    }
    let tag = sp.tag;
    let mut srcs = BTreeMap::new();
    let s = k.src(&mut sp, v, "0");
    srcs.insert(v, s);
    let job = Job {
        g,
        gathers: BTreeMap::new(),
        space: sp.shape.clone(),
        nodes: vec![],
        srcs,
        outs: vec![(v, format!("w{tag}"), format!("r{tag} * ({ncols})"), cube)],
        row_i: "0".into(),
        causal_shift: "0".into(),
        col0: "0".into(),
        ncols: ncols.into(),
        tag: tag.into(),
    };
    let what = if g.node(v).dtype == cube {
        "a view the Matmul API cannot address"
    } else {
        "converted to the type its product is computed in"
    };
    let c = &mut k.body;
    let _ = writeln!(
        c,
        "/* stage {} ({what}) as contiguous {} rows in the user workspace */",
        g.node(v).name,
        ascend_type(cube)
    );
    stage_decl(c, &format!("w{tag}"), cube, &format!("({rows}) * ({ncols})"));
    c.open(format!("for (int64_t r{tag} = aiv; r{tag} < {rows}; r{tag} += naiv)"));
    row_offsets(&k.em, &sp, &format!("r{tag}"), c);
    copy_row(&mut k.ub, &job, v, c);
    c.close();
    stage_advance(c, cube, &format!("({rows}) * ({ncols})"));
    Operand { v, sp, trans: false, ld: ncols.to_string(), staged: true, ty: cube }
}

/// `SetOrgShape` arguments of an `m x n` by `kk` product with operand layouts `(ta, lda)`,
/// `(tb, ldb)` (see `mm_layout`) and C rows `ldc` apart.
pub(crate) fn org_shape(
    m: &str,
    n: &str,
    kk: &str,
    (ta, lda): (bool, &str),
    (tb, ldb): (bool, &str),
    ldc: &str,
) -> String {
    format!(
        "(int)({}), (int)({}), (int)({}), (int)({}), (int)({ldc})",
        if ta { lda } else { m },
        if tb { n } else { ldb },
        if ta { kk } else { lda },
        if tb { ldb } else { kk }
    )
}
