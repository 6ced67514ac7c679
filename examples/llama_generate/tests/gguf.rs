//! The GGUF reader against a file llama.cpp's own writer made (`tests/fixtures/make_gguf.py`,
//! gguf-py): every metadata type, and F32 / F16 / BF16 / Q8_0 / Q4_0 / Q4_1 tensors dequantised as
//! gguf-py dequantises them. Then hostile files: every truncation, and headers whose counts,
//! lengths, dimensions, types or offsets lie, each an `Err` naming what is wrong (never a
//! panic or an allocation sized from the file).

use llama_generate::gguf::{GgmlType, Gguf, Value};
use llama_generate::Error;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn to_json(v: &Value) -> serde_json::Value {
    use serde_json::json;
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(x) => json!(x),
        Value::Array(x) => serde_json::Value::Array(x.iter().map(to_json).collect()),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F64(x) => json!(x),
    }
}

#[test]
fn reads_what_gguf_py_wrote() {
    let g = Gguf::open(&fixture("tensors.gguf")).unwrap();
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tensors.json")).unwrap()).unwrap();
    assert_eq!(g.version, 3);
    for (key, value) in want["metadata"].as_object().unwrap() {
        let got = g.get(key).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&to_json(got), value, "metadata {key}");
    }
    assert_eq!(g.usize("test.u32").unwrap(), 4_000_000_000);
    assert_eq!(g.str("general.architecture").unwrap(), "llama");
    assert!(g.usize("test.i32").is_err(), "a negative value is no usize");
    for (name, t) in want["tensors"].as_object().unwrap() {
        let (shape, values) = g.f32(name).unwrap_or_else(|e| panic!("{e}"));
        let want_shape: Vec<usize> =
            t["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        assert_eq!(shape, want_shape, "{name}");
        let want_values: Vec<f32> =
            t["values"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        assert_eq!(values.len(), want_values.len(), "{name}");
        for (i, (a, b)) in values.iter().zip(&want_values).enumerate() {
            assert!(a == b, "{name}[{i}]: {a} read, gguf-py dequantises {b}");
        }
    }
    let types: Vec<GgmlType> = g.tensors.iter().map(|t| t.ggml_type).collect();
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
    ] {
        assert!(types.contains(&ty), "the fixture holds {ty:?}");
    }
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = std::fs::read(fixture("tensors.gguf")).unwrap();
    let path = Path::new("cut.gguf");
    for n in 0..bytes.len() {
        let cut = &bytes[..n];
        match Gguf::parse(path, cut) {
            Err(e) => assert!(e.to_string().starts_with("cut.gguf: "), "{n}: {e}"),
            Ok(g) => {
                // Only a cut inside the padding after the last tensor leaves every tensor whole.
                for t in &g.tensors {
                    g.f32(&t.name).unwrap_or_else(|e| panic!("cut at {n}: {e}"));
                }
            }
        }
    }
    // Cut in the last tensor's data: named.
    let e = Gguf::parse(path, &bytes[..bytes.len() - 40]).err().expect("truncated data");
    assert!(matches!(e, Error::Tensor { .. }), "{e}");
    assert!(e.to_string().contains("truncated"), "{e}");
}

/// A GGUF file of one metadata entry (`key`: a u32) and the given tensor infos, then `data`.
struct Builder {
    bytes: Vec<u8>,
}

impl Builder {
    fn new(version: u32, n_tensors: u64, n_kv: u64) -> Builder {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(version.to_le_bytes());
        bytes.extend(n_tensors.to_le_bytes());
        bytes.extend(n_kv.to_le_bytes());
        Builder { bytes }
    }
    fn string(mut self, s: &str) -> Builder {
        self.bytes.extend((s.len() as u64).to_le_bytes());
        self.bytes.extend(s.as_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Builder {
        self.bytes.extend(v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Builder {
        self.bytes.extend(v.to_le_bytes());
        self
    }
    /// A tensor info of an F32 `[.., dims]` tensor at `offset`.
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Builder {
        let mut b = self.string(name).u32(dims.len() as u32);
        for &d in dims {
            b = b.u64(d);
        }
        b.u32(ty).u64(offset)
    }
    /// Padding to 32 and `n` bytes of data.
    fn data(mut self, n: usize) -> Vec<u8> {
        while !self.bytes.len().is_multiple_of(32) {
            self.bytes.push(0);
        }
        self.bytes.extend(std::iter::repeat_n(0u8, n));
        self.bytes
    }
}

fn parse_err(bytes: &[u8]) -> String {
    match Gguf::parse(Path::new("bad.gguf"), bytes) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn lying_headers_are_errors_that_say_what_lies() {
    let ok = Builder::new(3, 1, 0).tensor("w", &[4, 2], 0, 0).data(32);
    let g = Gguf::parse(Path::new("ok.gguf"), &ok[..]).unwrap();
    assert_eq!(g.f32("w").unwrap(), (vec![2, 4], vec![0.0; 8]));

    let e = parse_err(&[b"GGML".as_slice(), &[0; 20]].concat());
    assert!(e.contains("not a GGUF file"), "{e}");
    let e = parse_err(&Builder::new(1, 0, 0).data(0));
    assert!(e.contains("version 1"), "{e}");
    // Counts no file could hold: nothing is allocated for them.
    let e = parse_err(&Builder::new(3, u64::MAX, 0).data(0));
    assert!(e.contains("truncated"), "{e}");
    let e = parse_err(&Builder::new(3, 0, 1).u64(u64::MAX).data(0));
    assert!(e.contains("more than the"), "{e}");
    let arr = Builder::new(3, 0, 1).string("k").u32(9).u32(4).u64(1 << 60).data(0);
    let e = parse_err(&arr);
    assert!(e.contains("metadata `k`") && e.contains("array's length"), "{e}");
    let e = parse_err(&Builder::new(3, 0, 1).string("k").u32(13).data(0));
    assert!(e.contains("metadata `k`") && e.contains("value type 13"), "{e}");
    let e = parse_err(&Builder::new(3, 0, 1).string("k").u32(7).u32(2).data(0));
    assert!(e.contains("bool value"), "{e}");
    let e = parse_err(&Builder::new(3, 0, 1).string("general.alignment").u32(4).u32(12).data(0));
    assert!(e.contains("general.alignment"), "{e}");
    // Tensor infos.
    let e = parse_err(&Builder::new(3, 1, 0).tensor("w", &[1, 1, 1, 1, 1], 0, 0).data(32));
    assert!(e.contains("tensor `w`") && e.contains("5 dimensions"), "{e}");
    let e = parse_err(&Builder::new(3, 1, 0).tensor("w", &[1 << 40, 1 << 40], 0, 0).data(32));
    assert!(e.contains("tensor `w`") && e.contains("overflow"), "{e}");
    let e = parse_err(&Builder::new(3, 1, 0).tensor("w", &[4, 2], 0, 8).data(64));
    assert!(e.contains("tensor `w`") && e.contains("alignment"), "{e}");
    let e = parse_err(&Builder::new(3, 1, 0).tensor("w", &[4, 2], 0, 32).data(32));
    assert!(e.contains("tensor `w`") && e.contains("end of the data section"), "{e}");
    let e = parse_err(&Builder::new(3, 1, 0).tensor("w", &[33], 8, 0).data(64));
    assert!(e.contains("tensor `w`") && e.contains("blocks of 32"), "{e}");
    let e = parse_err(&Builder::new(3, 1, 0).tensor("w", &[4], 0, u64::MAX - 31).data(32));
    assert!(e.contains("tensor `w`"), "{e}");
    // A type the reader does not know parses; reading it says which.
    let q4k = Builder::new(3, 1, 0).tensor("w", &[256], 12, 0).data(256);
    let g = Gguf::parse(Path::new("k.gguf"), &q4k[..]).unwrap();
    let e = g.f32("w").unwrap_err().to_string();
    assert!(e.contains("tensor `w`") && e.contains("Other(12)"), "{e}");
    let e = g.f32("absent").unwrap_err().to_string();
    assert!(e.contains("tensor `absent`: not in the file"), "{e}");
}
