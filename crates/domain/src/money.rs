//! Amounts and currencies. Money is an integer count of the currency's minor unit; never a float.
//!
//! Both are parsed once, at the edge, and travel parsed: in the domain's structs, in the input
//! stored for the completer, and to and from their columns. Every way in checks: `new`, serde
//! (stored JSON) and sqlx (a column), where a value out of range is a decode error.

use serde::{Deserialize, Serialize};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use sqlx::{Decode, Encode, Postgres, Type};

/// The currencies this API accepts, lower-case ISO 4217.
pub const SUPPORTED_CURRENCIES: &[&str] =
    &["aud", "cad", "chf", "dkk", "eur", "gbp", "hkd", "jpy", "nok", "nzd", "sek", "sgd", "usd"];

/// The largest amount a payment may have, in minor units.
pub const AMOUNT_MAX: i64 = 99_999_999;

/// A positive amount in minor units, at most [`AMOUNT_MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "i64", try_from = "i64")]
pub struct Amount(i64);

impl Amount {
    /// The amount if it is between 1 and [`AMOUNT_MAX`].
    pub fn new(minor_units: i64) -> Option<Self> {
        (1..=AMOUNT_MAX).contains(&minor_units).then_some(Self(minor_units))
    }

    /// Minor units.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl std::fmt::Display for Amount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl From<Amount> for i64 {
    fn from(amount: Amount) -> i64 {
        amount.0
    }
}

impl TryFrom<i64> for Amount {
    type Error = String;

    fn try_from(minor_units: i64) -> Result<Self, String> {
        Self::new(minor_units)
            .ok_or_else(|| format!("{minor_units} is not an amount from 1 to {AMOUNT_MAX}"))
    }
}

impl Type<Postgres> for Amount {
    fn type_info() -> PgTypeInfo {
        <i64 as Type<Postgres>>::type_info()
    }
}

impl Encode<'_, Postgres> for Amount {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <i64 as Encode<Postgres>>::encode_by_ref(&self.0, buf)
    }
}

impl Decode<'_, Postgres> for Amount {
    fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
        Ok(Self::try_from(<i64 as Decode<Postgres>>::decode(value)?)?)
    }
}

/// A supported currency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(into = "&'static str")]
pub struct Currency(&'static str);

impl Currency {
    /// The currency if it is supported (codes are lower case, as Stripe writes them).
    pub fn new(code: &str) -> Option<Self> {
        SUPPORTED_CURRENCIES.iter().find(|&&supported| supported == code).map(|&code| Self(code))
    }

    /// The code.
    pub fn as_str(self) -> &'static str {
        self.0
    }
}

impl std::fmt::Display for Currency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl From<Currency> for &'static str {
    fn from(currency: Currency) -> &'static str {
        currency.0
    }
}

impl TryFrom<String> for Currency {
    type Error = String;

    fn try_from(code: String) -> Result<Self, String> {
        Self::new(&code).ok_or_else(|| format!("`{code}` is not a supported currency"))
    }
}

// By hand: a derive would tie the deserializer's lifetime to the `'static` of the code.
impl<'de> Deserialize<'de> for Currency {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::try_from(String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

impl PartialEq<str> for Currency {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<String> for Currency {
    fn eq(&self, other: &String) -> bool {
        self.0 == other
    }
}

impl Type<Postgres> for Currency {
    fn type_info() -> PgTypeInfo {
        <str as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <str as Type<Postgres>>::compatible(ty)
    }
}

impl Encode<'_, Postgres> for Currency {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <&str as Encode<Postgres>>::encode(self.0, buf)
    }
}

impl Decode<'_, Postgres> for Currency {
    fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
        let code = <&str as Decode<Postgres>>::decode(value)?;
        Ok(Self::new(code).ok_or_else(|| format!("`{code}` is not a supported currency"))?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn amounts_are_bounded() {
        assert!(Amount::new(0).is_none());
        assert!(Amount::new(-5).is_none());
        assert_eq!(Amount::new(1).map(Amount::get), Some(1));
        assert_eq!(Amount::new(AMOUNT_MAX).map(Amount::get), Some(AMOUNT_MAX));
        assert!(Amount::new(AMOUNT_MAX + 1).is_none());
    }

    #[test]
    fn currencies_are_lower_case_and_listed() {
        for code in ["usd", "eur", "gbp", "jpy", "chf", "cad", "aud"] {
            assert!(Currency::new(code).is_some(), "{code}");
        }
        assert!(Currency::new("USD").is_none());
        assert!(Currency::new("xyz").is_none());
    }

    #[test]
    fn json_holds_them_as_a_number_and_a_code_and_only_valid_ones() {
        let amount = Amount::new(500).unwrap();
        let currency = Currency::new("eur").unwrap();
        assert_eq!(serde_json::to_string(&(amount, currency)).unwrap(), r#"[500,"eur"]"#);
        assert_eq!(
            serde_json::from_str::<(Amount, Currency)>(r#"[500,"eur"]"#).unwrap(),
            (amount, currency)
        );
        for bad in ["0", "-1", "100000000", "1.5"] {
            assert!(serde_json::from_str::<Amount>(bad).is_err(), "{bad}");
        }
        for bad in [r#""EUR""#, r#""xyz""#, "1"] {
            assert!(serde_json::from_str::<Currency>(bad).is_err(), "{bad}");
        }
    }
}
