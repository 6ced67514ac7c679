//! Compiles the Llama graphs of `src/graphs.rs` into fused kernels, as any user crate does.
fn main() {
    autofusion_build::Builder::new().file("src/graphs.rs").compile("llama_generate_graphs");
}
