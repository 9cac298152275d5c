//! The key-order convention of the JSON rekindle writes
//! (docs/run-directory.md): the keys of each object in alphabetical order.
//! Writers get it by serialising through a [`serde_json::Value`], whose map
//! is sorted; [`first_unsorted_key`] checks a written text, which a `Value`
//! cannot (parsing one sorts it), so tests can hold every file to it.
//! Readers never depend on the order.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The first key, as `path.to.key`, that does not come after the key
/// before it in its object, in one JSON document or in every line of a
/// JSON-lines text; `None` when every object's keys are in alphabetical
/// order. Text that is not JSON is reported as such.
pub fn first_unsorted_key(text: &str) -> Option<String> {
    let whole = serde_json::from_str::<IgnoredAny>(text).is_ok();
    let documents: Vec<&str> = match whole {
        true => vec![text],
        false => text.lines().filter(|l| !l.trim().is_empty()).collect(),
    };
    documents.into_iter().enumerate().find_map(|(n, doc)| {
        let error = Ordered { path: String::new() }.deserialize(&mut serde_json::Deserializer::from_str(doc)).err()?;
        Some(if whole { error.to_string() } else { format!("line {}: {error}", n + 1) })
    })
}

/// Walks one value, failing at the first key out of order.
struct Ordered {
    path: String,
}

impl<'de> DeserializeSeed<'de> for Ordered {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Ordered {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while seq.next_element_seed(Ordered { path: format!("{}[{i}]", self.path) })?.is_some() {
            i += 1;
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut previous: Option<String> = None;
        while let Some(key) = map.next_key::<String>()? {
            let path = if self.path.is_empty() { key.clone() } else { format!("{}.{key}", self.path) };
            if let Some(before) = previous.as_deref().filter(|before| *before >= key.as_str()) {
                return Err(de::Error::custom(format!("`{path}` comes after `{before}`")));
            }
            map.next_value_seed(Ordered { path })?;
            previous = Some(key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_objects_at_every_depth_pass() {
        assert_eq!(first_unsorted_key(r#"{"a": 1, "b": {"x": [{"m": null, "n": true}], "y": "s"}, "c": 1.5}"#), None);
        assert_eq!(first_unsorted_key("{\"a\":1,\"b\":2}\n{\"a\":1}\n"), None);
        assert_eq!(first_unsorted_key("[]"), None);
    }

    #[test]
    fn names_the_first_key_out_of_order_with_its_path() {
        let found = first_unsorted_key(r#"{"a": {"files": [{"name": "m", "bytes": 1}]}}"#).unwrap();
        assert!(found.contains("`a.files[0].bytes` comes after `name`"), "{found}");
        let found = first_unsorted_key("{\"a\":1}\n{\"z\":1,\"b\":2}\n").unwrap();
        assert!(found.starts_with("line 2: ") && found.contains("`b` comes after `z`"), "{found}");
    }

    #[test]
    fn a_value_serialises_sorted_whatever_the_field_order() {
        #[derive(serde::Serialize)]
        struct Unsorted {
            zeta: u8,
            alpha: u8,
        }
        let direct = serde_json::to_string(&Unsorted { zeta: 1, alpha: 2 }).unwrap();
        assert!(first_unsorted_key(&direct).is_some());
        let value = serde_json::to_value(Unsorted { zeta: 1, alpha: 2 }).unwrap();
        assert_eq!(first_unsorted_key(&serde_json::to_string_pretty(&value).unwrap()), None);
    }
}
