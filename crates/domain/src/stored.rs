//! How the domain's enums are stored: as `text`, under the names serde gives them on the wire.
//!
//! Each stored enum is declared with [`text_enum!`], which derives serde's `Serialize` and
//! `Deserialize` and sqlx's `Encode` and `Decode` with the same renaming, so a value has one name
//! in the public JSON and in its column (a test holds the two together for every value). A name
//! this code does not know, read from a column, is a decode error, never a default.
//!
//! (sqlx's `derive(Type)` with `type_name = "text"` would name the type instead of pointing at
//! Postgres' builtin one, so sqlx would look its oid up, once per connection, before the first
//! statement that binds such a value: a round trip more on every fresh connection.)

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Declares an enum stored as text: its derives (serde's and sqlx's, with one renaming, so the
/// public name is the stored one), `ALL` (every value, in the order declared), the column type
/// `text` (Postgres' builtin type, so binding one costs no lookup) and a `Display` by its name.
/// Names are snake case; `Variant = "name"` names a variant otherwise. Further derives (such as
/// `utoipa::ToSchema`) go with the enum's other attributes.
macro_rules! text_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident $(= $text:literal)? ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(
            Debug,
            Clone,
            Copy,
            PartialEq,
            Eq,
            Hash,
            serde::Serialize,
            serde::Deserialize,
            sqlx::Encode,
            sqlx::Decode,
        )]
        #[serde(rename_all = "snake_case")]
        #[sqlx(rename_all = "snake_case")]
        pub enum $name {
            $(
                $(#[$variant_meta])*
                $( #[serde(rename = $text)] #[sqlx(rename = $text)] )?
                $variant,
            )+
        }

        impl $name {
            /// Every value, in the order declared.
            pub const ALL: [Self; [$(stringify!($variant)),+].len()] = [$(Self::$variant),+];
        }

        impl sqlx::Type<sqlx::Postgres> for $name {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <str as sqlx::Type<sqlx::Postgres>>::type_info()
            }

            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&$crate::stored::name_of(self))
            }
        }
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
