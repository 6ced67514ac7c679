//! Compile generated sources into shared libraries, for loading at run time with
//! `autofusion_runtime::library`: how tests, benchmarks and tools run plans of their own
//! without a build script per plan. The flags are the ones `Builder` compiles with, plus
//! `-Wall -Werror` (a warning in generated code is a generator bug).

use crate::toolkit::Toolkit;
use autofusion_compiler::codegen::host::CFLAGS;
use autofusion_compiler::codegen::{Source, Toolchain};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// `path` with a suffix unique to this process and call. Written there and renamed into
/// place, a file is never seen half-written by another thread or process reading `path`:
/// tests compiling the same graph on several threads at once raced here (one thread loading
/// the library while another's compiler was still writing it: "file too short").
fn aside(path: &Path) -> PathBuf {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".tmp{}-{}", std::process::id(), CALLS.fetch_add(1, Ordering::Relaxed)));
    PathBuf::from(name)
}

/// Rename the file at `from` to `to`, replacing it.
fn put_in_place(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::rename(from, to)
        .map_err(|e| format!("cannot move {} to {}: {e}", from.display(), to.display()))
}

/// Write `code` to `dir/file` and the kernel headers under `dir/include` (each file whole, as
/// `aside` says); returns the source path and the `-I` flag of the headers.
fn write_source(dir: &Path, file: &str, code: &str) -> Result<(PathBuf, String), String> {
    let include = dir.join("include");
    autofusion_compiler::codegen::write_headers(&include)
        .map_err(|e| format!("cannot write the kernel headers into {}: {e}", include.display()))?;
    let path = dir.join(file);
    let tmp = aside(&path);
    std::fs::write(&tmp, code).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    put_in_place(&tmp, &path)?;
    Ok((path, format!("-I{}", include.display())))
}

fn run(cmd: &mut Command, what: &str, source: &Path) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("cannot run `{what}`: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{what}` failed on {}:\n{}",
            source.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Compile `source` with its backend's toolchain into a shared library in `dir`: the host C
/// with `$CC` (`flags` after the defaults), Ascend C with the toolkit's bisheng (found as a
/// build finds it; `flags` may hold `-g` for a debug build).
pub fn library(
    source: &Source,
    toolchain: Toolchain,
    dir: &Path,
    symbol: &str,
    flags: &[&str],
) -> Result<PathBuf, String> {
    match toolchain {
        Toolchain::Cc { .. } => host_library(&source.code, dir, symbol, flags),
        Toolchain::Bisheng => {
            let tk = Toolkit::find()?;
            ascend_library(&tk, &source.code, dir, symbol, flags.contains(&"-g"))
        }
    }
}

/// Compile host C `code` with `$CC` (default `cc`) into `dir/<symbol>.so`; `flags` come after
/// the defaults (`-O3`), so they may override them.
pub fn host_library(
    code: &str,
    dir: &Path,
    symbol: &str,
    flags: &[&str],
) -> Result<PathBuf, String> {
    let (c, include) = write_source(dir, &format!("{symbol}.c"), code)?;
    let so = dir.join(format!("{symbol}.so"));
    let tmp = aside(&so);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut cmd = Command::new(&cc);
    cmd.args(CFLAGS).arg(include).args(["-O3", "-fPIC", "-shared", "-Wall", "-Werror"]).args(flags);
    cmd.arg("-o").arg(&tmp).arg(&c).arg("-lm");
    run(&mut cmd, &cc, &c)?;
    put_in_place(&tmp, &so)?;
    Ok(so)
}

/// Compile Ascend C `code` with the toolkit's bisheng into `dir/lib<symbol>_ascend.so`;
/// `debug` builds with `-O0 -g -DASCENDC_DEBUG`.
pub fn ascend_library(
    tk: &Toolkit,
    code: &str,
    dir: &Path,
    symbol: &str,
    debug: bool,
) -> Result<PathBuf, String> {
    let (asc, include) = write_source(dir, &format!("{symbol}.asc"), code)?;
    let so = dir.join(format!("lib{symbol}_ascend.so"));
    let tmp = aside(&so);
    let mut cmd = Command::new(&tk.bisheng);
    cmd.args(["-Wall", "-Werror"]).arg(include);
    cmd.args(tk.shared_lib_args(std::slice::from_ref(&asc), &tmp, debug));
    run(&mut cmd, &tk.bisheng.display().to_string(), &asc)?;
    put_in_place(&tmp, &so)?;
    Ok(so)
}
