//! With the `ascend` feature: find the CANN toolkit (as autofusion-build does), generate the
//! AscendCL bindings with bindgen from its `acl/acl.h`, and link `libascendcl`.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "ascend")]
    ascend();
}

#[cfg(feature = "ascend")]
fn ascend() {
    use autofusion_build::toolkit::Toolkit;
    let tk = match Toolkit::find() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let inc = tk.include_dir();
    let header = inc.join("acl/acl.h");
    println!("cargo:rerun-if-changed={}", header.display());
    // C++ mode: the public acl_rt.h holds a `constexpr` declaration (doc §6).
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
            eprintln!("error: bindgen failed on {}: {e}\n  = help: bindgen needs libclang (Debian: `apt-get install libclang-dev`)", header.display());
            std::process::exit(1);
        });
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("acl.rs");
    bindings.write_to_file(&out).expect("write acl.rs");
    let lib = tk.lib_dir();
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=ascendcl");
    // This crate's own tests and examples find libascendcl without LD_LIBRARY_PATH.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    // The JIT of the tests compiles generated Ascend C with the same toolkit.
    println!("cargo:rustc-env=AUTOFUSION_ASCEND_BISHENG={}", tk.bisheng.display());
    println!("cargo:rustc-env=AUTOFUSION_ASCEND_CFLAGS={}", tk.compile_flags(false).join("\u{1f}"));
    println!("cargo:rustc-env=AUTOFUSION_ASCEND_LIB={}", lib.display());
    println!(
        "cargo:rustc-env=AUTOFUSION_ASCEND_LEGACY={}",
        u8::from(tk.flow == autofusion_build::toolkit::Flow::Legacy)
    );
}
