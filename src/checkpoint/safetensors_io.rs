//! Writing and reading the safetensors files of a checkpoint.
//!
//! We write the format ourselves (an 8-byte little-endian header length, a
//! JSON header, then the tensor bytes) so the bytes can stream through the
//! hashing writer straight from the tensors' memory: no intermediate buffer
//! holding the whole file, and the SHA-256 is computed during the write, never
//! by reading the file back. Reading uses the `safetensors` crate, so what we
//! write is checked by the reference parser (and by Python's in tests).

use std::collections::BTreeMap;

use super::tensor::{DType, HostTensor, TensorSet};

/// The header bytes (length prefix + padded JSON) for `tensors` with `metadata`.
pub fn header(tensors: &TensorSet, metadata: &BTreeMap<String, String>) -> Vec<u8> {
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

/// Exact size of the file [`write`] produces.
pub fn file_size(tensors: &TensorSet, metadata: &BTreeMap<String, String>) -> u64 {
    header(tensors, metadata).len() as u64 + tensors.values().map(|t| t.data.len() as u64).sum::<u64>()
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

/// Parses a safetensors file's bytes into host tensors.
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

    #[test]
    fn truncated_file_is_rejected() {
        let mut buf = Vec::new();
        write(&mut buf, &sample(), &BTreeMap::new()).unwrap();
        assert!(read(&buf[..buf.len() - 3]).is_err());
    }
}
