//! Horizontal matmul kernels: Ascend C emission.
//!
//! The parts run one after the other in one mix launch, each as a matmul kernel's body does
//! (its operands staged when the Matmul API cannot address them, its tiles computed by the
//! cube into the AIV's C tile, its epilogue applied row by row). What they share: the
//! blocking (`MC x NC`, one `TCubeTiling` sized for the largest part, each product setting
//! its own shapes), the AIVs' C tiles at the start of the user workspace (a part's staging
//! must not overwrite a tile another AIV's previous part still reads), and the Matmul
//! objects: one per distinct operand layout and type.

use crate::abi::Work;
use crate::codegen::ascend::cube::*;
use crate::codegen::ascend::vector::K;
use crate::codegen::ascend::Emitted;
use crate::codegen::emit::Code;
use crate::dim::numel;
use crate::ir::DType;
use crate::kernels::matmul::ascend::*;
use crate::plan::Group;
use std::fmt::Write;

/// The Matmul API allows at most four cube objects in a kernel (`kfc_register_obj.h`).
const MAX_OBJECTS: usize = 4;

/// One part as the first pass leaves it: its dims and staging code, its operands, its
/// epilogue and the Matmul object that computes it.
struct Part<'g> {
    head: Code,
    a: Operand,
    b: Operand,
    epi: Epilogue<'g>,
    object: usize,
}

/// Generates the parts of horizontal group `grp` as one Ascend kernel body.
pub(crate) fn gen_horizontal(k: &mut K, grp: &Group, name: &str) -> Result<Emitted, String> {
    let g = k.em.g;
    user_workspace(&mut k.setup);
    k.setup.line("const int64_t MC = t.mc, NC = t.nc;");
    k.setup.line("stage = naiv * MC * NC; /* the AIVs' C tiles first: a part stages its operands while other AIVs still read their tiles of the part before */");
    k.setup.line("(void)stage; /* read only when a part stages an operand */");
    // First pass: each part's operands, which fix its Matmul object (one per A transposed,
    // B transposed, element type).
    let mut objects: Vec<(bool, bool, DType)> = Vec::new();
    let mut parts = Vec::new();
    let mut dims = Vec::new();
    let mut steps = Vec::new();
    for (anchor, members) in crate::group::horizontal_parts(g, &grp.nodes) {
        let nodes: Vec<_> = grp.nodes.iter().copied().filter(|n| members.contains(n)).collect();
        let mp = MatmulParts::of(g, anchor, &nodes);
        let outer = std::mem::replace(&mut k.body, Code::new());
        let _ = writeln!(k.body, "/* part: {} */", g.node(anchor).name);
        product_dims(&k.em, &mp, &mut k.body);
        let cube = cube_type(g, mp.a_in, mp.b_in);
        let a = matmul_operand_a(k, &mp, cube);
        let b = matmul_operand_b(k, &mp, cube);
        let epi = matmul_epilogue(k, &nodes, &grp.outputs, &mp);
        steps.push(epi.nc_step());
        if a.staged || b.staged {
            sync_staged(&mut k.body);
        }
        let head = std::mem::replace(&mut k.body, outer);
        let sig = (a.trans, b.trans, cube);
        let object = objects.iter().position(|o| *o == sig).unwrap_or_else(|| {
            objects.push(sig);
            objects.len() - 1
        });
        dims.push((numel(&mp.batch), mp.m(), mp.n(), mp.k_dim.clone()));
        parts.push(Part { head, a, b, epi, object });
    }
    if objects.len() > MAX_OBJECTS {
        return Err(format!(
            "{name}: its {} matmuls need {} Matmul objects (operand layouts and types differ); \
             the Matmul API takes at most {MAX_OBJECTS} in one kernel",
            parts.len(),
            objects.len()
        ));
    }
    register_objects(k, &objects);
    // Second pass: the parts' tiles. Objects that take turns on the cube release it after
    // each product; a single object keeps it to the end.
    let end_each = objects.len() > 1;
    k.body.line("int64_t hoff = 0; /* units of the parts before this one */");
    for p in &parts {
        k.body.open("");
        k.body.append(&p.head);
        // Unit `u` of this part is unit `hoff + u` of the kernel: the AIVs carry on where
        // the part before left off, so small parts (a decode step's) spread over all of them.
        k.body.line("const int64_t u0 = (aiv + naiv - hoff % naiv) % naiv;");
        let obj = object_name(p.object);
        let tiles = Tiles { obj: &obj, first_unit: "u0", c_at: "0", end_each };
        matmul_tiles(k, &tiles, &p.a, &p.b, None, &p.epi);
        k.body.line("hoff += units;");
        k.body.close();
    }
    if !end_each {
        k.body.line("mm.End();");
    }
    let stage_a = parts.iter().any(|p| p.a.staged);
    let stage_b = parts.iter().any(|p| p.b.staged);
    Ok(Emitted {
        work: Work::Horizontal { parts: dims, nc_step: crate::kernels::matmul::common_step(steps) },
        mix: true,
        cube: 1,
        stage_a,
        stage_b,
        cube_bytes: objects.iter().map(|o| o.2.size() as u32).collect(),
    })
}

fn object_name(i: usize) -> String {
    if i == 0 {
        "mm".into()
    } else {
        format!("mm{i}")
    }
}

/// The objects' declarations and their registration, all with the kernel's one tiling.
fn register_objects(k: &mut K, objects: &[(bool, bool, DType)]) {
    let c = &mut k.setup;
    c.line("AscendC::tiling::TCubeTiling ct;");
    c.line("af_cube_tiling(t, 0, ct);");
    let mut regs = Vec::new();
    for (i, (ta, tb, ty)) in objects.iter().enumerate() {
        let name = object_name(i);
        c.line(matmul_object(&name, *ta, *tb, *ty));
        regs.push(format!("{name}, &ct"));
    }
    let _ = writeln!(
        c,
        "REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), {}); /* the AIC serves the AIVs' calls, then returns */",
        regs.join(", ")
    );
}
