//! The one content hash of the project: 64-bit FNV-1a. Stable across processes, toolchains and
//! machines (unlike `std`'s hasher), so it can key build output (graph hashes, the object
//! cache) and be recorded at build time and checked at run time (the weights of a
//! `Builder::onnx` module).

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0100_0000_01b3;

/// FNV-1a (64-bit) of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(OFFSET_BASIS, |h, b| (h ^ *b as u64).wrapping_mul(PRIME))
}

/// FNV-1a of `s` as 16 hex digits: a content key.
pub fn fingerprint(s: &str) -> String {
    format!("{:016x}", fnv1a(s.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // The published FNV-1a 64-bit test vectors.
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x85944171f73967e8);
        assert_eq!(fingerprint("a"), "af63dc4c8601ec8c");
    }
}
