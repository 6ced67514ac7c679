//! Objects cached by content: a graph whose generated source, headers and compiler command are
//! unchanged is not compiled again, whatever else changed in the crate (a comment, another
//! graph, an env var that only affects printing). cc alone recompiles every file of a `Build`
//! each time the build script runs.

use autofusion_compiler::fingerprint;
use std::path::{Path, PathBuf};

/// The object of every source in `sources`, compiling only those whose key has no object yet.
/// An object is `<source dir>/<source stem>-<key>.o`, where the key hashes the source text,
/// `headers` (the text of what it includes) and the compiler's path and arguments; objects of
/// the same source under older keys are removed.
pub(crate) fn cached_objects(
    build: &cc::Build,
    sources: &[&Path],
    headers: &str,
    scratch: &Path,
) -> Result<Vec<PathBuf>, String> {
    let tool = build.try_get_compiler().map_err(|e| e.to_string())?;
    let command = format!("{} {:?}", tool.path().display(), tool.args());
    let mut objects = Vec::new();
    let mut missing: Vec<(&Path, PathBuf)> = Vec::new();
    for &src in sources {
        let text = std::fs::read_to_string(src)
            .map_err(|e| format!("cannot read {}: {e}", src.display()))?;
        let key = fingerprint(&format!("{command}\n{headers}\n{text}"));
        let obj = object_path(src, &key);
        if !obj.exists() {
            remove_stale(src, &obj);
            missing.push((src, obj.clone()));
        }
        objects.push(obj);
    }
    if !missing.is_empty() {
        compile_into(build, &missing, scratch)?;
    }
    Ok(objects)
}

fn object_path(src: &Path, key: &str) -> PathBuf {
    let stem = src.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    src.with_file_name(format!("{stem}-{key}.o"))
}

/// Remove `<stem>-*.o` beside `src` other than `keep` (objects of older versions of it).
fn remove_stale(src: &Path, keep: &Path) {
    let (Some(dir), Some(stem)) = (src.parent(), src.file_stem()) else { return };
    let prefix = format!("{}-", stem.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with(".o") && p != keep {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Compile `(source, object)` pairs with `build` (in `scratch`), then move each object into
/// place: cc names its intermediates after hashed paths, in the order of the files given.
fn compile_into(
    build: &cc::Build,
    pairs: &[(&Path, PathBuf)],
    scratch: &Path,
) -> Result<(), String> {
    std::fs::create_dir_all(scratch)
        .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    let mut b = build.clone();
    b.files(pairs.iter().map(|(s, _)| *s)).out_dir(scratch);
    let compiled = b.try_compile_intermediates().map_err(|e| e.to_string())?;
    if compiled.len() != pairs.len() {
        return Err(format!("cc returned {} objects for {} sources", compiled.len(), pairs.len()));
    }
    for (from, (_, to)) in compiled.iter().zip(pairs) {
        std::fs::rename(from, to)
            .or_else(|_| std::fs::copy(from, to).map(|_| ()))
            .map_err(|e| format!("cannot move {} to {}: {e}", from.display(), to.display()))?;
    }
    Ok(())
}
