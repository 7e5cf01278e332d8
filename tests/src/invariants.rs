//! The invariant checker of the proof: what must hold after any mix of crashes, faults and
//! retries, read from the database, the processor's charges and the clients' ledger.
//!
//! Each invariant is one function that returns its violations, one line each. Every read fails
//! loudly: a checker that silently read nothing would pass for the wrong reason.
#![allow(clippy::expect_used)] // test support: a read that fails is a failed test, with its reason

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};
use sqlx::PgPool;

use crate::system::{Answers, System, is_final};

/// A payment row as the checker needs it.
#[derive(Debug, sqlx::FromRow)]
struct PaymentRow {
    id: String,
    account_id: String,
    status: String,
    amount_captured: i64,
    amount_refunded: i64,
    processor_charge_id: Option<String>,
    receipt_email: Option<String>,
}

/// The state every invariant looks at, read once.
#[derive(Debug)]
struct Observed {
    /// Every charge the processor holds.
    charges: Vec<Value>,
    /// Every payment row.
    payments: Vec<PaymentRow>,
    /// The answers clients received.
    answers: Answers,
}

impl Observed {
    fn payment(&self, id: &str) -> Option<&PaymentRow> {
        self.payments.iter().find(|p| p.id == id)
    }

    /// The processor's successful charges, by the payment id in their metadata.
    fn paid(&self) -> HashMap<&str, Vec<&Value>> {
        let mut paid: HashMap<&str, Vec<&Value>> = HashMap::new();
        for charge in self.charges.iter().filter(|c| c["paid"] == json!(true)) {
            if let Some(payment_id) = charge["metadata"]["payment_id"].as_str() {
                paid.entry(payment_id).or_default().push(charge);
            }
        }
        paid
    }
}

/// What the checker looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvariantReport {
    /// Payment rows.
    pub payments: usize,
    /// Charges at the processor.
    pub charges: usize,
    /// Final answers clients received.
    pub answers: usize,
}

impl System {
    /// Checks every invariant of the proof; `completer_ran` adds the ones that hold only after
    /// the completer and the job runner had their turn. Panics with every violation found.
    pub async fn check_invariants(&self, completer_ran: bool) -> InvariantReport {
        let (violations, report) = self.invariant_violations(completer_ran).await;
        assert!(violations.is_empty(), "invariants violated:\n{}", violations.join("\n"));
        report
    }

    /// Every violation of the proof's invariants, one line each, without panicking on a
    /// violation: for a run that measures what breaks (the asynchronous failover of
    /// `make proof-ha`) rather than asserting that nothing does. A read that fails panics.
    pub async fn invariant_violations(
        &self,
        completer_ran: bool,
    ) -> (Vec<String>, InvariantReport) {
        let observed = Observed {
            charges: self.charges().await,
            payments: sqlx::query_as(
                "SELECT id, account_id, status, amount_captured, amount_refunded, \
                        processor_charge_id, receipt_email FROM payments",
            )
            .fetch_all(&self.pool)
            .await
            .expect("reading the payments"),
            answers: self.ledger.snapshot(),
        };
        let pool = &self.pool;
        let mut violations = Vec::new();
        violations.extend(every_charge_belongs_to_a_payment(&observed));
        violations.extend(one_successful_charge_per_payment(&observed));
        violations.extend(no_refund_exceeds_its_capture(pool, &observed).await);
        violations.extend(same_key_same_answer_and_no_leak(pool, &observed).await);
        violations.extend(one_event_per_committed_change(pool, &observed).await);
        if completer_ran {
            violations.extend(nothing_unfinished_unless_flagged(pool).await);
            violations.extend(one_receipt_per_payment_that_asked(pool, &observed).await);
        }
        let answers = observed.answers.values().flatten().filter(|(s, _)| is_final(*s)).count();
        let report = InvariantReport {
            payments: observed.payments.len(),
            charges: observed.charges.len(),
            answers,
        };
        (violations, report)
    }
}

/// Invariant 2b: every charge the processor made carries a payment id, and that payment exists.
fn every_charge_belongs_to_a_payment(observed: &Observed) -> Vec<String> {
    let mut violations = Vec::new();
    for charge in &observed.charges {
        match charge["metadata"]["payment_id"].as_str() {
            None => violations.push(format!("charge {} has no payment_id", charge["id"])),
            Some(payment_id) if observed.payment(payment_id).is_none() => violations
                .push(format!("charge {} belongs to no payment ({payment_id})", charge["id"])),
            Some(_) => {}
        }
    }
    violations
}

/// Invariant 1: exactly one successful charge per payment that was charged, none for a failed one,
/// and it is the one the payment records.
fn one_successful_charge_per_payment(observed: &Observed) -> Vec<String> {
    let paid = observed.paid();
    let mut violations = Vec::new();
    for PaymentRow { id, status, processor_charge_id, .. } in &observed.payments {
        let made = paid.get(id.as_str()).map_or(0, Vec::len);
        let expected = match status.as_str() {
            "succeeded" | "requires_capture" | "canceled" => 1,
            "failed" => 0,
            _ => made.min(1), // processing: at most one
        };
        if made != expected {
            violations.push(format!("payment {id} ({status}) has {made} successful charges"));
        }
        // A payment still `processing` has not recorded its charge yet; at most one may exist
        // (checked above). Once the completer ran, only a key flagged for a person may leave it
        // so: `nothing_unfinished_unless_flagged`.
        if expected == 1 && status != "processing" {
            let recorded =
                paid.get(id.as_str()).and_then(|c| c.first()).and_then(|c| c["id"].as_str());
            if recorded != processor_charge_id.as_deref() {
                let recorded_here = processor_charge_id.as_deref();
                violations.push(format!(
                    "payment {id} records charge {recorded_here:?}, the processor made {recorded:?}"
                ));
            }
        }
    }
    violations
}

/// Invariant 4: no over-refund: not at the processor, not on a payment, not in the sum of its
/// refunds.
async fn no_refund_exceeds_its_capture(pool: &PgPool, observed: &Observed) -> Vec<String> {
    let mut violations = Vec::new();
    for charge in &observed.charges {
        if charge["amount_refunded"].as_i64() > charge["amount"].as_i64() {
            violations.push(format!("charge {} refunded more than its amount", charge["id"]));
        }
    }
    for PaymentRow { id, amount_captured, amount_refunded, .. } in &observed.payments {
        if amount_refunded > amount_captured {
            violations
                .push(format!("payment {id} refunded {amount_refunded} of {amount_captured}"));
        }
    }
    let refunded_sums: Vec<(String, i64)> = sqlx::query_as(
        "SELECT payment_id, coalesce(sum(amount), 0)::bigint FROM refunds \
         WHERE status = 'succeeded' GROUP BY payment_id",
    )
    .fetch_all(pool)
    .await
    .expect("reading the sums of succeeded refunds");
    for (payment_id, sum) in refunded_sums {
        if let Some(payment) = observed.payment(&payment_id)
            && sum > payment.amount_captured
        {
            violations.push(format!(
                "refunds of {payment_id} add up to {sum}, more than the {} captured",
                payment.amount_captured
            ));
        }
    }
    violations
}

/// Invariants 2, 3 and 6: the same key always got the same final answer; every 201 names a payment
/// that exists; no account was shown another account's payment.
async fn same_key_same_answer_and_no_leak(pool: &PgPool, observed: &Observed) -> Vec<String> {
    let accounts_by_key_hash: HashMap<Vec<u8>, String> =
        sqlx::query_as::<_, (String, Vec<u8>)>("SELECT account_id, key_hash FROM api_keys")
            .fetch_all(pool)
            .await
            .expect("reading the API keys")
            .into_iter()
            .map(|(account, hash)| (hash, account))
            .collect();
    let mut violations = Vec::new();
    for ((secret, key), responses) in &observed.answers {
        let hash = payments_domain::accounts::key_digest(secret).to_vec();
        let account = accounts_by_key_hash.get(&hash).unwrap_or_else(|| {
            panic!("the ledger holds answers to a secret no account has ({key})")
        });
        let finals: Vec<&(u16, Vec<u8>)> = responses.iter().filter(|(s, _)| is_final(*s)).collect();
        if let Some(first) = finals.first()
            && finals.iter().any(|r| r != first)
        {
            violations.push(format!("key {key} got different final answers"));
        }
        for (status, body) in &finals {
            for id in ids_in(&String::from_utf8_lossy(body), "pay_") {
                match observed.payment(&id) {
                    None if *status == 201 => {
                        violations.push(format!("a 201 names payment {id}, which does not exist"))
                    }
                    Some(p) if &p.account_id != account => violations.push(format!(
                        "account {account} was shown payment {id} of {}",
                        p.account_id
                    )),
                    _ => {}
                }
            }
        }
    }
    violations
}

/// Invariant 7: every committed change has exactly one event, and no event exists for a change that
/// did not commit: the events of each object are the ones its state implies (written in the
/// change's own phase, so this holds at every moment, crashes included). The events about webhook
/// endpoints (`webhook_endpoint.disabled`) change no payment or refund, and are not counted.
async fn one_event_per_committed_change(pool: &PgPool, observed: &Observed) -> Vec<String> {
    let counted: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT object->>'id', type, count(*) FROM events \
          WHERE type <> 'payment.updated' AND type NOT LIKE 'webhook\\_endpoint.%' \
         GROUP BY 1, 2",
    )
    .fetch_all(pool)
    .await
    .expect("reading the events");
    let mut events: HashMap<String, HashMap<String, i64>> = HashMap::new();
    for (object, kind, n) in counted {
        events.entry(object).or_default().insert(kind, n);
    }
    let refunds: Vec<(String, String)> = sqlx::query_as("SELECT id, status FROM refunds")
        .fetch_all(pool)
        .await
        .expect("reading the refunds");
    let states = observed
        .payments
        .iter()
        .map(|p| (p.id.clone(), format!("payment:{}", p.status)))
        .chain(refunds.into_iter().map(|(id, status)| (id, format!("refund:{status}"))));
    let mut violations = Vec::new();
    for (id, state) in states {
        let mut got: Vec<(String, i64)> =
            events.remove(&id).unwrap_or_default().into_iter().collect();
        got.sort();
        let got: Vec<(&str, i64)> = got.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        let allowed: &[&[(&str, i64)]] = match state.as_str() {
            "payment:succeeded" => &[
                &[("payment.succeeded", 1)],
                &[("payment.captured", 1), ("payment.requires_capture", 1)],
            ],
            "payment:requires_capture" => &[&[("payment.requires_capture", 1)]],
            "payment:canceled" => &[&[("payment.canceled", 1), ("payment.requires_capture", 1)]],
            "payment:failed" => &[&[("payment.failed", 1)]],
            // Created and not charged yet, or authorized and being captured or canceled.
            "payment:processing" => &[&[], &[("payment.requires_capture", 1)]],
            "refund:succeeded" => &[&[("refund.succeeded", 1)]],
            "refund:failed" => &[&[("refund.failed", 1)]],
            _ => &[&[]],
        };
        if !allowed.contains(&got.as_slice()) {
            violations.push(format!("{id} ({state}) has the events {got:?}"));
        }
    }
    for (id, kinds) in events {
        violations.push(format!("events {kinds:?} name {id}, which does not exist"));
    }
    violations
}

/// Invariant 2c: after the completer ran, nothing is left unfinished unless a person has to look at
/// it, and no payment is left `processing` without a key that will finish it.
async fn nothing_unfinished_unless_flagged(pool: &PgPool) -> Vec<String> {
    let mut violations = Vec::new();
    let unfinished: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idempotency_keys \
         WHERE completed_at IS NULL AND needs_human_at IS NULL",
    )
    .fetch_one(pool)
    .await
    .expect("counting the unfinished keys");
    if unfinished != 0 {
        violations.push(format!("{unfinished} keys are unfinished and not flagged"));
    }
    let stranded: Vec<String> = sqlx::query_scalar(
        "SELECT p.id FROM payments p JOIN idempotency_keys k ON k.id = p.idempotency_key_id \
         WHERE p.status = 'processing' AND k.needs_human_at IS NULL \
           AND NOT EXISTS (SELECT 1 FROM idempotency_keys o \
                            WHERE o.account_id = p.account_id AND o.completed_at IS NULL \
                              AND o.request_path LIKE '/v1/payments/' || p.id || '/%')",
    )
    .fetch_all(pool)
    .await
    .expect("reading the payments left processing");
    for id in stranded {
        violations.push(format!("payment {id} is processing, and no key is left to finish it"));
    }
    violations
}

/// Invariant 5: after the job runner ran, one receipt per succeeded payment that asked for one.
async fn one_receipt_per_payment_that_asked(pool: &PgPool, observed: &Observed) -> Vec<String> {
    let receipts: HashMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
        "SELECT payment_id, count(*) FROM receipts GROUP BY payment_id",
    )
    .fetch_all(pool)
    .await
    .expect("counting the receipts")
    .into_iter()
    .collect();
    let mut violations = Vec::new();
    for PaymentRow { id, status, receipt_email, .. } in &observed.payments {
        let wanted = receipt_email.is_some() && status == "succeeded";
        let got = receipts.get(id).copied().unwrap_or(0);
        if wanted && got != 1 {
            violations.push(format!("payment {id} has {got} receipts"));
        }
    }
    violations
}

/// The ids with `prefix` in a response body.
fn ids_in(text: &str, prefix: &str) -> HashSet<String> {
    text.match_indices(prefix)
        .map(|(i, _)| {
            text[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|id| id.len() > prefix.len() + 8)
        .collect()
}
