fn main() {
    autofusion_build::Builder::new().file("src/layers.rs").compile("demo_layers");
}
