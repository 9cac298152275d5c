//! A JSON description of a node's GPUs, used instead of probing
//! (`rekindle gpus --inventory FILE`): users see the plan for the node they
//! are about to request, and tests cover 0–4 devices of any size.
//!
//! ```json
//! {"devices": [{"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559, "memory_free_mib": 80000}]}
//! ```
//!
//! Required per device: `vendor` (`nvidia` or `amd`), `name`,
//! `memory_total_mib`. Optional: `memory_free_mib` (default: the total),
//! `index` (default: position among the devices of that vendor), `uuid`,
//! `utilization_pct`, `temperature_c`, `power_w`, `driver_version`, and the
//! health counters the start-of-attempt check reads (`crate::health`):
//! `ecc_uncorrected`, `retired_pages_pending`, `remapped_rows_pending`,
//! `throttle_reasons` (a list of words). Every error names the file and the
//! JSON path of the bad value.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::error::GpuError;
use super::probe::{DeviceHealth, GpuDevice, GpuProbe, Probed, Vendor};

const DEVICE_KEYS: [&str; 14] = [
    "vendor",
    "name",
    "memory_total_mib",
    "memory_free_mib",
    "index",
    "uuid",
    "utilization_pct",
    "temperature_c",
    "power_w",
    "driver_version",
    "ecc_uncorrected",
    "retired_pages_pending",
    "remapped_rows_pending",
    "throttle_reasons",
];

/// Answers every probe with the devices of an inventory file (read each time,
/// so an edited file is seen by the next sample).
pub struct InventoryProbe {
    path: PathBuf,
}

impl InventoryProbe {
    pub fn new(path: impl Into<PathBuf>) -> InventoryProbe {
        InventoryProbe { path: path.into() }
    }
}

impl GpuProbe for InventoryProbe {
    fn name(&self) -> String {
        format!("inventory {}", self.path.display())
    }

    fn probe(&self) -> Result<Probed, GpuError> {
        let devices = read_inventory(&self.path)?;
        Ok(Probed { devices, notes: vec![format!("devices read from inventory {}", self.path.display())] })
    }
}

/// Reads and checks an inventory file.
pub fn read_inventory(path: &Path) -> Result<Vec<GpuDevice>, GpuError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| GpuError::InventoryRead { path: path.to_path_buf(), source })?;
    parse_inventory(&text, path)
}

/// Parses inventory text; `path` is used in error messages only.
pub fn parse_inventory(text: &str, path: &Path) -> Result<Vec<GpuDevice>, GpuError> {
    let value: Value = serde_json::from_str(text).map_err(|e| GpuError::InventorySyntax {
        path: path.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: e.to_string().split(" at line ").next().unwrap_or_default().to_string(),
    })?;
    let bad = |field: String, message: String| GpuError::InventoryField { path: path.to_path_buf(), field, message };
    let top = value.as_object().ok_or_else(|| bad("$".into(), format!("must be an object, found {}", kind(&value))))?;
    if let Some(key) = top.keys().find(|k| k.as_str() != "devices") {
        return Err(bad(key.clone(), "is not an inventory key (the only top-level key is `devices`)".into()));
    }
    let list = top.get("devices").ok_or_else(|| bad("devices".into(), "is missing (a list of devices)".into()))?;
    let list = list.as_array().ok_or_else(|| bad("devices".into(), format!("must be a list, found {}", kind(list))))?;

    let mut devices: Vec<GpuDevice> = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let at = |key: &str| format!("devices[{i}].{key}");
        let object = item
            .as_object()
            .ok_or_else(|| bad(format!("devices[{i}]"), format!("must be an object, found {}", kind(item))))?;
        if let Some(key) = object.keys().find(|k| !DEVICE_KEYS.contains(&k.as_str())) {
            let hint = strsim_hint(key);
            return Err(bad(at(key), format!("is not a device key{hint}; device keys: {}", DEVICE_KEYS.join(", "))));
        }
        let fields = Fields { object, at: &at, bad: &bad };
        let vendor_text =
            fields.string("vendor")?.ok_or_else(|| bad(at("vendor"), "is missing (\"nvidia\" or \"amd\")".into()))?;
        let vendor = Vendor::parse(&vendor_text)
            .ok_or_else(|| bad(at("vendor"), format!("must be \"nvidia\" or \"amd\" (got {vendor_text:?})")))?;
        let name = fields.string("name")?.ok_or_else(|| bad(at("name"), "is missing".into()))?;
        let total =
            fields.unsigned("memory_total_mib")?.ok_or_else(|| bad(at("memory_total_mib"), "is missing".into()))?;
        if total == 0 {
            return Err(bad(at("memory_total_mib"), "must be greater than 0".into()));
        }
        let free = fields.unsigned("memory_free_mib")?.unwrap_or(total);
        if free > total {
            return Err(bad(at("memory_free_mib"), format!("must not exceed memory_total_mib = {total} (got {free})")));
        }
        let index = match fields.unsigned("index")? {
            Some(index) => u32::try_from(index).map_err(|_| bad(at("index"), format!("is too large (got {index})")))?,
            None => devices.iter().filter(|d| d.vendor == vendor).count() as u32,
        };
        if devices.iter().any(|d| d.vendor == vendor && d.index == index) {
            return Err(bad(at("index"), format!("repeats {vendor} index {index}")));
        }
        let uuid = fields.string("uuid")?;
        if let Some(uuid) = &uuid
            && devices.iter().any(|d| d.uuid.as_deref().is_some_and(|u| u.eq_ignore_ascii_case(uuid)))
        {
            return Err(bad(at("uuid"), format!("repeats uuid {uuid:?}")));
        }
        let utilization = match fields.unsigned("utilization_pct")? {
            Some(pct) if pct > 100 => {
                return Err(bad(at("utilization_pct"), format!("must be at most 100 (got {pct})")));
            }
            other => other.map(|pct| pct as u32),
        };
        let power = fields.number("power_w")?;
        if power.is_some_and(|w| w < 0.0) {
            return Err(bad(at("power_w"), "must be at least 0".into()));
        }
        devices.push(GpuDevice {
            vendor,
            index,
            uuid,
            name,
            memory_total_mib: total,
            memory_free_mib: free,
            utilization_pct: utilization,
            temperature_c: fields.number("temperature_c")?,
            power_w: power,
            driver_version: fields.string("driver_version")?,
            health: fields.health()?,
        });
    }
    Ok(devices)
}

struct Fields<'a, A, B> {
    object: &'a Map<String, Value>,
    at: &'a A,
    bad: &'a B,
}

impl<A: Fn(&str) -> String, B: Fn(String, String) -> GpuError> Fields<'_, A, B> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.object.get(key).filter(|v| !v.is_null())
    }

    fn wrong(&self, key: &str, wanted: &str, found: &Value) -> GpuError {
        (self.bad)((self.at)(key), format!("must be {wanted}, found {}", kind(found)))
    }

    fn string(&self, key: &str) -> Result<Option<String>, GpuError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
            Some(Value::String(_)) => Err((self.bad)((self.at)(key), "must not be empty".into())),
            Some(other) => Err(self.wrong(key, "a string", other)),
        }
    }

    fn unsigned(&self, key: &str) -> Result<Option<u64>, GpuError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| self.wrong(key, "a whole number at least 0", v)),
        }
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, GpuError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.wrong(key, "true or false", v)),
        }
    }

    fn words(&self, key: &str) -> Result<Vec<String>, GpuError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string).ok_or_else(|| self.wrong(key, "a list of strings", v)))
                .collect(),
            Some(other) => Err(self.wrong(key, "a list of strings", other)),
        }
    }

    /// The health counters, `None` when the device lists none.
    fn health(&self) -> Result<Option<DeviceHealth>, GpuError> {
        let health = DeviceHealth {
            ecc_uncorrected: self.unsigned("ecc_uncorrected")?,
            retired_pages_pending: self.boolean("retired_pages_pending")?,
            remapped_rows_pending: self.boolean("remapped_rows_pending")?,
            throttle_reasons: self.words("throttle_reasons")?,
        };
        Ok(health.reports_anything().then_some(health))
    }

    fn number(&self, key: &str) -> Result<Option<f64>, GpuError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.wrong(key, "a number", v)),
        }
    }
}

fn kind(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("{b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

fn strsim_hint(key: &str) -> String {
    DEVICE_KEYS
        .iter()
        .map(|known| (strsim::jaro_winkler(key, known), known))
        .filter(|(score, _)| *score > 0.85)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, known)| format!(" (did you mean `{known}`?)"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<GpuDevice>, GpuError> {
        parse_inventory(text, Path::new("node.json"))
    }

    fn field_error(text: &str) -> (String, String) {
        match parse(text) {
            Err(GpuError::InventoryField { field, message, .. }) => (field, message),
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn reads_the_documented_example() {
        let devices = parse(
            r#"{"devices": [{"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559, "memory_free_mib": 80000},
                            {"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559, "memory_free_mib": 80000}]}"#,
        )
        .unwrap();
        assert_eq!(devices.len(), 2);
        assert_eq!((devices[0].index, devices[1].index), (0, 1));
        assert_eq!(devices[1].memory_free_mib, 80000);
        assert_eq!(devices[0].uuid, None);
    }

    #[test]
    fn optional_fields_are_read_and_free_defaults_to_total() {
        let devices = parse(
            r#"{"devices": [{"vendor": "AMD", "name": "MI250", "memory_total_mib": 65536, "index": 3,
                "uuid": "GPU-00ff", "utilization_pct": 97, "temperature_c": 61.5, "power_w": 300,
                "driver_version": "6.2"}]}"#,
        )
        .unwrap();
        let d = &devices[0];
        assert_eq!((d.vendor, d.index, d.memory_free_mib), (Vendor::Amd, 3, 65536));
        assert_eq!(d.uuid.as_deref(), Some("GPU-00ff"));
        assert_eq!((d.utilization_pct, d.temperature_c, d.power_w), (Some(97), Some(61.5), Some(300.0)));
        assert_eq!(d.driver_version.as_deref(), Some("6.2"));
    }

    #[test]
    fn indices_default_per_vendor() {
        let devices = parse(
            r#"{"devices": [{"vendor": "nvidia", "name": "A", "memory_total_mib": 1},
                            {"vendor": "amd", "name": "B", "memory_total_mib": 1},
                            {"vendor": "nvidia", "name": "C", "memory_total_mib": 1}]}"#,
        )
        .unwrap();
        assert_eq!(devices.iter().map(|d| d.index).collect::<Vec<_>>(), [0, 0, 1]);
    }

    #[test]
    fn empty_device_list_is_a_node_without_gpus() {
        assert_eq!(parse(r#"{"devices": []}"#).unwrap(), vec![]);
    }

    #[test]
    fn errors_name_the_json_path_of_the_bad_value() {
        let (field, message) = field_error(
            r#"{"devices": [{"vendor": "nvidia", "name": "A", "memory_total_mib": 10},
                            {"vendor": "nvidia", "name": "B", "memory_total_mib": "80G"}]}"#,
        );
        assert_eq!(field, "devices[1].memory_total_mib");
        assert_eq!(message, "must be a whole number at least 0, found the string \"80G\"");
    }

    #[test]
    fn every_kind_of_bad_value_is_reported() {
        let cases = [
            (r#"[]"#, "$"),
            (r#"{}"#, "devices"),
            (r#"{"devices": {}}"#, "devices"),
            (r#"{"devices": [], "extra": 1}"#, "extra"),
            (r#"{"devices": [3]}"#, "devices[0]"),
            (r#"{"devices": [{"name": "A", "memory_total_mib": 1}]}"#, "devices[0].vendor"),
            (r#"{"devices": [{"vendor": "intel", "name": "A", "memory_total_mib": 1}]}"#, "devices[0].vendor"),
            (r#"{"devices": [{"vendor": "amd", "memory_total_mib": 1}]}"#, "devices[0].name"),
            (r#"{"devices": [{"vendor": "amd", "name": " ", "memory_total_mib": 1}]}"#, "devices[0].name"),
            (r#"{"devices": [{"vendor": "amd", "name": "A"}]}"#, "devices[0].memory_total_mib"),
            (r#"{"devices": [{"vendor": "amd", "name": "A", "memory_total_mib": 0}]}"#, "devices[0].memory_total_mib"),
            (r#"{"devices": [{"vendor": "amd", "name": "A", "memory_total_mib": -1}]}"#, "devices[0].memory_total_mib"),
            (
                r#"{"devices": [{"vendor": "amd", "name": "A", "memory_total_mib": 1, "memory_free_mib": 2}]}"#,
                "devices[0].memory_free_mib",
            ),
            (
                r#"{"devices": [{"vendor": "amd", "name": "A", "memory_total_mib": 1, "utilization_pct": 101}]}"#,
                "devices[0].utilization_pct",
            ),
            (
                r#"{"devices": [{"vendor": "amd", "name": "A", "memory_total_mib": 1, "power_w": -3}]}"#,
                "devices[0].power_w",
            ),
            (
                r#"{"devices": [{"vendor": "amd", "name": "A", "memory_total_mib": 1, "temperature_c": "hot"}]}"#,
                "devices[0].temperature_c",
            ),
            (
                r#"{"devices": [{"vendor": "amd", "name": "A", "memory_total_mib": 1, "index": 0},
                                {"vendor": "amd", "name": "B", "memory_total_mib": 1, "index": 0}]}"#,
                "devices[1].index",
            ),
            (
                r#"{"devices": [{"vendor": "amd", "name": "A", "memory_total_mib": 1, "uuid": "GPU-1"},
                                {"vendor": "nvidia", "name": "B", "memory_total_mib": 1, "uuid": "gpu-1"}]}"#,
                "devices[1].uuid",
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(field_error(text).0, expected, "{text}");
        }
    }

    #[test]
    fn misspelt_keys_get_a_suggestion() {
        let (field, message) = field_error(r#"{"devices": [{"vendor": "amd", "name": "A", "memory_total_mb": 1}]}"#);
        assert_eq!(field, "devices[0].memory_total_mb");
        assert!(message.contains("did you mean `memory_total_mib`?"), "{message}");
    }

    #[test]
    fn syntax_errors_give_line_and_column() {
        match parse("{\"devices\": [\n  {\"vendor\": }\n]}") {
            Err(e @ GpuError::InventorySyntax { line: 2, .. }) => {
                let text = e.to_string();
                assert!(text.starts_with("GPU inventory node.json is not valid JSON at line 2"), "{text}");
            }
            other => panic!("expected a syntax error, got {other:?}"),
        }
    }

    #[test]
    fn unreadable_files_name_the_path() {
        let err = read_inventory(Path::new("/nonexistent/node.json")).unwrap_err();
        assert!(err.to_string().starts_with("cannot read GPU inventory /nonexistent/node.json"), "{err}");
    }

    #[test]
    fn inventory_probe_reads_the_file_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.json");
        std::fs::write(&path, r#"{"devices": []}"#).unwrap();
        let probe = InventoryProbe::new(&path);
        assert!(probe.probe().unwrap().devices.is_empty());
        std::fs::write(&path, r#"{"devices": [{"vendor": "nvidia", "name": "L4", "memory_total_mib": 23034}]}"#)
            .unwrap();
        assert_eq!(probe.probe().unwrap().devices[0].name, "L4");
    }
}
