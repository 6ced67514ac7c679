//! NumPy's `.npy` format, version 1.0, for outputs scripts compare (`numpy.load` reads it): a magic
//! string, a header dict padded with spaces to a multiple of 64 bytes, then the data.

use std::io::Write;

/// Write `data` (row-major, little-endian f32) of `shape` to `path`.
pub fn write_f32(path: &std::path::Path, shape: &[usize], data: &[f32]) -> std::io::Result<()> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    // magic (6) + version (2) + header length (2) + header + '\n', a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    out.write_all(b"\x93NUMPY\x01\x00")?;
    out.write_all(&(header.len() as u16).to_le_bytes())?;
    out.write_all(header.as_bytes())?;
    for v in data {
        out.write_all(&v.to_le_bytes())?;
    }
    out.flush()
}
