//! The event types an endpoint receives, as the API takes them, as a key stores them for the
//! completer, and as their column holds them.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sqlx::Postgres;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};

use crate::DomainError;
use crate::events::EventType;

/// The event types an endpoint receives: every type, or the ones listed. On the wire and in its
/// column (`text[]`) it is the list of names, `["*"]` for every type; a stored list that does not
/// parse is a decode error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnabledEvents {
    /// Every type (`["*"]`).
    All,
    /// These types, each once, in the order given.
    Only(Vec<EventType>),
}

impl EnabledEvents {
    /// Parses `enabled_events`: `["*"]` or a non-empty list of known types.
    pub fn parse(names: &[String]) -> Result<Self, DomainError> {
        let invalid = |message: String| DomainError::Invalid { param: "enabled_events", message };
        if names.is_empty() {
            return Err(invalid("`enabled_events` must name at least one type, or `*`.".into()));
        }
        if names.iter().any(|n| n == "*") {
            return if names.len() == 1 {
                Ok(Self::All)
            } else {
                Err(invalid("`*` stands alone in `enabled_events`.".into()))
            };
        }
        let mut types = Vec::with_capacity(names.len());
        for name in names {
            let t = EventType::parse(name)
                .ok_or_else(|| invalid(format!("`{name}` is not an event type.")))?;
            if !types.contains(&t) {
                types.push(t);
            }
        }
        Ok(Self::Only(types))
    }

    /// The names, as sent and stored.
    pub fn names(&self) -> Vec<String> {
        match self {
            Self::All => vec!["*".to_owned()],
            Self::Only(types) => types.iter().map(EventType::to_string).collect(),
        }
    }
}

impl Serialize for EnabledEvents {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.names().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for EnabledEvents {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(deserializer)?;
        Self::parse(&names).map_err(serde::de::Error::custom)
    }
}

impl sqlx::Type<Postgres> for EnabledEvents {
    fn type_info() -> PgTypeInfo {
        <Vec<String> as sqlx::Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <Vec<String> as sqlx::Type<Postgres>>::compatible(ty)
    }
}

impl sqlx::Encode<'_, Postgres> for EnabledEvents {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <Vec<String> as sqlx::Encode<Postgres>>::encode(self.names(), buf)
    }
}

impl sqlx::Decode<'_, Postgres> for EnabledEvents {
    fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
        let names = <Vec<String> as sqlx::Decode<Postgres>>::decode(value)?;
        Ok(Self::parse(&names)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enabled_events_are_a_star_alone_or_known_types() {
        assert_eq!(EnabledEvents::parse(&["*".into()]).ok(), Some(EnabledEvents::All));
        assert!(EnabledEvents::parse(&[]).is_err());
        assert!(EnabledEvents::parse(&["*".into(), "payment.failed".into()]).is_err());
        assert!(EnabledEvents::parse(&["payment.nope".into()]).is_err());
        let parsed = EnabledEvents::parse(&["payment.failed".into(), "payment.failed".into()]);
        assert_eq!(parsed.ok(), Some(EnabledEvents::Only(vec![EventType::PaymentFailed])));
    }

    #[test]
    fn enabled_events_are_their_names_in_json() {
        let only = EnabledEvents::Only(vec![EventType::RefundFailed, EventType::PaymentFailed]);
        for (events, json) in
            [(EnabledEvents::All, r#"["*"]"#), (only, r#"["refund.failed","payment.failed"]"#)]
        {
            assert_eq!(serde_json::to_string(&events).ok().as_deref(), Some(json));
            assert_eq!(serde_json::from_str::<EnabledEvents>(json).ok(), Some(events));
        }
        assert!(serde_json::from_str::<EnabledEvents>(r#"["payment.nope"]"#).is_err());
    }
}
