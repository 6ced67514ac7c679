//! The tiny Llama's own tokenizer (a byte-level BPE with SmolLM's pre-tokenizer, trained by
//! `tests/fixtures/make_tiny_llama.py`) from its `tokenizer.json` and rebuilt from its GGUF
//! conversion's `tokenizer.ggml.*` metadata: both give the ids Hugging Face `tokenizers`
//! gave (`tiny_llama_tokens.json`) for texts that exercise the pre-tokenizer, and decode back
//! to its text. Streaming never emits half a character. Broken tokenizer metadata is an error
//! naming the key.

use llama_generate::gguf::{Gguf, Value};
use llama_generate::{TextStream, Tokenizer};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn cases() -> Vec<(String, Vec<u32>, String)> {
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tiny_llama_tokens.json")).unwrap(),
    )
    .unwrap();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let ids = c["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32);
            (
                c["text"].as_str().unwrap().to_string(),
                ids.collect(),
                c["decoded"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn both() -> Vec<(&'static str, Tokenizer)> {
    let g = Gguf::open(&fixtures().join("tiny_llama.gguf")).unwrap();
    vec![
        ("tokenizer.json", Tokenizer::from_hf_dir(&fixtures().join("tiny_llama")).unwrap()),
        ("gguf", Tokenizer::from_gguf(&g).unwrap()),
    ]
}

#[test]
fn both_sources_tokenize_as_hugging_face() {
    let cases = cases();
    assert!(cases.iter().any(|c| c.0.contains("<|im_start|>")), "the fixture has control tokens");
    for (source, tok) in both() {
        assert_eq!(tok.vocab_size(), 384, "{source}");
        assert_eq!(tok.eos(), &[2], "{source}: <|im_end|> ends generation");
        for (text, ids, decoded) in &cases {
            assert_eq!(&tok.encode(text).unwrap(), ids, "{source}: {text:?}");
            assert_eq!(&tok.decode(ids).unwrap(), decoded, "{source}: decode of {text:?}");
        }
    }
}

#[test]
fn a_stream_emits_whole_characters_that_add_up_to_the_text() {
    for (source, tok) in both() {
        for (text, ids, decoded) in cases() {
            let mut stream = TextStream::new(&tok);
            let mut out = String::new();
            for &id in &ids {
                let piece = stream.push(id).unwrap();
                assert!(!piece.contains('\u{fffd}'), "{source}: {text:?}: {piece:?}");
                out.push_str(&piece);
            }
            assert_eq!(out, decoded, "{source}: {text:?}");
        }
    }
    // The emoji is bytes of several tokens: the pieces before the last are held back.
    let tok = &both()[0].1;
    let ids = tok.encode("🙂").unwrap();
    assert!(ids.len() > 1, "an emoji the tiny vocabulary splits into byte tokens");
    let mut stream = TextStream::new(tok);
    let pieces: Vec<String> = ids.iter().map(|&i| stream.push(i).unwrap()).collect();
    assert_eq!(pieces.concat(), "🙂");
    assert!(pieces[..ids.len() - 1].iter().all(|p| p.is_empty()), "{pieces:?}");
}

/// The GGUF fixture with one metadata entry replaced (or removed, for `None`).
fn tokenizer_with(key: &str, value: Option<Value>) -> llama_generate::Result<Tokenizer> {
    let mut g = Gguf::open(&fixtures().join("tiny_llama.gguf")).unwrap();
    match value {
        Some(v) => g.metadata.insert(key.into(), v),
        None => g.metadata.remove(key),
    };
    Tokenizer::from_gguf(&g)
}

#[test]
fn broken_tokenizer_metadata_is_an_error_naming_the_key() {
    let s = |x: &str| Value::String(x.into());
    let tokens =
        match Gguf::open(&fixtures().join("tiny_llama.gguf")).unwrap().get("tokenizer.ggml.tokens")
        {
            Ok(Value::Array(t)) => t.clone(),
            other => panic!("{other:?}"),
        };
    let cases: Vec<(&str, Option<Value>, &str)> = vec![
        ("tokenizer.ggml.model", Some(s("llama")), "SentencePiece"),
        ("tokenizer.ggml.model", Some(s("bert")), "only byte-level BPE"),
        ("tokenizer.ggml.model", None, "not in the file"),
        ("tokenizer.ggml.pre", Some(s("klingon")), "pre-tokenizer `klingon` is not known"),
        ("tokenizer.ggml.tokens", Some(Value::U32(3)), "is not an array"),
        ("tokenizer.ggml.tokens", Some(Value::Array(vec![s("a"), Value::I32(1)])), "item 1"),
        (
            "tokenizer.ggml.token_type",
            Some(Value::Array(vec![Value::I32(1)])),
            "1 types for 384 tokens",
        ),
        ("tokenizer.ggml.merges", Some(Value::Array(vec![s("nospace")])), "merge 0 `nospace`"),
        ("tokenizer.ggml.merges", Some(Value::Array(vec![s("Ġ zzzz")])), "merge 0 `Ġ zzzz`"),
        ("tokenizer.ggml.bos_token_id", Some(Value::U32(384)), "id 384 is outside the 384 tokens"),
        ("tokenizer.ggml.eos_token_id", Some(Value::I32(-1)), "not a non-negative integer"),
        ("tokenizer.ggml.add_bos_token", Some(Value::U8(1)), "is not a bool"),
    ];
    for (key, value, want) in cases {
        let e = match tokenizer_with(key, value) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{key}: accepted"),
        };
        assert!(e.contains(key) && e.contains(want), "{key}: {e}");
        assert!(e.starts_with(&fixtures().join("tiny_llama.gguf").display().to_string()), "{e}");
    }
    // A vocabulary shorter than the types array is caught as the count mismatch.
    let short = Value::Array(tokens[..10].to_vec());
    let e = tokenizer_with("tokenizer.ggml.tokens", Some(short)).err().unwrap().to_string();
    assert!(e.contains("384 types for 10 tokens"), "{e}");
}

#[test]
fn a_bos_the_file_asks_for_is_put_in_front() {
    let tok = tokenizer_with("tokenizer.ggml.add_bos_token", Some(Value::Bool(true))).unwrap();
    let plain = &both()[1].1;
    let text = "The quick brown fox";
    let mut want = vec![1];
    want.extend(plain.encode(text).unwrap());
    assert_eq!(tok.encode(text).unwrap(), want);
}

#[test]
fn a_missing_tokenizer_json_is_an_error_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("llama_tok_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let e = Tokenizer::from_hf_dir(&dir).err().unwrap().to_string();
    assert!(e.contains("tokenizer.json") && e.contains("cannot load"), "{e}");
    std::fs::write(dir.join("tokenizer.json"), "{ not json").unwrap();
    let e = Tokenizer::from_hf_dir(&dir).err().unwrap().to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
