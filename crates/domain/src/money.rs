//! Amounts and currencies. Money is an integer count of the currency's minor unit; never a float.

use serde::{Deserialize, Serialize};

/// The currencies this API accepts, lower-case ISO 4217.
pub const SUPPORTED_CURRENCIES: &[&str] =
    &["aud", "cad", "chf", "dkk", "eur", "gbp", "hkd", "jpy", "nok", "nzd", "sek", "sgd", "usd"];

/// The largest amount a payment may have, in minor units.
pub const AMOUNT_MAX: i64 = 99_999_999;

/// A positive amount in minor units, at most [`AMOUNT_MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
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

/// A supported currency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Currency(String);

impl Currency {
    /// The currency if it is supported (codes are lower case, as Stripe writes them).
    pub fn new(code: &str) -> Option<Self> {
        SUPPORTED_CURRENCIES.contains(&code).then(|| Self(code.to_owned()))
    }

    /// The code.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
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
}
