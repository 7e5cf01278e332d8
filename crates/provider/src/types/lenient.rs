//! Reading the processor's answers leniently: a reference that may come as an id or as the
//! expanded object, and a map that may come as `null`. Stripe's answers change shape with the
//! API version and with `expand[]`, and Stripe-compatible servers leave out what they do not
//! implement; the code reads only what it uses, so only that may refuse an answer.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

/// A reference to another object: its id (`"ch_…"`), or the object itself (`{"id": "ch_…", …}`),
/// as Stripe sends it when the request expanded it (and inside errors, where the PaymentIntent
/// comes whole).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum IdOrObject {
    /// The id alone.
    Id(String),
    /// The expanded object; only its id is read.
    Object {
        /// The object's id.
        id: String,
    },
}

impl IdOrObject {
    /// The id, however it came.
    pub(crate) fn into_id(self) -> String {
        match self {
            Self::Id(id) | Self::Object { id } => id,
        }
    }
}

/// An optional reference read as its id: `null`, absent (with `#[serde(default)]`), an id, or an
/// expanded object.
pub(crate) fn id_or_expanded<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    Ok(Option::<IdOrObject>::deserialize(deserializer)?.map(IdOrObject::into_id))
}

/// A string map that may come as `null` (read as empty) or absent (with `#[serde(default)]`).
pub(crate) fn map_or_null<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    Ok(Option::<BTreeMap<String, String>>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Deserialize)]
    struct Holder {
        #[serde(default, deserialize_with = "super::id_or_expanded")]
        reference: Option<String>,
        #[serde(default, deserialize_with = "super::map_or_null")]
        metadata: std::collections::BTreeMap<String, String>,
    }

    fn read(value: serde_json::Value) -> Holder {
        serde_json::from_value(value).unwrap_or_else(|err| panic!("{err}"))
    }

    #[test]
    fn a_reference_reads_as_its_id_however_it_comes() {
        assert_eq!(read(json!({"reference": "ch_1"})).reference.as_deref(), Some("ch_1"));
        let expanded = json!({"reference": {"id": "ch_2", "object": "charge", "amount": 5}});
        assert_eq!(read(expanded).reference.as_deref(), Some("ch_2"));
        assert_eq!(read(json!({"reference": null})).reference, None);
        assert_eq!(read(json!({})).reference, None);
        assert!(serde_json::from_value::<Holder>(json!({"reference": 7})).is_err());
    }

    #[test]
    fn a_null_or_absent_map_reads_as_empty() {
        assert!(read(json!({"metadata": null})).metadata.is_empty());
        assert!(read(json!({})).metadata.is_empty());
        assert_eq!(read(json!({"metadata": {"a": "b"}})).metadata["a"], "b");
    }
}
