//! The legend beside a key's state diagram: what each mark means, and each state linked to the
//! section of the guide (`docs/`) that defines it; for a new payment's key, the payment states
//! that outlive the key (`requires_action`, then its outcome). The links start at
//! `inspector.docs_base_url`; without one, the guide's files are named by their path in the
//! repository.

use maud::{Markup, html};
use payments_domain::operations::CREATE_PAYMENT;

use super::diagram::{Now, SETTLED, shape};

/// The section of the key table that writes each state as a condition over the columns.
const STATES: (&str, &str) =
    ("docs/key-table.md", "the-keys-states-as-conditions-over-the-columns");
/// The guide's state machine of a key.
const MACHINE: (&str, &str) = ("docs/operations.md", "the-keys-state-machine");
/// The guide's states of a payment that waits on its customer, and their crash table.
const WAITING: (&str, &str) = ("docs/operations.md", "a-payment-that-waits-on-its-customer");

/// The legend for a key of `operation` that stands at `now`.
pub fn legend(docs_base_url: &str, operation: &str, now: Now) -> Markup {
    let operation_section = shape(operation).map_or(MACHINE.1, |s| s.guide_anchor);
    let states = [
        (Now::LeaseHeld, "a process holds the lease: a retry gets 409"),
        (Now::LeaseExpired, "the holder died or stalled: a retry or the completer takes over"),
        (Now::LeaseFree, "released at its recovery point: a retry resumes it at once"),
        (Now::Finished, "the answer is stored and replayed"),
        (Now::Flagged, "no automatic retry may finish it"),
    ];
    let mut sections = vec![("docs/operations.md", operation_section), MACHINE, STATES];
    if operation == CREATE_PAYMENT {
        sections.push(WAITING);
    }
    html! {
        section #legend aria-label="legend" {
            h3 { "Legend" }
            ul {
                li { "▶ now, framed twice: where the key stands. ✓ passed, thick arrows: its path. \
                      Dashed: not reached." }
                li {
                    "Recovery points of " code { (operation) } ": "
                    (link(docs_base_url, ("docs/operations.md", operation_section), "its phases"))
                    "; every operation: "
                    (link(docs_base_url, MACHINE, "the key's state machine")) "."
                }
                li {
                    "A key's states, each a condition over "
                    (link(docs_base_url, STATES, "the key table's columns")) ":"
                    ul {
                        li {
                            (link(docs_base_url, STATES, "new"))
                            ": no row yet; the first phase stores the key with its own writes"
                        }
                        @for (state, meaning) in states {
                            li {
                                @if state == now {
                                    strong {
                                        (link(docs_base_url, STATES, &format!("▶ {}", state.words())))
                                    }
                                } @else {
                                    (link(docs_base_url, STATES, state.words()))
                                }
                                ": " (meaning)
                            }
                        }
                    }
                }
                @if operation == CREATE_PAYMENT {
                    li {
                        "A new payment may "
                        (link(docs_base_url, WAITING, "wait on its customer"))
                        ": the key finishes with a payment that " code { "requires_action" }
                        " (3-D Secure), and a retry replays that answer. Its outcome ("
                        code { "requires_capture" } ", " code { "succeeded" } ", "
                        code { "failed" } ", or " code { "canceled" } " once the authentication \
                        expires) is recorded later, by the processor's webhook or the worker's \
                        authentication job, as " code { (SETTLED) } " on this timeline."
                    }
                }
            }
            (paths(docs_base_url, &sections))
        }
    }
}

/// A link to `anchor` of `file` in the guide; without a base, the words alone, the file being
/// named once by its repository path (`path`).
fn link(docs_base_url: &str, (file, anchor): (&str, &str), words: &str) -> Markup {
    let base = docs_base_url.trim_end_matches('/');
    html! {
        @if base.is_empty() {
            (words)
        } @else {
            a href={ (base) "/" (file) "#" (anchor) } { (words) }
        }
    }
}

/// Where the guide's sections are, when no base URL links them.
fn paths(docs_base_url: &str, sections: &[(&str, &str)]) -> Markup {
    html! {
        @if docs_base_url.is_empty() {
            p.note {
                "In the repository: "
                @for (i, (file, anchor)) in sections.iter().enumerate() {
                    @if i > 0 { ", " }
                    code { (file) "#" (anchor) }
                }
                " (set " code { "inspector.docs_base_url" } " to link them)."
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_a_base_each_state_links_to_its_section_of_the_guide() {
        let html = legend("https://example.com/repo/blob/main/", "payments.create", Now::LeaseFree)
            .into_string();
        let base = "https://example.com/repo/blob/main/docs";
        for target in [
            "/key-table.md#the-keys-states-as-conditions-over-the-columns",
            "/operations.md#create-a-payment",
            "/operations.md#the-keys-state-machine",
        ] {
            assert!(html.contains(&format!("href=\"{base}{target}\"")), "{target}: {html}");
        }
        let now = format!(
            "<strong><a href=\"{base}/key-table.md#the-keys-states-as-conditions-over-the-columns\">▶ lease free (released)</a></strong>"
        );
        assert!(html.contains(&now), "{html}");
        assert_eq!(html.matches("href=").count(), 10, "three sections and each state: {html}");
        let waiting = format!("href=\"{base}/operations.md#a-payment-that-waits-on-its-customer\"");
        assert!(html.contains(&waiting), "a new payment's key links its payment's states: {html}");
        assert!(html.contains("<code>requires_action</code>"), "{html}");
        assert!(html.contains("<code>payment.settled</code>"), "{html}");
        assert!(!html.contains("In the repository"), "{html}");
        assert_eq!(html.matches("<strong>").count(), 1, "one state is now: {html}");
    }

    #[test]
    fn without_a_base_the_guide_is_named_by_its_repository_path() {
        let html = legend("", "refunds.create", Now::Finished).into_string();
        assert!(!html.contains("href"), "{html}");
        assert!(html.contains("<code>docs/operations.md#refund-a-payment</code>"), "{html}");
        assert!(html.contains("<strong>▶ finished (answer stored)</strong>"), "{html}");
        assert!(!html.contains("requires_action"), "a refund's key has no such payment: {html}");
        let create = legend("", "payments.create", Now::Finished).into_string();
        let path = "<code>docs/operations.md#a-payment-that-waits-on-its-customer</code>";
        assert!(create.contains(path), "{create}");
    }

    #[test]
    fn the_guides_anchors_exist() {
        // GitHub's anchors: the heading in lower case, punctuation dropped, spaces as hyphens.
        let anchor = |heading: &str| {
            heading
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect::<String>()
        };
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../");
        let anchors = |file: &str| -> Vec<String> {
            let text = std::fs::read_to_string(format!("{root}{file}")).expect("the guide's file");
            text.lines()
                .filter_map(|l| l.strip_prefix('#'))
                .map(|h| anchor(h.trim_start_matches('#').trim()))
                .collect()
        };
        let mut wanted = vec![STATES, MACHINE, WAITING];
        wanted.extend(
            super::super::diagram::SHAPES.iter().map(|s| ("docs/operations.md", s.guide_anchor)),
        );
        for (file, target) in wanted {
            assert!(anchors(file).iter().any(|a| a == target), "no #{target} in {file}");
        }
    }
}
