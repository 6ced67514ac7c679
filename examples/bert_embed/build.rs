//! Compiles the BERT graphs of `src/graphs.rs` into fused kernels, as any user crate does.
fn main() {
    autofusion_build::Builder::new().file("src/graphs.rs").compile("bert_embed_graphs");
}
