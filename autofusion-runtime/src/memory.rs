//! What a call will allocate, computed with overflow checks and compared with a memory limit
//! before anything is allocated: a shape too large for the machine is an `Err` naming the
//! graph, the bound dims and the bytes, never an aborted process.
//!
//! The limit is `AUTOFUSION_MEMORY_LIMIT` (bytes, or with a `K`/`M`/`G`/`T` suffix, powers of
//! 1024) when set, else three quarters of the physical memory; `Module::set_memory_limit`
//! overrides it per module.

use crate::error::{Error, Result};
use once_cell::sync::Lazy;

/// The process-wide default limit in bytes.
pub fn default_limit() -> usize {
    static LIMIT: Lazy<usize> = Lazy::new(|| {
        std::env::var("AUTOFUSION_MEMORY_LIMIT")
            .ok()
            .and_then(|v| parse_bytes(&v))
            .unwrap_or_else(|| physical_memory().map_or(usize::MAX, |b| b / 4 * 3))
    });
    *LIMIT
}

/// `"1048576"`, `"512M"`, `"8G"`, `"1.5T"` as bytes.
pub fn parse_bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&s[..i], s[i..].trim_end_matches(['B', 'b', 'i'])),
        None => (s, ""),
    };
    let scale: f64 = match unit.to_ascii_uppercase().as_str() {
        "" => 1.0,
        "K" => 1024.0,
        "M" => 1024.0 * 1024.0,
        "G" => 1024.0 * 1024.0 * 1024.0,
        "T" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let v: f64 = num.trim().parse().ok()?;
    let bytes = v * scale;
    (bytes.is_finite() && bytes >= 0.0 && bytes < usize::MAX as f64).then_some(bytes as usize)
}

/// Physical memory from `/proc/meminfo` (Linux); `None` elsewhere.
fn physical_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Bytes for humans: `480.3 GB` (decimal units, as allocators and `free -h --si` print).
pub fn human(bytes: usize) -> String {
    let b = bytes as f64;
    match bytes {
        0..=999 => format!("{bytes} B"),
        1_000..=999_999 => format!("{:.1} kB", b / 1e3),
        1_000_000..=999_999_999 => format!("{:.1} MB", b / 1e6),
        _ => format!("{:.1} GB", b / 1e9),
    }
}

/// Bytes of a tensor of `shape` with `elem` bytes per element; `None` when it overflows.
pub fn tensor_bytes(shape: &[usize], elem: usize) -> Option<usize> {
    shape.iter().try_fold(elem, |acc, &d| acc.checked_mul(d))
}

/// The memory one call needs, by part (`arena of intermediates`, `outputs`, ...); a part is
/// `None` when its size overflows.
#[derive(Clone, Debug, Default)]
pub struct Footprint {
    pub parts: Vec<(&'static str, Option<usize>)>,
}

impl Footprint {
    pub fn add(&mut self, what: &'static str, bytes: Option<usize>) {
        self.parts.push((what, bytes));
    }
    /// The total, `None` when a part or the sum overflows.
    pub fn total(&self) -> Option<usize> {
        self.parts.iter().try_fold(0usize, |acc, (_, b)| acc.checked_add((*b)?))
    }
    /// `Err(Error::Memory)` when the total is over `limit` (or overflows): names the graph,
    /// the bound dims (`S = 100000`) and the largest part.
    pub fn check(&self, graph: &str, dims: &str, limit: usize) -> Result<usize> {
        match self.total() {
            Some(t) if t <= limit => Ok(t),
            total => {
                let largest = self
                    .parts
                    .iter()
                    .max_by_key(|(_, b)| b.map_or(u128::MAX, |b| b as u128))
                    .map(|(what, b)| match b {
                        Some(b) => format!("{} for the {what}", human(*b)),
                        None => format!("the {what} overflow a 64-bit size"),
                    })
                    .unwrap_or_default();
                Err(Error::Memory {
                    graph: graph.to_string(),
                    dims: dims.to_string(),
                    bytes: total,
                    largest,
                    limit,
                })
            }
        }
    }
}

/// A zeroed `Vec` of `n` values, or `Err` when the allocator refuses (the process is not
/// aborted).
pub fn try_zeroed<T: Clone + Default>(n: usize, graph: &str, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::Alloc {
        graph: graph.to_string(),
        what: what.to_string(),
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    })?;
    v.resize(n, T::default());
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("512M"), Some(512 << 20));
        assert_eq!(parse_bytes("8G"), Some(8 << 30));
        assert_eq!(parse_bytes("8GiB"), Some(8 << 30));
        assert_eq!(parse_bytes("1.5k"), Some(1536));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes("-1G"), None);
    }

    #[test]
    fn footprints_over_the_limit_or_overflowing_are_errors() {
        let mut f = Footprint::default();
        f.add("outputs", tensor_bytes(&[4, 4], 4));
        f.add("arena of intermediates", tensor_bytes(&[100_000, 100_000, 12], 4));
        assert_eq!(f.check("g", "S = 100000", usize::MAX).unwrap(), 64 + 480_000_000_000);
        let e = f.check("g", "S = 100000", 1 << 30).unwrap_err().to_string();
        assert!(e.contains("`g` with S = 100000") && e.contains("480.0 GB"), "{e}");
        f.add("packed weights", tensor_bytes(&[usize::MAX, 2], 4));
        let e = f.check("g", "S = 1", usize::MAX).unwrap_err().to_string();
        assert!(e.contains("overflow"), "{e}");
    }
}
