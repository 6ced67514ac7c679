//! Malformed models give a clean error naming what is wrong, never a panic: a corpus built
//! from a small valid model by breaking one thing at a time.

mod common;

use autofusion_onnx::proto::*;
use common::{node, value, weight};
use prost::Message;
use std::path::PathBuf;

fn dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("malformed");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// y = relu(x @ w), x: f32[S, 4], w: [4, 4]; opset 17.
fn good() -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 17 }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![node("MatMul", &["x", "w"], "h"), node("Relu", &["h"], "y")],
            initializer: vec![weight("w", 4, 4)],
            input: vec![value("x", data_type::FLOAT, &["S", "4"])],
            output: vec![value("y", data_type::FLOAT, &["S", "4"])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn import(m: &ModelProto, file: &str) -> Result<(), String> {
    let path = dir().join(file);
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let model = autofusion_onnx::load(&path).map_err(|e| e.to_string())?;
    autofusion_onnx::import(&model, "g").map(|_| ()).map_err(|e| e.to_string())
}

fn expect_err(m: &ModelProto, file: &str, want: &[&str]) {
    let e = import(m, file).expect_err(file);
    for w in want {
        assert!(e.contains(w), "{file}: `{w}` not in: {e}");
    }
}

#[test]
fn the_good_model_imports() {
    import(&good(), "good.onnx").unwrap();
}

#[test]
fn broken_models_are_errors_that_say_what_is_wrong() {
    let mut m = good();
    m.graph.as_mut().unwrap().node[0].input[1] = "w_missing".into();
    expect_err(
        &m,
        "missing_init.onnx",
        &["node `h` (MatMul, opset 17)", "`w_missing` is produced by no node"],
    );

    let mut m = good();
    m.graph.as_mut().unwrap().node.swap(0, 1); // relu reads h before MatMul makes it
    expect_err(&m, "order.onnx", &["node `y` (Relu", "`h` is produced by a later node"]);

    let mut m = good();
    m.graph.as_mut().unwrap().input[0] = value("x", data_type::INT8, &["S", "4"]);
    expect_err(&m, "dtype.onnx", &["graph input `x`", "element type 3"]);

    let mut m = good();
    m.graph.as_mut().unwrap().initializer[0] = weight("w", 5, 4);
    expect_err(&m, "dims.onnx", &["node `h` (MatMul", "x: f32[S, 4]", "w: f32[5, 4]"]);

    let mut m = good();
    m.graph.as_mut().unwrap().input[0] = value("x", data_type::FLOAT, &["S", ""]);
    let mut v = value("x", data_type::FLOAT, &["S", "4"]);
    if let Some(type_proto::Value::TensorType(t)) = v.r#type.as_mut().unwrap().value.as_mut() {
        t.shape.as_mut().unwrap().dim[1].value = None;
    }
    m.graph.as_mut().unwrap().input[0] = v;
    expect_err(&m, "noname.onnx", &["axis 1 has neither a size nor a name"]);

    let mut m = good();
    let w = &mut m.graph.as_mut().unwrap().initializer[0];
    w.raw_data = w.raw_data.slice(..20);
    expect_err(
        &m,
        "short.onnx",
        &["tensor `w` holds 20 bytes of data, its shape and type need 64"],
    );

    let mut m = good();
    let w = &mut m.graph.as_mut().unwrap().initializer[0];
    w.raw_data = Default::default();
    w.data_location = DATA_LOCATION_EXTERNAL;
    w.external_data =
        vec![StringStringEntryProto { key: "location".into(), value: "w_missing.bin".into() }];
    expect_err(
        &m,
        "external.onnx",
        &["external data of tensor `w`", "w_missing.bin", "cannot read it"],
    );

    let mut m = good();
    let w = &mut m.graph.as_mut().unwrap().initializer[0];
    w.raw_data = Default::default();
    w.data_location = DATA_LOCATION_EXTERNAL;
    w.external_data =
        vec![StringStringEntryProto { key: "location".into(), value: "../../etc/passwd".into() }];
    expect_err(&m, "escape.onnx", &["must be a relative path inside the model's directory"]);

    let mut m = good();
    m.graph.as_mut().unwrap().node[1].op_type = "Mish".into();
    expect_err(
        &m,
        "op.onnx",
        &["node `y` (Mish, opset 17) with inputs [h: f32[S, 4]]", "op `Mish` is not supported"],
    );

    let mut m = good();
    m.opset_import[0].version = 11;
    expect_err(&m, "opset.onnx", &["opset 11 is not supported", "help: re-export"]);

    let mut m = good();
    m.graph = None;
    expect_err(&m, "nograph.onnx", &["holds no graph"]);

    let mut m = good();
    m.graph.as_mut().unwrap().output[0].name = "nowhere".into();
    expect_err(&m, "output.onnx", &["graph output `nowhere` is produced by no node"]);
}

#[test]
fn external_data_is_read_from_the_models_directory() {
    let mut m = good();
    let w = &mut m.graph.as_mut().unwrap().initializer[0];
    let bytes = w.raw_data.clone();
    let mut file = vec![0u8; 8];
    file.extend_from_slice(&bytes);
    std::fs::write(dir().join("w.bin"), &file).unwrap();
    w.raw_data = Default::default();
    w.data_location = DATA_LOCATION_EXTERNAL;
    w.external_data = vec![
        StringStringEntryProto { key: "location".into(), value: "w.bin".into() },
        StringStringEntryProto { key: "offset".into(), value: "8".into() },
        StringStringEntryProto { key: "length".into(), value: "64".into() },
    ];
    let path = dir().join("external_ok.onnx");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let model = autofusion_onnx::load(&path).unwrap();
    let im = autofusion_onnx::import(&model, "g").unwrap();
    let (p, _) = im.weights[0];
    assert_eq!(im.weight_bytes(&model, p).unwrap(), bytes);
    // Where it is, for loading at run time (Builder::onnx): the external file's range.
    use autofusion_onnx::load::Location;
    let at = im.weight_location(&model, p).unwrap();
    assert_eq!(at, Location::File { path: dir().join("w.bin"), offset: 8, len: 64 });
    // Inline raw_data: a range of the model file itself, holding the same bytes.
    let inline = dir().join("inline_ok.onnx");
    std::fs::write(&inline, good().encode_to_vec()).unwrap();
    let model = autofusion_onnx::load(&inline).unwrap();
    let im = autofusion_onnx::import(&model, "g").unwrap();
    let Location::File { path, offset, len } = im.weight_location(&model, p).unwrap() else {
        panic!("raw_data is a range of the model file")
    };
    let file = std::fs::read(&path).unwrap();
    assert_eq!(path, inline);
    assert_eq!(&file[offset as usize..(offset + len) as usize], &bytes[..]);
}

#[test]
fn garbage_bytes_never_panic() {
    // Every prefix of a valid model and some byte flips: an error or a model, never a panic.
    let bytes = good().encode_to_vec();
    for cut in 0..bytes.len() {
        let path = dir().join("prefix.onnx");
        std::fs::write(&path, &bytes[..cut]).unwrap();
        if let Ok(model) = autofusion_onnx::load(&path) {
            let _ = autofusion_onnx::import(&model, "g");
        }
    }
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x5a;
        let path = dir().join("flip.onnx");
        std::fs::write(&path, &b).unwrap();
        if let Ok(model) = autofusion_onnx::load(&path) {
            let _ = autofusion_onnx::import(&model, "g");
        }
    }
}
