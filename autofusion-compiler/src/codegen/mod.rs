//! Code generators, one module per target, and the kernel headers their files include.

pub mod ascend;
pub mod c;

use std::path::Path;

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
        std::fs::write(&path, text)?;
    }
    Ok(())
}
