//! Byte counts as people read them, shared by the command line, the report,
//! placement and `doctor`, so that none of them imports another for it.

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// `512 B`, `1.5 KiB`, `3.0 GiB`: the largest binary unit below the value
/// (up to TiB), for tables of file sizes.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= KIB as f64 && unit < UNITS.len() - 1 {
        value /= KIB as f64;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// `1.5 GiB`, `300.0 MiB`: memory sizes in MiB or GiB only, as placement
/// plans, memory warnings and disk checks print them.
pub fn mib_or_gib(n: u64) -> String {
    let (n, gib) = (n as f64, GIB as f64);
    if n >= gib { format!("{:.1} GiB", n / gib) } else { format!("{:.1} MiB", n / MIB as f64) }
}

/// Parses a size as people write it: `1GiB`, `256MiB`, `512k`, `1000000`
/// (binary units for `k`/`KiB`/`m`/`MiB`/`g`/`GiB`, decimal for `KB`/`MB`/`GB`).
/// The command line's `--bytes` and the config's sizes read this way.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("`{text}` is not a size: write e.g. 1GiB, 256MiB or 1048576"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => return Err(format!("unknown size unit `{other}`: use B, KiB, MiB, GiB, KB, MB or GB")),
    };
    Ok((n * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_picks_a_readable_unit() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }

    #[test]
    fn mib_or_gib_switches_to_gib_at_one_gib() {
        assert_eq!(mib_or_gib(300 << 20), "300.0 MiB");
        assert_eq!(mib_or_gib((1 << 30) - 1), "1024.0 MiB");
        assert_eq!(mib_or_gib(3 << 29), "1.5 GiB");
    }

    #[test]
    fn sizes_read_with_binary_and_decimal_units() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("1.5m"), Ok(3 << 19));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("1000000"), Ok(1_000_000));
        assert!(parse_size("lots").unwrap_err().contains("not a size"));
        assert!(parse_size("3 parsecs").unwrap_err().contains("unknown size unit `parsecs`"));
    }
}
