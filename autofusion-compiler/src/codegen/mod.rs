//! Code generation behind one seam, `Backend`: a target's profile, the rules it can generate,
//! the source it emits for a plan and the toolchain that builds it. `host/` (C for the host
//! CPU) and `ascend/` (Ascend C for Atlas A2) implement it; `emit.rs` holds what both emit
//! alike; the headers their files include live in this crate's `include/`.

pub mod ascend;
pub mod emit;
pub mod host;

use crate::plan::{Plan, RuleSet};
use crate::target::Target;
use crate::{Unit, Variant};
use std::path::Path;

/// A code-generation target.
pub trait Backend {
    /// Its name in file names, reports and errors: `host`, `ascend`.
    fn name(&self) -> &'static str;
    /// The profile its plans are made with.
    fn profile(&self) -> &Target;
    /// Rules whose kernels it cannot generate: left out when planning for it.
    fn unsupported_rules(&self) -> RuleSet {
        RuleSet::none()
    }
    /// The source of one planned variant of `unit`, exporting the entries named after `symbol`.
    fn generate(
        &self,
        unit: &Unit,
        variant: Variant,
        plan: &Plan,
        symbol: &str,
    ) -> Result<Source, String>;
    /// How its sources are compiled and linked.
    fn toolchain(&self) -> Toolchain;
}

/// The generated source of one graph variant for one backend.
#[derive(Clone, Debug)]
pub struct Source {
    pub code: String,
    /// The file extension the toolchain expects (`c`, `asc`).
    pub extension: &'static str,
    /// The exported functions the runtime looks up: the module descriptor on the host; the
    /// launcher and the metadata function on Ascend.
    pub entries: Vec<String>,
    /// What the library tells the runtime about itself (`ModuleMeta` / `AscendMeta` as JSON).
    pub meta_json: String,
}

/// How a backend's sources become a library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Toolchain {
    /// The system C compiler (through `cc`, or `$CC`) with these flags; links libm.
    Cc { flags: &'static [&'static str] },
    /// The CANN toolkit's bisheng, as `autofusion-ascend-sys` finds it; links AscendCL.
    Bisheng,
}

/// The comment every generated file starts with: graph, variant, plan hash, opt level, target.
pub(crate) fn file_header(unit: &Unit, v: Variant, plan: &Plan) -> String {
    format!(
        "graph `{}` ({} variant), plan {} at opt_level {}, target {}",
        unit.graph.name,
        v.name(),
        unit.hash,
        plan.opt_level,
        plan.target.name
    )
}

/// The headers generated files `#include` (path under the include root, contents): real files
/// in this crate's `include/`, embedded at compile time and written next to the generated
/// sources by whoever compiles them (`write_headers`), so every generated file holds kernels
/// only.
pub const HEADERS: &[(&str, &str)] = &[
    (HOST_HEADER, include_str!("../../include/autofusion/host.h")),
    (ASCEND_HEADER, include_str!("../../include/autofusion/ascend.h")),
];

/// The host prelude: vectorisable math and the per-ISA matmul micro-kernels.
pub const HOST_HEADER: &str = "autofusion/host.h";
/// The Ascend C helpers (tiling and dims loads, scalar GM access).
pub const ASCEND_HEADER: &str = "autofusion/ascend.h";

/// Write every header under the include root `root` (compile with `-I<root>`). A header whose
/// contents are already there is not rewritten, so its mtime stays and nothing recompiles.
pub fn write_headers(root: &Path) -> std::io::Result<()> {
    for (name, text) in HEADERS {
        let path = root.join(name);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(*text) {
            continue;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // Written aside and renamed into place: a compiler another thread or process runs
        // on the same directory never reads a half-written header.
        let aside = path.with_extension(format!(
            "tmp{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&aside, text)?;
        std::fs::rename(&aside, &path)?;
    }
    Ok(())
}

/// The name of kernel `k` (group `grp` of a plan of `g`) in every backend's code:
/// `k<k>_<its first output>`.
pub fn kernel_name(g: &crate::ir::Graph, k: usize, grp: &crate::plan::Group) -> String {
    let first = grp.outputs.first().map(|o| emit::ident(&g.node(*o).name)).unwrap_or_default();
    format!("k{k}_{first}")
}
