//! Compile a planned graph variant with the system C compiler into a shared library and load
//! it (feature `jit`): how tests run many plans of a graph without a build script per plan.

use crate::error::{Error, Result};
use crate::exec::{AfModule, Module};
use autofusion_compiler::{target::Target, Unit, Variant};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;
use std::process::Command;

extern "C" {
    fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *mut c_char;
}
const RTLD_NOW: c_int = 2;

fn dl_error() -> String {
    // SAFETY: dlerror returns null or a valid C string.
    unsafe {
        let e = dlerror();
        if e.is_null() {
            "unknown dlopen error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// `dlopen` the library at `path` (kept loaded for the life of the process) and look up each
/// of `names`.
fn open_symbols(path: &Path, names: &[&str]) -> std::result::Result<Vec<*mut c_void>, String> {
    let path = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: plain dlopen/dlsym with valid C strings.
    unsafe {
        let h = dlopen(path.as_ptr(), RTLD_NOW);
        if h.is_null() {
            return Err(dl_error());
        }
        names
            .iter()
            .map(|n| {
                let c = CString::new(*n).map_err(|e| e.to_string())?;
                let f = dlsym(h, c.as_ptr());
                if f.is_null() {
                    Err(dl_error())
                } else {
                    Ok(f)
                }
            })
            .collect()
    }
}

/// Generate, compile (`$CC`, default `cc`, with `flags`) and load one variant of `unit`.
/// The library stays loaded for the life of the process.
pub fn load(
    unit: &Unit,
    variant: Variant,
    target: &Target,
    dir: &Path,
    flags: &[&str],
) -> Result<Module> {
    load_built(&unit.variant(variant, target), &unit.symbol(variant), dir, flags)
}

/// Compile and load code generated for a plan of one's own (`Unit::generate`); `symbol` must
/// be the one given to `generate` and unique in the process.
pub fn load_built(
    built: &autofusion_compiler::Built,
    symbol: &str,
    dir: &Path,
    flags: &[&str],
) -> Result<Module> {
    let sym = symbol.to_string();
    let err = |msg: String| Error::Module { symbol: sym.clone(), msg };
    std::fs::create_dir_all(dir)
        .map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
    let c = dir.join(format!("{sym}.c"));
    let so = dir.join(format!("{sym}.so"));
    std::fs::write(&c, &built.c.code)
        .map_err(|e| err(format!("cannot write {}: {e}", c.display())))?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(autofusion_compiler::codegen::c::CFLAGS)
        .args(["-O3", "-fPIC", "-shared", "-Wall", "-Werror"])
        .args(flags)
        .arg("-o")
        .arg(&so)
        .arg(&c)
        .arg("-lm")
        .output()
        .map_err(|e| err(format!("cannot run `{cc}`: {e}")))?;
    if !out.status.success() {
        return Err(err(format!(
            "`{cc}` failed on {}:\n{}",
            c.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let f = open_symbols(&so, &[&sym]).map_err(err)?[0];
    // SAFETY: the symbol has the signature `const af_module *(void)` by construction of the
    // code generator.
    unsafe {
        let f: extern "C" fn() -> *const AfModule = std::mem::transmute(f);
        Module::from_raw(f(), &sym)
    }
}

/// Generate the Ascend C of one variant of `unit` (planned for `target`, normally
/// `ascend910b`), compile it with the toolkit's bisheng into a shared library, and load it
/// (feature `ascend`).
#[cfg(feature = "ascend")]
pub fn load_ascend(
    unit: &Unit,
    variant: Variant,
    target: &Target,
    dir: &Path,
) -> Result<crate::ascend::AscendModule> {
    let sym = unit.symbol(variant);
    let (_, src) = unit
        .variant_ascend(variant, target)
        .map_err(|msg| Error::Module { symbol: sym.clone(), msg })?;
    load_ascend_built(unit.graph.clone(), &src, &sym, dir, false)
}

/// Compile and load Ascend C generated for a plan of one's own (`Unit::generate_ascend`).
/// `debug` builds with `-O0 -g -DASCENDC_DEBUG`.
#[cfg(feature = "ascend")]
pub fn load_ascend_built(
    graph: autofusion_compiler::ir::Graph,
    src: &autofusion_compiler::codegen::ascend::AscendSource,
    symbol: &str,
    dir: &Path,
    debug: bool,
) -> Result<crate::ascend::AscendModule> {
    let sym = symbol.to_string();
    let err = |msg: String| Error::Module { symbol: sym.clone(), msg };
    std::fs::create_dir_all(dir)
        .map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
    let asc = dir.join(format!("{sym}.asc"));
    let so = dir.join(format!("lib{sym}_ascend.so"));
    std::fs::write(&asc, &src.code)
        .map_err(|e| err(format!("cannot write {}: {e}", asc.display())))?;
    let bisheng = env!("AUTOFUSION_ASCEND_BISHENG");
    let mut cmd = Command::new(bisheng);
    for f in env!("AUTOFUSION_ASCEND_CFLAGS").split('\u{1f}') {
        if debug && f.starts_with("-O") {
            continue;
        }
        cmd.arg(f);
    }
    if debug {
        cmd.args(["-O0", "-g", "-DASCENDC_DEBUG"]);
    }
    if env!("AUTOFUSION_ASCEND_LEGACY") == "1" {
        cmd.arg("--cce-fatobj-link");
    }
    cmd.args(["-shared", "-Wall", "-Werror", "-o"]).arg(&so).arg(&asc);
    cmd.arg(format!("-L{}", env!("AUTOFUSION_ASCEND_LIB"))).arg("-lascendcl");
    let out = cmd.output().map_err(|e| err(format!("cannot run `{bisheng}`: {e}")))?;
    if !out.status.success() {
        return Err(err(format!(
            "`{bisheng}` failed on {}:\n{}",
            asc.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let f = open_symbols(&so, &[&src.launch, &src.entry]).map_err(err)?;
    let (l, j) = (f[0], f[1]);
    // SAFETY: the symbols have the signatures the generator gives them.
    unsafe {
        let l: crate::ascend::LaunchFn = std::mem::transmute(l);
        let j: unsafe extern "C" fn() -> *const c_char = std::mem::transmute(j);
        crate::ascend::AscendModule::from_raw(graph, l, j, &sym)
    }
}
