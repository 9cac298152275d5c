//! The TFRecord framing of an event file: each record is its length (u64,
//! little-endian), the masked CRC-32C of those 8 bytes, the payload, and the
//! masked CRC-32C of the payload. A writer killed mid-record leaves a torn
//! last record; TensorBoard's readers stop at it ("truncated record", retried
//! later) and go on with the next file. [`read_records`] says where the whole,
//! valid records end, so that a resume can cut a torn or damaged tail off.

use std::io::{self, Read};

/// The largest record read back: rekindle's are under a KiB; a length field
/// beyond this is damage, never allocated.
pub const MAX_RECORD_BYTES: u64 = 16 << 20;

/// CRC-32C masked as TFRecord does (so that a CRC of data holding CRCs is
/// not degenerate).
pub fn masked_crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data).rotate_right(15).wrapping_add(0xa282_ead8)
}

/// `payload` as one framed record, ready for a single `write`.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(payload.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&masked_crc(payload).to_le_bytes());
    out
}

/// Why reading records stopped before the end of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// Every byte belongs to a whole, valid record.
    Clean,
    /// The last record is cut short (a writer killed mid-record).
    Torn,
    /// A checksum or length does not match: nothing after it is trusted.
    Damaged,
}

/// Reads records from `reader`, calling `each(offset, payload)` for every
/// whole, valid one; returns the offset where they end and why reading
/// stopped there. Only an I/O error of `reader` is an error.
pub fn read_records(mut reader: impl Read, mut each: impl FnMut(u64, &[u8])) -> io::Result<(u64, Tail)> {
    let mut offset = 0u64;
    let (mut header, mut payload) = (Vec::with_capacity(12), Vec::new());
    loop {
        header.clear();
        match (&mut reader).take(12).read_to_end(&mut header)? {
            0 => return Ok((offset, Tail::Clean)),
            12 => {}
            _ => return Ok((offset, Tail::Torn)),
        }
        let len_bytes: [u8; 8] = header[..8].try_into().expect("8 bytes");
        let crc = u32::from_le_bytes(header[8..].try_into().expect("4 bytes"));
        if masked_crc(&len_bytes) != crc {
            return Ok((offset, Tail::Damaged));
        }
        let len = u64::from_le_bytes(len_bytes);
        if len > MAX_RECORD_BYTES {
            return Ok((offset, Tail::Damaged));
        }
        payload.clear();
        if (&mut reader).take(len + 4).read_to_end(&mut payload)? < len as usize + 4 {
            return Ok((offset, Tail::Torn));
        }
        let (data, crc) = payload.split_at(len as usize);
        if masked_crc(data).to_le_bytes() != crc {
            return Ok((offset, Tail::Damaged));
        }
        each(offset, data);
        offset += 12 + len + 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(bytes: &[u8]) -> (Vec<(u64, Vec<u8>)>, u64, Tail) {
        let mut out = Vec::new();
        let (end, tail) = read_records(bytes, |at, data| out.push((at, data.to_vec()))).unwrap();
        (out, end, tail)
    }

    #[test]
    fn masked_crc_matches_tensorflow() {
        // TensorFlow's crc32c_test: the CRC-32C of "123456789" is 0xe3069283;
        // masked: rotated right by 15 bits, plus 0xa282ead8.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xe306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8));
    }

    #[test]
    fn framed_records_read_back_with_their_offsets() {
        let bytes = [frame(b"one"), frame(b""), frame(b"three")].concat();
        let (got, end, tail) = records(&bytes);
        assert_eq!(got, vec![(0, b"one".to_vec()), (19, Vec::new()), (35, b"three".to_vec())]);
        assert_eq!((end, tail), (bytes.len() as u64, Tail::Clean));
    }

    #[test]
    fn a_torn_or_damaged_record_ends_the_valid_ones() {
        let whole = [frame(b"one"), frame(b"two")].concat();
        for cut in 20..whole.len() {
            let (got, end, tail) = records(&whole[..cut]);
            assert_eq!((got.len(), end, tail), (1, 19, Tail::Torn), "cut at {cut}");
        }
        let mut flipped = whole.clone();
        flipped[19 + 13] ^= 1; // the second payload
        assert_eq!(records(&flipped).1..=records(&flipped).1, 19..=19);
        assert_eq!(records(&flipped).2, Tail::Damaged);
        let mut huge = whole.clone();
        huge[19..27].copy_from_slice(&u64::MAX.to_le_bytes());
        let crc = masked_crc(&huge[19..27]).to_le_bytes();
        huge[27..31].copy_from_slice(&crc);
        assert_eq!(records(&huge).2, Tail::Damaged, "a length beyond the limit is never allocated");
    }
}
