//! The tiny random Llama (`tests/fixtures/make_tiny_llama.py`: transformers' checkpoint and its
//! GGUF conversion written as llama.cpp's converter writes it, Q and K rows permuted for
//! GGML's RoPE) loads to the same config and the same weights from both formats; broken
//! configs and checkpoints are errors naming the file, the key or the tensor.

use llama_generate::{Config, Weights};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[test]
fn hugging_face_and_gguf_files_load_the_same_model() {
    let hf = Weights::from_hf_dir(&fixtures().join("tiny_llama")).unwrap();
    let gg = Weights::from_gguf(&fixtures().join("tiny_llama.gguf")).unwrap();
    let want = Config {
        hidden: 32,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        intermediate: 64,
        layers: 2,
        vocab: 384,
        rope_theta: 10000.0,
        rms_eps: 1e-5,
        tied: false,
        max_positions: 128,
    };
    assert_eq!(hf.config, want);
    // GGUF stores eps as f32.
    assert_eq!(gg.config, Config { rms_eps: 1e-5f32 as f64, ..want });
    assert_eq!(hf.embed, gg.embed);
    assert_eq!(hf.final_norm, gg.final_norm);
    assert_eq!(hf.output, gg.output);
    for (i, (a, b)) in hf.layers.iter().zip(&gg.layers).enumerate() {
        assert_eq!(a, b, "layer {i}: the GGUF Q / K rows put back in Hugging Face's order");
    }
    // [in, out]: w_q[c][r] is q_proj.weight[r][c] of the checkpoint.
    assert_eq!(hf.layers[0].wq.len(), 32 * 32);
    assert_ne!(hf.layers[0].wq, gg_without_unpermute(), "the permutation is not a no-op");
}

/// Layer 0's Q weight read from the GGUF file with its rows as stored (permuted).
fn gg_without_unpermute() -> Vec<f32> {
    let g = llama_generate::gguf::Gguf::open(&fixtures().join("tiny_llama.gguf")).unwrap();
    let (shape, w) = g.f32("blk.0.attn_q.weight").unwrap();
    let (rows, cols) = (shape[0], shape[1]);
    let mut t = vec![0.0; w.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = w[r * cols + c];
        }
    }
    t
}

/// A change made to a copy of the fixture's config.json.
type ConfigEdit = dyn Fn(&mut serde_json::Value);

fn copy_fixture(to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixtures().join("tiny_llama").join(f), to.join(f)).unwrap();
    }
}

#[test]
fn broken_checkpoints_are_errors_naming_what_is_wrong() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("broken_llama");
    let _ = std::fs::remove_dir_all(&tmp);
    // A config without a required size, with uneven heads, with scaled RoPE.
    let cases: [(&str, &ConfigEdit, &str); 3] = [
        (
            "no_hidden",
            &|v| {
                v.as_object_mut().unwrap().remove("hidden_size");
            },
            "`hidden_size`: missing",
        ),
        ("uneven", &|v| v["num_key_value_heads"] = 3.into(), "not a whole group"),
        ("yarn", &|v| v["rope_parameters"]["rope_type"] = "yarn".into(), "only the default"),
    ];
    for (name, edit, want) in cases {
        let dir = tmp.join(name);
        copy_fixture(&dir);
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        edit(&mut v);
        std::fs::write(dir.join("config.json"), v.to_string()).unwrap();
        let e = Weights::from_hf_dir(&dir).unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains(want), "{name}: {e}");
    }
    // A config that disagrees with the tensors: the tensor is named with both shapes.
    let dir = tmp.join("wider");
    copy_fixture(&dir);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    v["intermediate_size"] = 65.into();
    std::fs::write(dir.join("config.json"), v.to_string()).unwrap();
    let e = Weights::from_hf_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("model.layers.0.mlp.gate_proj.weight") && e.contains("[64, 32]"), "{e}");
    // A truncated safetensors file.
    let dir = tmp.join("truncated");
    copy_fixture(&dir);
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let e = Weights::from_hf_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("model.safetensors") && e.contains("not a valid safetensors file"), "{e}");
    // No weights at all.
    let dir = tmp.join("empty");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixtures().join("tiny_llama/config.json"), dir.join("config.json")).unwrap();
    let e = Weights::from_hf_dir(&dir).unwrap_err().to_string();
    assert!(
        e.contains("model.safetensors.index.json") && e.contains("no model.safetensors"),
        "{e}"
    );
    // A shard outside the directory.
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        r#"{"weight_map": {"w": "../x.safetensors"}}"#,
    )
    .unwrap();
    let e = Weights::from_hf_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("not a file name in the directory"), "{e}");
}

#[test]
fn sharded_checkpoints_load_as_one() {
    // The fixture's tensors split over two shards with an index, as transformers shards.
    use safetensors::tensor::TensorView;
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sharded_llama");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::copy(fixtures().join("tiny_llama/config.json"), tmp.join("config.json")).unwrap();
    let bytes = std::fs::read(fixtures().join("tiny_llama/model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let mut map = serde_json::Map::new();
    for (k, part) in names.chunks(names.len() / 2 + 1).enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", k + 1);
        let views: Vec<(String, TensorView)> =
            part.iter().map(|n| (n.clone(), st.tensor(n).unwrap())).collect();
        safetensors::serialize_to_file(views, None, &tmp.join(&file)).unwrap();
        for n in part {
            map.insert(n.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({ "weight_map": map });
    std::fs::write(tmp.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let one = Weights::from_hf_dir(&fixtures().join("tiny_llama")).unwrap();
    assert_eq!(Weights::from_hf_dir(&tmp).unwrap(), one);
}
