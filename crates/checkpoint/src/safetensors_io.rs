//! Writing and reading the safetensors files of a checkpoint.
//!
//! We write the format ourselves (an 8-byte little-endian header length, a
//! JSON header, then the tensor bytes) so the bytes can stream through the
//! hashing writer straight from the tensors' memory: no intermediate buffer
//! holding the whole file, and the SHA-256 is computed during the write, never
//! by reading the file back. Reading uses the `safetensors` crate, so what we
//! write is checked by the reference parser (and by Python's in tests).

use std::collections::BTreeMap;

#[cfg(test)]
use super::tensor::TensorSet;
use super::tensor::{DType, HostTensor};

/// The header bytes (length prefix + padded JSON) for `tensors` with `metadata`.
#[cfg(test)]
pub fn header(tensors: &TensorSet, metadata: &BTreeMap<String, String>) -> Vec<u8> {
    header_of(tensors, metadata)
}

/// [`header`] of any tensors, in the order given (a shard's: a run of a
/// set's tensors in name order).
pub fn header_of<'a>(
    tensors: impl IntoIterator<Item = (&'a String, &'a HostTensor)>,
    metadata: &BTreeMap<String, String>,
) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    if !metadata.is_empty() {
        map.insert("__metadata__".into(), serde_json::to_value(metadata).expect("string map"));
    }
    let mut offset = 0usize;
    for (name, t) in tensors {
        let end = offset + t.data.len();
        map.insert(
            name.clone(),
            serde_json::json!({
                "dtype": t.dtype.safetensors_name(),
                "shape": t.shape,
                "data_offsets": [offset, end],
            }),
        );
        offset = end;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(map)).expect("header serialises");
    // Pad with spaces so tensor data starts 8-byte aligned, as the spec asks.
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out
}

/// Exact size of the file [`write`] produces of `tensors` (in that order).
pub fn file_size<'a>(
    tensors: impl IntoIterator<Item = (&'a String, &'a HostTensor)> + Clone,
    metadata: &BTreeMap<String, String>,
) -> u64 {
    header_of(tensors.clone(), metadata).len() as u64
        + tensors.into_iter().map(|(_, t)| t.data.len() as u64).sum::<u64>()
}

/// Streams `tensors` (in name order) as a safetensors file into `out`
/// (the store writes the same parts itself, hashing them on the side).
#[cfg(test)]
pub fn write<W: std::io::Write + ?Sized>(
    out: &mut W,
    tensors: &TensorSet,
    metadata: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    out.write_all(&header(tensors, metadata))?;
    for t in tensors.values() {
        out.write_all(&t.data)?;
    }
    Ok(())
}

/// Bytes needed to check a file's layout with [`check_layout`]: the 8-byte
/// length prefix, then the header of that length.
pub fn header_len(prefix: &[u8; 8]) -> u64 {
    u64::from_le_bytes(*prefix)
}

/// Longest header [`read_layout`] reads; the `safetensors` crate refuses
/// longer ones too (its `MAX_HEADER_SIZE`).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The header length a file of `file_len` bytes announces in its `prefix`,
/// checked against the file and [`MAX_HEADER_BYTES`] before anything is
/// allocated or sliced for it (the prefix is untrusted).
pub fn checked_header_len(prefix: &[u8; 8], file_len: u64) -> Result<usize, String> {
    let n = header_len(prefix);
    if n > file_len.saturating_sub(8) || n > MAX_HEADER_BYTES {
        return Err(format!(
            "header length {n} does not fit the file of {file_len} bytes (at most {MAX_HEADER_BYTES})"
        ));
    }
    Ok(n as usize)
}

/// Reads the length prefix and header of a safetensors file of `file_len`
/// bytes from `r` and checks its layout ([`check_layout`]). The length in the
/// prefix is untrusted: it is checked against `file_len` and
/// [`MAX_HEADER_BYTES`] before anything is allocated for it, so a header
/// claiming 2^60 bytes is an error, not an allocation.
pub fn read_layout<R: std::io::Read>(r: &mut R, file_len: u64) -> Result<Vec<TensorLayout>, LayoutError> {
    let mut prefix = [0u8; 8];
    r.read_exact(&mut prefix)
        .map_err(|_| LayoutError::Invalid(format!("shorter than a safetensors header ({file_len} bytes)")))?;
    let n = checked_header_len(&prefix, file_len).map_err(LayoutError::Invalid)?;
    let mut header = vec![0u8; n];
    r.read_exact(&mut header).map_err(LayoutError::Io)?;
    parse_layout(&header, file_len).map_err(LayoutError::Invalid)
}

/// Why [`read_layout`] refused a file.
#[derive(Debug)]
pub enum LayoutError {
    /// The bytes are not a safetensors file of this length.
    Invalid(String),
    /// Reading failed.
    Io(std::io::Error),
}

/// Checks a safetensors header against the file's length without reading the
/// tensor data: every dtype known, every tensor's byte range matching its
/// shape, ranges contiguous from 0 and ending exactly at the end of the file.
/// This is what parsing checks, so a file that passes loads.
#[cfg(test)]
pub fn check_layout(header: &[u8], file_len: u64) -> Result<(), String> {
    parse_layout(header, file_len).map(|_| ())
}

/// One tensor of a safetensors header: where its bytes lie in the data
/// section and what they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLayout {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Byte range in the data section (after the header).
    pub start: u64,
    pub end: u64,
}

/// [`check_layout`], returning the tensors in the order of their bytes in
/// the file (what a reader filling each tensor's own buffer needs).
pub fn parse_layout(header: &[u8], file_len: u64) -> Result<Vec<TensorLayout>, String> {
    let data_len = file_len
        .checked_sub(8 + header.len() as u64)
        .ok_or_else(|| format!("header of {} bytes does not fit a file of {file_len} bytes", header.len()))?;
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(header)
        .map_err(|e| format!("not a safetensors file: header is not a JSON object: {e}"))?;
    let mut tensors = Vec::new();
    for (name, info) in &map {
        if name == "__metadata__" {
            continue;
        }
        let dtype = info["dtype"]
            .as_str()
            .and_then(DType::from_safetensors_name)
            .ok_or_else(|| format!("tensor `{name}` has an unsupported or missing dtype {}", info["dtype"]))?;
        let shape: Vec<u64> = info["shape"]
            .as_array()
            .and_then(|a| a.iter().map(|d| d.as_u64()).collect())
            .ok_or_else(|| format!("tensor `{name}` has no valid shape"))?;
        let offsets: Vec<u64> = info["data_offsets"]
            .as_array()
            .and_then(|a| a.iter().map(|d| d.as_u64()).collect())
            .filter(|o: &Vec<u64>| o.len() == 2 && o[0] <= o[1])
            .ok_or_else(|| format!("tensor `{name}` has no valid data_offsets"))?;
        let bytes = shape.iter().try_fold(dtype.size() as u64, |acc, d| acc.checked_mul(*d));
        if bytes != Some(offsets[1] - offsets[0]) {
            return Err(format!(
                "tensor `{name}`: shape {shape:?} does not match its {} data bytes",
                offsets[1] - offsets[0]
            ));
        }
        let shape = shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("tensor `{name}`: dimension {d} does not fit memory")))
            .collect::<Result<Vec<usize>, String>>()?;
        tensors.push(TensorLayout { name: name.clone(), dtype, shape, start: offsets[0], end: offsets[1] });
    }
    tensors.sort_by(|a, b| (a.start, a.end, &a.name).cmp(&(b.start, b.end, &b.name)));
    let mut at = 0;
    for t in &tensors {
        if t.start != at {
            return Err(format!("tensor `{}` starts at byte {}, expected {at} (overlap or gap)", t.name, t.start));
        }
        at = t.end;
    }
    if at != data_len {
        return Err(format!("tensor data ends at byte {at} but the file holds {data_len} data bytes"));
    }
    Ok(tensors)
}

/// Parses a safetensors file's bytes into host tensors with the reference
/// parser (the `safetensors` crate). Loading maps files with
/// `hashed_io::map_tensors_hashed` instead (the tensors share the mapping,
/// layout checked by [`parse_layout`]; `read_tensors_hashed` reads where a
/// file cannot be mapped); the property tests hold all three to the same
/// verdict.
#[cfg(test)]
pub fn read(bytes: &[u8]) -> Result<TensorSet, String> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| format!("not a safetensors file: {e}"))?;
    let mut set = TensorSet::new();
    for (name, view) in st.tensors() {
        let dtype_name = format!("{:?}", view.dtype());
        let dtype = DType::from_safetensors_name(&dtype_name)
            .ok_or_else(|| format!("tensor `{name}` has unsupported dtype {dtype_name}"))?;
        let tensor = HostTensor::new(dtype, view.shape().to_vec(), view.data().to_vec())
            .map_err(|e| format!("tensor `{name}`: {e}"))?;
        set.insert(name, tensor);
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TensorSet {
        let mut set = TensorSet::new();
        set.insert("b.bias".into(), HostTensor::from_f32(vec![3], &[1.0, -2.0, 3.5]));
        set.insert("a.weight".into(), HostTensor::from_f32(vec![2, 2], &[0.1, 0.2, 0.3, 0.4]));
        set.insert("step".into(), HostTensor::new(DType::I64, vec![1], 7i64.to_le_bytes().to_vec()).unwrap());
        set
    }

    #[test]
    fn written_file_is_read_back_identically_by_the_reference_parser() {
        let set = sample();
        let meta = BTreeMap::from([("format".to_string(), "rekindle".to_string())]);
        let mut buf = Vec::new();
        write(&mut buf, &set, &meta).unwrap();
        assert_eq!(buf.len() as u64, file_size(&set, &meta));
        assert_eq!(read(&buf).unwrap(), set);
        let (_, parsed_meta) = safetensors::SafeTensors::read_metadata(&buf).unwrap();
        assert_eq!(parsed_meta.metadata().as_ref().unwrap()["format"], "rekindle");
    }

    #[test]
    fn tensor_data_is_eight_byte_aligned() {
        let mut buf = Vec::new();
        write(&mut buf, &sample(), &BTreeMap::new()).unwrap();
        let header_len = u64::from_le_bytes(buf[..8].try_into().unwrap()) as usize;
        assert_eq!((8 + header_len) % 8, 0);
    }

    #[test]
    fn identical_state_gives_identical_bytes() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        write(&mut a, &sample(), &BTreeMap::new()).unwrap();
        write(&mut b, &sample(), &BTreeMap::new()).unwrap();
        assert_eq!(a, b);
    }

    fn split(buf: &[u8]) -> (&[u8], u64) {
        let n = header_len(buf[..8].try_into().unwrap()) as usize;
        (&buf[8..8 + n], buf.len() as u64)
    }

    #[test]
    fn layout_check_accepts_what_we_write_and_refuses_what_parsing_refuses() {
        let mut buf = Vec::new();
        write(&mut buf, &sample(), &BTreeMap::new()).unwrap();
        let (header, len) = split(&buf);
        assert_eq!(check_layout(header, len), Ok(()));
        assert!(check_layout(header, len - 1).unwrap_err().contains("data bytes"));
        assert!(check_layout(header, len + 4).is_err());
        let gap = br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
        assert!(check_layout(gap, 8 + gap.len() as u64 + 8).unwrap_err().contains("gap"));
        let bad_shape = br#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
        assert!(check_layout(bad_shape, 8 + bad_shape.len() as u64 + 8).unwrap_err().contains("shape"));
        let bad_dtype = br#"{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}"#;
        assert!(check_layout(bad_dtype, 8 + bad_dtype.len() as u64 + 1).unwrap_err().contains("dtype"));
        assert!(check_layout(b"not json", 100).is_err());
    }

    #[test]
    fn truncated_file_is_rejected() {
        let mut buf = Vec::new();
        write(&mut buf, &sample(), &BTreeMap::new()).unwrap();
        assert!(read(&buf[..buf.len() - 3]).is_err());
    }

    #[test]
    fn a_header_claiming_2_pow_60_bytes_is_refused_before_any_allocation() {
        let mut file = (1u64 << 60).to_le_bytes().to_vec();
        file.extend_from_slice(b"{}");
        let err = read_layout(&mut file.as_slice(), file.len() as u64).unwrap_err();
        assert!(matches!(&err, LayoutError::Invalid(r) if r.contains("header length 1152921504606846976")), "{err:?}");
        // Even when the file claims to be that long (a sparse file, a lying
        // manifest), the header is capped.
        let err = read_layout(&mut file.as_slice(), 1 << 62).unwrap_err();
        assert!(matches!(err, LayoutError::Invalid(_)), "{err:?}");
        assert!(read(&file).is_err());
    }

    #[test]
    fn a_shape_whose_byte_count_overflows_is_refused() {
        let header = br#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}}"#;
        let err = check_layout(header, 8 + header.len() as u64 + 4).unwrap_err();
        assert!(err.contains("does not match"), "{err}");
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header);
        file.extend_from_slice(&[0; 4]);
        assert!(read(&file).is_err());
        let past_end =
            br#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[18446744073709551611,18446744073709551615]}}"#;
        assert!(check_layout(past_end, 8 + past_end.len() as u64 + 4).is_err());
    }

    /// Property tests over arbitrary and mutated files; see `crate::fuzz`.
    mod fuzz {
        use super::*;
        use crate::fuzz;
        use proptest::prelude::*;

        fn valid_file() -> Vec<u8> {
            let mut buf = Vec::new();
            write(&mut buf, &sample(), &BTreeMap::from([("format".to_string(), "pt".to_string())])).unwrap();
            buf
        }

        /// Every reader of the file, with the promise that ties them: a file
        /// whose layout checks (what `verify` checks without reading the data)
        /// parses (what resume does).
        fn read_every_way(bytes: &[u8]) -> Result<(), TestCaseError> {
            let parsed = read(bytes);
            let layout = read_layout(&mut &bytes[..], bytes.len() as u64);
            if let Err(LayoutError::Io(e)) = &layout {
                return Err(TestCaseError::fail(format!("reading from memory failed: {e}")));
            }
            if layout.is_ok() {
                prop_assert!(parsed.is_ok(), "layout checks but parsing fails: {:?}", parsed);
            }
            // The loader (one pass from the file into the tensors' buffers)
            // agrees with the layout check, reads what the reference parser
            // reads, and hashes the whole file whatever its content.
            let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let path = dir.path().join("f.safetensors");
            std::fs::write(&path, bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let loaded = crate::hashed_io::read_tensors_hashed(
                std::fs::File::open(&path).map_err(|e| TestCaseError::fail(e.to_string()))?,
            )
            .map_err(|e| TestCaseError::fail(format!("reading the file failed: {e}")))?;
            prop_assert_eq!(loaded.bytes, bytes.len() as u64);
            prop_assert_eq!(&loaded.sha256, &hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bytes)));
            prop_assert_eq!(loaded.tensors.is_ok(), layout.is_ok(), "loader and layout check disagree");
            // The mapped loader (what `load_dir` uses) gives the same verdict,
            // hash and tensors as the reading one.
            let mapped = crate::hashed_io::map_tensors_hashed(
                std::fs::File::open(&path).map_err(|e| TestCaseError::fail(e.to_string()))?,
            )
            .map_err(|e| TestCaseError::fail(format!("mapping the file failed: {e}")))?;
            prop_assert_eq!(mapped.bytes, loaded.bytes);
            prop_assert_eq!(&mapped.sha256, &loaded.sha256);
            prop_assert_eq!(&mapped.tensors.as_ref().ok(), &loaded.tensors.as_ref().ok());
            prop_assert_eq!(mapped.tensors.is_ok(), loaded.tensors.is_ok());
            if let Ok(tensors) = loaded.tensors {
                prop_assert!(Ok(tensors) == parsed, "the loader read other tensors than the reference parser");
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(fuzz::config())]

            #[test]
            fn arbitrary_bytes_are_read_or_refused(bytes in fuzz::bytes(256)) {
                read_every_way(&bytes)?;
            }

            #[test]
            fn mutated_files_are_read_or_refused(bytes in fuzz::mutated(valid_file())) {
                read_every_way(&bytes)?;
            }

            #[test]
            fn any_header_length_prefix_is_checked_before_allocating(n in any::<u64>(), claimed in any::<u64>()) {
                let mut file = valid_file();
                file[..8].copy_from_slice(&n.to_le_bytes());
                // `claimed`: the length a manifest says the file has.
                let _ = read_layout(&mut file.as_slice(), claimed);
                read_every_way(&file)?;
            }

            #[test]
            fn any_header_is_checked_against_any_length(header in fuzz::mutated(split(&valid_file()).0.to_vec()), len in any::<u64>()) {
                let _ = check_layout(&header, len);
            }
        }
    }
}
