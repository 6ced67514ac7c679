//! With the `acl` feature: find the CANN toolkit (the same lookup as `autofusion-build`, from
//! `src/toolkit.rs`), generate the AscendCL bindings with bindgen from its `acl/acl.h`, and
//! link `libascendcl`. Without it, nothing: the crate is then only the toolkit lookup.

#[allow(dead_code)]
#[path = "src/toolkit.rs"]
mod toolkit;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/toolkit.rs");
    #[cfg(feature = "acl")]
    acl();
}

#[cfg(feature = "acl")]
fn acl() {
    let tk = toolkit::Toolkit::find().unwrap_or_else(|e| fail(&e));
    let inc = tk.include_dir();
    let header = inc.join("acl/acl.h");
    println!("cargo:rerun-if-changed={}", header.display());
    // C++ mode: the public acl_rt.h holds a `constexpr` declaration.
    let bindings = bindgen::Builder::default()
        .header(header.display().to_string())
        .clang_args(["-x", "c++", "-std=c++14"])
        .clang_arg(format!("-I{}", inc.display()))
        .allowlist_function("acl.*")
        .allowlist_type("acl.*")
        .allowlist_var("ACL_.*")
        .layout_tests(true)
        .generate()
        .unwrap_or_else(|e| {
            fail(&format!(
                "bindgen failed on {}: {e}\n  = help: bindgen needs libclang (Debian: `apt-get install libclang-dev`)",
                header.display()
            ))
        });
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("acl.rs"))
        .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", out.join("acl.rs").display())));
    let lib = tk.lib_dir();
    if !lib.join("libascendcl.so").exists() {
        fail(&format!(
            "the toolkit at {} ({}) has no {}\n  = help: on a CANN install, source its set_env.sh; for the emulation, run `make -C ascend-sim` first",
            tk.root.display(),
            tk.found_by,
            lib.join("libascendcl.so").display()
        ));
    }
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=ascendcl");
    // `DEP_ASCENDCL_LIB_DIR` for dependents (their binaries' rpath).
    println!("cargo:lib_dir={}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}

#[cfg(feature = "acl")]
fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1);
}
