//! Small models built in Rust for the crate's tests.
#![allow(dead_code)]

use autofusion_onnx::proto::*;

pub fn value(name: &str, elem: i32, dims: &[&str]) -> ValueInfoProto {
    use tensor_shape_proto::{dimension::Value, Dimension};
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d.parse::<i64>() {
                Ok(v) => Value::DimValue(v),
                Err(_) => Value::DimParam(d.to_string()),
            }),
            denotation: String::new(),
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem,
                shape: Some(TensorShapeProto { dim }),
            })),
            denotation: String::new(),
        }),
        doc_string: String::new(),
    }
}

pub fn node(op: &str, ins: &[&str], out: &str) -> NodeProto {
    NodeProto {
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        name: out.into(),
        op_type: op.into(),
        ..Default::default()
    }
}

pub fn weight(name: &str, rows: i64, cols: i64) -> TensorProto {
    let data: Vec<u8> = (0..rows * cols).flat_map(|i| (i as f32 * 0.1).to_le_bytes()).collect();
    TensorProto {
        dims: vec![rows, cols],
        data_type: data_type::FLOAT,
        name: name.into(),
        raw_data: data.into(),
        ..Default::default()
    }
}
