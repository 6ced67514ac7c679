//! Finding the CANN toolkit and driving bisheng (the Ascend C compiler).
//!
//! Lookup order (asc-devkit `docs/zh/quick_start.md`: `set_env.sh` exports `ASCEND_HOME_PATH`): `ASCEND_HOME_PATH` (exported by `set_env.sh`),
//! then `ASCEND_TOOLKIT_HOME`, then the default install places, new layout before legacy:
//! `/usr/local/Ascend/cann`, `/usr/local/Ascend/ascend-toolkit/latest`, and the same two under
//! `$HOME/Ascend` (non-root installs). A place is a toolkit when it has `include/acl/acl.h`
//! and a `bisheng`. The flow is the new ASC one (`--npu-arch=dav-2201`) when
//! `asc/include/basic_api` exists, the legacy one (`-x cce --cce-aicore-arch=dav-c220`,
//! tikcfw include paths) when `compiler/tikcpp/tikcfw` does. The SoC comes from
//! `AUTOFUSION_ASCEND_SOC` (default `Ascend910B2`). Every variable read is announced with
//! `cargo:rerun-if-env-changed`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Which compiler driver conventions the toolkit follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// CANN >= 8.5: `.asc` sources, `bisheng --npu-arch=dav-2201`, `-lib` / `-shared`.
    New,
    /// CANN 7.x-8.x: `bisheng -x cce --cce-aicore-arch=dav-c220`, tikcfw headers,
    /// `--cce-fatobj-link` to produce libraries.
    Legacy,
}

/// A CANN toolkit (or the project's `ascend-sim`, which is laid out like one).
#[derive(Clone, Debug)]
pub struct Toolkit {
    /// The toolkit root (what `ASCEND_HOME_PATH` points at).
    pub root: PathBuf,
    /// How it was found, for messages.
    pub found_by: String,
    /// The compiler.
    /// The compiler driver.
    pub bisheng: PathBuf,
    /// Its flow.
    pub flow: Flow,
    /// `AUTOFUSION_ASCEND_SOC`, default `Ascend910B2`.
    pub soc: String,
    /// `dav-2201` for the A2 / A3 SoCs.
    pub arch: &'static str,
}

/// SoCs of arch 2201 (Atlas A2 training/inference series and A3), per the toolkit's
/// `host_config.cmake`.
const SOCS_2201: &[&str] = &[
    "Ascend910B1",
    "Ascend910B2",
    "Ascend910B2C",
    "Ascend910B3",
    "Ascend910B4",
    "Ascend910B4-1",
    "Ascend910_9391",
    "Ascend910_9381",
    "Ascend910_9372",
    "Ascend910_9392",
    "Ascend910_9382",
    "Ascend910_9362",
];

fn env(name: &str, announce: bool) -> Option<String> {
    if announce {
        println!("cargo:rerun-if-env-changed={name}");
    }
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Where bisheng lives inside a toolkit root, new layout first (`tools/bisheng_compiler/bin`,
/// then the legacy `{arch}-linux|compiler/ccec_compiler/bin`).
fn bisheng_in(root: &Path) -> Option<PathBuf> {
    let arch = if cfg!(target_arch = "aarch64") { "aarch64-linux" } else { "x86_64-linux" };
    [
        "tools/bisheng_compiler/bin/bisheng".to_string(),
        "compiler/ccec_compiler/bin/bisheng".to_string(),
        format!("{arch}/ccec_compiler/bin/bisheng"),
        "tools/ccec_compiler/bin/bisheng".to_string(),
    ]
    .iter()
    .map(|p| root.join(p))
    .find(|p| p.is_file())
}

/// Why `root` is not a usable toolkit, or the toolkit.
fn probe(root: &Path, found_by: &str, soc: &str, arch: &'static str) -> Result<Toolkit, String> {
    if !root.is_dir() {
        return Err("no such directory".into());
    }
    if !root.join("include/acl/acl.h").is_file() {
        return Err("no include/acl/acl.h".into());
    }
    let bisheng = bisheng_in(root).ok_or("no bisheng under tools/bisheng_compiler/bin, compiler/ccec_compiler/bin or <arch>-linux/ccec_compiler/bin")?;
    let flow = if root.join("asc/include/basic_api").is_dir() {
        Flow::New
    } else if root.join("compiler/tikcpp/tikcfw").is_dir() {
        Flow::Legacy
    } else {
        return Err("neither asc/include/basic_api (new flow) nor compiler/tikcpp/tikcfw (legacy flow) exists".into());
    };
    // Checked here, not at the link: without it the failure is the linker's `unable to find
    // library -lascendcl` deep in a build script (the emulation's library is built by make).
    if !root.join("lib64/libascendcl.so").is_file() {
        return Err(
            "no lib64/libascendcl.so (for the project's emulation: run `make -C ascend-sim` first)"
                .into(),
        );
    }
    Ok(Toolkit {
        root: root.to_path_buf(),
        found_by: found_by.into(),
        bisheng,
        flow,
        soc: soc.into(),
        arch,
    })
}

impl Toolkit {
    /// Find the toolkit, or return one message listing every place checked and how to fix it.
    pub fn find() -> Result<Toolkit, String> {
        Self::find_with(&|name| env(name, true))
    }

    /// `find` with the environment given as a function (tests).
    pub fn find_with(var: &dyn Fn(&str) -> Option<String>) -> Result<Toolkit, String> {
        let soc = var("AUTOFUSION_ASCEND_SOC").unwrap_or_else(|| "Ascend910B2".into());
        if !SOCS_2201.contains(&soc.as_str()) {
            return Err(format!(
                "AUTOFUSION_ASCEND_SOC = `{soc}` is not a SoC the generated kernels target\n  = help: the kernels are written for arch 2201 (dav-2201): {}",
                SOCS_2201.join(", ")
            ));
        }
        let arch = "dav-2201";
        let mut places: Vec<(PathBuf, String)> = Vec::new();
        for name in ["ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"] {
            if let Some(v) = var(name) {
                places.push((PathBuf::from(v), format!("${name}")));
            }
        }
        let env_set = !places.is_empty();
        for p in ["/usr/local/Ascend/cann", "/usr/local/Ascend/ascend-toolkit/latest"] {
            places.push((PathBuf::from(p), "default install path".into()));
        }
        if let Some(home) = var("HOME") {
            for p in ["Ascend/cann", "Ascend/ascend-toolkit/latest"] {
                places.push((Path::new(&home).join(p), "non-root install path".into()));
            }
        }
        let mut tried = String::new();
        for (root, how) in &places {
            match probe(root, how, &soc, arch) {
                Ok(t) => return Ok(t),
                Err(why) => tried += &format!("\n  - {} ({how}): {why}", root.display()),
            }
        }
        if !env_set {
            tried.insert_str(0, "\n  - $ASCEND_HOME_PATH and $ASCEND_TOOLKIT_HOME: not set");
        }
        Err(format!(
            "the `ascend` feature needs the CANN toolkit, and none was found. Checked:{tried}\n  = help: run `source /usr/local/Ascend/cann/set_env.sh` (or the toolkit's own set_env.sh), or set ASCEND_HOME_PATH to the toolkit root\n  = help: without an NPU, point it at the project's emulation: `make -C ascend-sim && export ASCEND_HOME_PATH=$PWD/ascend-sim`"
        ))
    }

    /// Headers for host code including AscendCL (`acl/acl.h`).
    pub fn include_dir(&self) -> PathBuf {
        self.root.join("include")
    }

    /// Libraries (`libascendcl.so`, the runtime the launchers need).
    pub fn lib_dir(&self) -> PathBuf {
        self.root.join("lib64")
    }

    /// Flags compiling one Ascend C translation unit to an object (`-c` added by the caller).
    /// `debug` keeps symbols, drops optimisation and enables the toolkit's API asserts
    /// (`-DASCENDC_DEBUG`: asc-devkit guide, AI-Core operator compilation).
    pub fn compile_flags(&self, debug: bool) -> Vec<String> {
        let mut f: Vec<String> = match self.flow {
            Flow::New => vec!["-x".into(), "asc".into(), format!("--npu-arch={}", self.arch)],
            Flow::Legacy => {
                let t = self.root.join("compiler/tikcpp");
                let mut v: Vec<String> = vec![
                    "-x".into(),
                    "cce".into(),
                    "--cce-aicore-arch=dav-c220".into(),
                    "-std=c++17".into(),
                ];
                for p in
                    [t.clone(), t.join("tikcfw"), t.join("tikcfw/impl"), t.join("tikcfw/interface")]
                {
                    v.push(format!("-I{}", p.display()));
                }
                v
            }
        };
        f.push(format!("-I{}", self.include_dir().display()));
        f.push("-fPIC".into());
        if debug {
            f.extend(["-O0", "-g", "-DASCENDC_DEBUG"].map(String::from));
        } else {
            f.push("-O2".into());
        }
        f
    }

    /// The bisheng arguments turning objects into a static library (`-lib` in the new flow,
    /// `--cce-build-static-lib` in the legacy one; the
    /// library is produced by bisheng itself so the device sections stay registered).
    pub fn static_lib_args(&self, objects: &[PathBuf], out: &Path) -> Vec<String> {
        let mut a: Vec<String> = match self.flow {
            Flow::New => vec!["-lib".into(), format!("--npu-arch={}", self.arch)],
            Flow::Legacy => {
                vec!["--cce-fatobj-link".into(), "-fPIC".into(), "--cce-build-static-lib".into()]
            }
        };
        a.extend(objects.iter().map(|o| o.display().to_string()));
        a.extend(["-o".into(), out.display().to_string()]);
        a
    }

    /// The bisheng arguments building a shared library straight from sources (JIT tests).
    pub fn shared_lib_args(&self, sources: &[PathBuf], out: &Path, debug: bool) -> Vec<String> {
        let mut a = self.compile_flags(debug);
        a.extend(["-shared".into()]);
        if self.flow == Flow::Legacy {
            a.push("--cce-fatobj-link".into());
        }
        a.extend(sources.iter().map(|o| o.display().to_string()));
        a.extend([
            "-o".into(),
            out.display().to_string(),
            format!("-L{}", self.lib_dir().display()),
            "-lascendcl".into(),
        ]);
        a
    }

    /// Libraries a binary linking generated launchers needs (the ASC guide's
    /// default-linked libraries of a launcher), those present in `lib64`: `(name, static)`. `ascendcl` always.
    pub fn link_libs(&self) -> Vec<(String, bool)> {
        let lib = self.lib_dir();
        let mut v = vec![("ascendcl".to_string(), false)];
        if lib.join("libascendc_runtime.a").is_file() {
            v.push(("ascendc_runtime".into(), true));
        }
        for l in [
            "runtime",
            "profapi",
            "unified_dlog",
            "mmpa",
            "ascend_dump",
            "c_sec",
            "error_manager",
            "register",
            "ge_common_base",
        ] {
            if lib.join(format!("lib{l}.so")).is_file() {
                v.push((l.into(), false));
            }
        }
        v.push(("stdc++".into(), false));
        v.push(("dl".into(), false));
        v
    }

    /// Run bisheng with `args`; Err carries the command and its output.
    pub fn run(&self, args: &[String]) -> Result<(), String> {
        let out = Command::new(&self.bisheng)
            .args(args)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.bisheng.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`{} {}` failed:\n{}{}",
                self.bisheng.display(),
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(root: &Path, new: bool) {
        std::fs::create_dir_all(root.join("include/acl")).unwrap();
        std::fs::write(root.join("include/acl/acl.h"), "").unwrap();
        let bin = if new { "tools/bisheng_compiler/bin" } else { "compiler/ccec_compiler/bin" };
        std::fs::create_dir_all(root.join(bin)).unwrap();
        std::fs::write(root.join(bin).join("bisheng"), "").unwrap();
        std::fs::create_dir_all(root.join("lib64")).unwrap();
        std::fs::write(root.join("lib64/libascendcl.so"), "").unwrap();
        std::fs::create_dir_all(root.join(if new {
            "asc/include/basic_api"
        } else {
            "compiler/tikcpp/tikcfw"
        }))
        .unwrap();
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("af-toolkit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn finds_by_env_in_order_and_detects_the_flow() {
        let (a, b) = (tmp("a"), tmp("b"));
        fake(&a, true);
        fake(&b, false);
        let (sa, sb) = (a.display().to_string(), b.display().to_string());
        let t = Toolkit::find_with(&|n| match n {
            "ASCEND_HOME_PATH" => Some(sa.clone()),
            "ASCEND_TOOLKIT_HOME" => Some(sb.clone()),
            _ => None,
        })
        .unwrap();
        assert_eq!((t.root.clone(), t.flow, t.soc.as_str()), (a.clone(), Flow::New, "Ascend910B2"));
        assert!(t.compile_flags(false).contains(&"--npu-arch=dav-2201".to_string()));
        assert!(t.compile_flags(true).contains(&"-DASCENDC_DEBUG".to_string()));
        // A broken ASCEND_HOME_PATH falls through to ASCEND_TOOLKIT_HOME (legacy layout).
        let t = Toolkit::find_with(&|n| match n {
            "ASCEND_HOME_PATH" => Some("/nonexistent/cann".into()),
            "ASCEND_TOOLKIT_HOME" => Some(sb.clone()),
            "AUTOFUSION_ASCEND_SOC" => Some("Ascend910B4".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!((t.flow, t.soc.as_str()), (Flow::Legacy, "Ascend910B4"));
        let f = t.compile_flags(false);
        assert!(
            f.contains(&"--cce-aicore-arch=dav-c220".to_string())
                && f.iter().any(|x| x.ends_with("tikcpp/tikcfw/impl")),
            "{f:?}"
        );
        assert!(t
            .static_lib_args(&[], Path::new("x.a"))
            .contains(&"--cce-fatobj-link".to_string()));
    }

    #[test]
    fn none_found_lists_every_place_and_the_fix() {
        let e = Toolkit::find_with(&|n| (n == "HOME").then(|| "/nonexistent-home".to_string()))
            .unwrap_err();
        for want in [
            "$ASCEND_HOME_PATH and $ASCEND_TOOLKIT_HOME: not set",
            "/usr/local/Ascend/cann",
            "/usr/local/Ascend/ascend-toolkit/latest",
            "/nonexistent-home/Ascend/cann",
            "set_env.sh",
            "ascend-sim",
        ] {
            assert!(e.contains(want), "missing `{want}` in:\n{e}");
        }
        let e = Toolkit::find_with(&|n| {
            (n == "AUTOFUSION_ASCEND_SOC").then(|| "Ascend310P3".to_string())
        })
        .unwrap_err();
        assert!(e.contains("Ascend310P3") && e.contains("Ascend910B2"), "{e}");
    }

    #[test]
    fn a_toolkit_without_its_library_says_what_to_run() {
        let root = tmp("nolib");
        fake(&root, true);
        std::fs::remove_file(root.join("lib64/libascendcl.so")).unwrap();
        let r = root.display().to_string();
        let e = Toolkit::find_with(&|n| (n == "ASCEND_HOME_PATH").then(|| r.clone())).unwrap_err();
        assert!(e.contains("no lib64/libascendcl.so") && e.contains("make -C ascend-sim"), "{e}");
    }
}
