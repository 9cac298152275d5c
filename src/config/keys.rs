//! The key names the schema accepts, read from the serde derives themselves
//! (the field lists serde hands to `deserialize_struct`), so the allowed-key
//! lists in error messages and the example-config test cannot drift from
//! `schema.rs`.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Visitor};

use super::schema::*;

/// The section names of a config file, in schema order.
pub fn sections() -> &'static [&'static str] {
    fields_of::<Config>()
}

/// The keys a section accepts, in schema order (`None` for an unknown section).
pub fn section_keys(section: &str) -> Option<&'static [&'static str]> {
    Some(match section {
        "run" => fields_of::<RunSection>(),
        "model" => fields_of::<ModelSection>(),
        "data" => fields_of::<DataSection>(),
        "train" => fields_of::<TrainSection>(),
        "optimizer" => fields_of::<OptimizerSection>(),
        "precision" => fields_of::<PrecisionSection>(),
        "checkpoint" => fields_of::<CheckpointSection>(),
        "signals" => fields_of::<SignalsSection>(),
        "publish" => fields_of::<PublishSection>(),
        "gpu" => fields_of::<GpuSection>(),
        "watchdog" => fields_of::<WatchdogSection>(),
        "lock" => fields_of::<LockSection>(),
        "distributed" => fields_of::<DistributedSection>(),
        "recovery" => fields_of::<RecoverySection>(),
        "health" => fields_of::<HealthSection>(),
        "telemetry" => fields_of::<TelemetrySection>(),
        _ => return None,
    })
}

/// Every `section.key` of the schema, in schema order.
pub fn all_keys() -> Vec<String> {
    sections()
        .iter()
        .flat_map(|section| section_keys(section).unwrap_or_default().iter().map(move |key| format!("{section}.{key}")))
        .collect()
}

/// The field names (after renames) that `T`'s derived `Deserialize` expects.
fn fields_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut fields = None;
    // The capture always "fails" once it has seen the field list.
    let _ = T::deserialize(FieldCapture(&mut fields));
    fields.unwrap_or_default()
}

/// A deserializer that records the field list of the struct asked of it and
/// stops there.
struct FieldCapture<'a>(&'a mut Option<&'static [&'static str]>);

#[derive(Debug)]
struct Captured;

impl fmt::Display for Captured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field list captured")
    }
}

impl std::error::Error for Captured {}

impl de::Error for Captured {
    fn custom<T: fmt::Display>(_msg: T) -> Self {
        Captured
    }
}

impl<'de> de::Deserializer<'de> for FieldCapture<'_> {
    type Error = Captured;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Captured> {
        Err(Captured)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Captured> {
        *self.0 = Some(fields);
        Err(Captured)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_section_has_a_key_list() {
        assert_eq!(sections().len(), 16);
        for section in sections() {
            let keys = section_keys(section).unwrap_or_else(|| panic!("no keys for [{section}]"));
            assert!(!keys.is_empty(), "[{section}] has no keys");
        }
    }

    #[test]
    fn key_lists_use_serde_renames() {
        let keys = section_keys("checkpoint").unwrap();
        assert!(keys.contains(&"async"));
        assert!(!keys.contains(&"async_save"));
        assert!(all_keys().contains(&"run.max_steps".to_string()));
    }
}
