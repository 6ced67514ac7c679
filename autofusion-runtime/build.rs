//! With the `ascend` feature, this crate's own tests find `libascendcl` without
//! `LD_LIBRARY_PATH`: an rpath to the toolkit's library directory, which
//! `autofusion-ascend-sys` reports as `DEP_ASCENDCL_LIB_DIR`.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if let Ok(dir) = std::env::var("DEP_ASCENDCL_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
