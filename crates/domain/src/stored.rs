//! How the domain's enums are stored: as `text`, under the names serde gives them on the wire.
//!
//! Each stored enum derives serde's `Serialize`/`Deserialize` and sqlx's `Encode`/`Decode` with
//! the same renaming, so a value has one name in the public JSON and in its column, and a test
//! per enum holds the two together. A name this code does not know, read from a column, is a
//! decode error, never a default. [`text_enum!`] gives each enum its column type and a
//! `Display` by that name.
//!
//! (sqlx's `derive(Type)` with `type_name = "text"` would name the type instead of pointing at
//! Postgres' builtin one, so sqlx would look its oid up, once per connection, before the first
//! statement that binds such a value: a round trip more on every fresh connection.)

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Gives enums that derive sqlx's `Encode` and `Decode` the column type `text` (Postgres'
/// builtin type, so binding one costs no lookup), and a `Display` by their stored name.
macro_rules! text_enum {
    ($($ty:ty),+ $(,)?) => {
        $(
            impl sqlx::Type<sqlx::Postgres> for $ty {
                fn type_info() -> sqlx::postgres::PgTypeInfo {
                    <str as sqlx::Type<sqlx::Postgres>>::type_info()
                }

                fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                    <str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
                }
            }

            impl std::fmt::Display for $ty {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str(&$crate::stored::name_of(self))
                }
            }
        )+
    };
}
pub(crate) use text_enum;

/// The name serde gives `value`, a unit variant: its public name, and its stored one.
pub fn name_of<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        // Only unit variants are stored as text; anything else has no name.
        _ => String::new(),
    }
}

/// The value named `name`; `None` for a name no variant has.
pub fn from_name<T: DeserializeOwned>(name: &str) -> Option<T> {
    let name = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(name);
    T::deserialize(name).ok()
}
