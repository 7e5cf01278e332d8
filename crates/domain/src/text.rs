//! The one check of the characters of every free-text field: a payment's `description` and
//! `metadata` (on creation and in a merge patch), a refund's `metadata`, a `receipt_email`, a
//! webhook endpoint's `url`, an account's name. It refuses control characters and Unicode format
//! characters, and a refusal names the field and the character.
//!
//! - **Control characters** (general category Cc: C0, DEL, C1). NUL matters most: Postgres refuses
//!   it in `text` and `jsonb`, so a NUL past validation would turn bad input into a 500. The
//!   others have no business in a label, and would reach logs, receipts and dashboards verbatim.
//!   Tab, line feed and carriage return are text where a field may span lines
//!   ([`Lines::Allowed`]).
//! - **Format characters** (general category Cf): invisible characters that change how the text
//!   around them is shown. Bidirectional embeddings, overrides and isolates (U+202A–U+202E,
//!   U+2066–U+2069, U+200E, U+200F, U+061C) make a text read otherwise than the order of its
//!   characters (the "Trojan Source" trick, and a receipt whose amount or link reads backwards);
//!   zero-width spaces and joiners (U+200B–U+200D, U+2060), the byte-order mark U+FEFF and the soft
//!   hyphen U+00AD hide inside a word to make two texts look alike; tag characters (U+E0000 block)
//!   carry text no one sees. Every text a tenant writes may end up in front of someone else (a
//!   receipt's reader, an operator), so none of them is accepted anywhere.
//!
//! The category is read from [`unicode_properties`] (the unicode-rs project's tables, Unicode
//! [`UNICODE_VERSION`]), the crate sqlx's Postgres driver already builds for SASLprep: no table
//! of our own to keep up to date. The price of refusing the whole category: an emoji sequence
//! joined by U+200D (a family, a profession with a skin tone), a subdivision flag (tags) and
//! Persian or Indic text that uses U+200C to keep letters apart are refused too.

pub use unicode_properties::UNICODE_VERSION;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

use crate::DomainError;

/// Whether a text field may hold line breaks and tabs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    /// Tab, line feed and carriage return are text; other control characters are not.
    Allowed,
    /// One line: no control character at all.
    Refused,
}

/// The first character of `text` that a field whose lines are `lines` refuses: a control
/// character (but tab and line breaks where lines are allowed) or a format character.
pub fn refused_char(text: &str, lines: Lines) -> Option<char> {
    text.chars().find(|&c| match c.general_category() {
        GeneralCategory::Control => !(lines == Lines::Allowed && matches!(c, '\t' | '\n' | '\r')),
        GeneralCategory::Format => true,
        _ => false,
    })
}

/// Checks the characters of field `param`: `400 invalid_request` naming it and the first
/// character refused.
pub fn check(param: &'static str, text: &str, lines: Lines) -> Result<(), DomainError> {
    match refused_char(text, lines) {
        None => Ok(()),
        Some(c) => Err(refused(param, c, lines)),
    }
}

/// The refusal of character `c` in field `param`.
pub fn refused(param: &'static str, c: char, lines: Lines) -> DomainError {
    let allowed = match lines {
        Lines::Allowed => "; tab and line breaks are allowed",
        Lines::Refused => "",
    };
    DomainError::Invalid {
        param,
        message: format!(
            "`{param}` must not contain U+{:04X}: control characters (NUL among them) and \
             invisible Unicode format characters (bidirectional overrides and isolates, \
             zero-width characters, the byte-order mark, the soft hyphen) are refused{allowed}.",
            u32::from(c)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_refused_but_line_breaks_where_lines_are_allowed() {
        for c in ['\u{0}', '\u{7}', '\u{1b}', '\u{7f}', '\u{85}', '\u{9f}'] {
            let text = format!("a{c}b");
            assert_eq!(refused_char(&text, Lines::Allowed), Some(c), "{c:?}");
            assert_eq!(refused_char(&text, Lines::Refused), Some(c), "{c:?}");
        }
        for c in ['\t', '\n', '\r'] {
            let text = format!("a{c}b");
            assert_eq!(refused_char(&text, Lines::Allowed), None, "{c:?}");
            assert_eq!(refused_char(&text, Lines::Refused), Some(c), "{c:?}");
        }
    }

    #[test]
    fn format_characters_are_refused_in_every_field() {
        let format = [
            '\u{ad}',    // soft hyphen
            '\u{61c}',   // Arabic letter mark
            '\u{180e}',  // Mongolian vowel separator
            '\u{200b}',  // zero-width space
            '\u{200c}',  // zero-width non-joiner
            '\u{200d}',  // zero-width joiner
            '\u{200e}',  // left-to-right mark
            '\u{200f}',  // right-to-left mark
            '\u{202a}',  // left-to-right embedding
            '\u{202b}',  // right-to-left embedding
            '\u{202c}',  // pop directional formatting
            '\u{202d}',  // left-to-right override
            '\u{202e}',  // right-to-left override
            '\u{2060}',  // word joiner
            '\u{2066}',  // left-to-right isolate
            '\u{2067}',  // right-to-left isolate
            '\u{2068}',  // first strong isolate
            '\u{2069}',  // pop directional isolate
            '\u{feff}',  // byte-order mark
            '\u{fff9}',  // interlinear annotation anchor
            '\u{e0001}', // language tag
            '\u{e0041}', // tag Latin capital letter A
        ];
        for c in format {
            let text = format!("pay {c}here");
            assert_eq!(refused_char(&text, Lines::Allowed), Some(c), "U+{:04X}", u32::from(c));
            assert_eq!(refused_char(&text, Lines::Refused), Some(c), "U+{:04X}", u32::from(c));
        }
    }

    #[test]
    fn text_in_any_script_passes() {
        for text in [
            "Order 42, two mugs",
            "Café crème — 3 × 2,50 €",
            "注文番号 42",
            "طلب رقم ٤٢",
            "הזמנה 42",
            "Заказ № 42 🙂",
            "non\u{a0}breaking and\u{2009}thin spaces",
        ] {
            assert_eq!(refused_char(text, Lines::Refused), None, "{text}");
        }
    }

    #[test]
    fn a_refusal_names_the_field_and_the_character() {
        let Err(DomainError::Invalid { param, message }) =
            check("description", "total\u{202e}01.0", Lines::Allowed)
        else {
            panic!("refused")
        };
        assert_eq!(param, "description");
        assert!(message.contains("U+202E"), "{message}");
        assert!(check("description", "two\nlines", Lines::Allowed).is_ok());
    }
}
