//! A successful charge the payment does not account for ([`ExtraCharge`]): audited for a person
//! in the transaction that found it, then reported to the log and to alerting once that commits.

use serde_json::json;
use sqlx::PgConnection;

use crate::DomainError;
use crate::audit::{self, AuditEvent};
use crate::ids::{AccountId, PaymentId};

/// A successful charge at the processor for a payment that records another one (or none): an
/// earlier generation of the downstream key made it, and the lookups missed it (or the processor
/// made it despite refusing the call). The card was charged once more than the payment records;
/// a person refunds the extra charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraCharge {
    /// The charge the payment does not account for.
    pub charge_id: String,
    /// The downstream key of the call that made it, as the processor reported it.
    pub downstream_key: Option<String>,
    /// The charge the payment records, if any.
    pub recorded: Option<String>,
}

/// Records `extra` for a person, in the caller's transaction: an audit record
/// `payment.extra_charge` under the payment's creating key `key_id` (the inspector shows it on
/// that key's page), found by `found_by` (`webhook` or `phase`, and the event or request that
/// found it). Once that transaction commits, the caller reports it ([`report_extra_charge`]).
pub(crate) async fn audit_extra_charge(
    conn: &mut PgConnection,
    payment_id: &PaymentId,
    account_id: &AccountId,
    key_id: Option<i64>,
    extra: &ExtraCharge,
    (found_by, request_id): (&'static str, &str),
) -> Result<(), DomainError> {
    let Some(key_id) = key_id else { return Ok(()) };
    let detail = json!({
        "extra_charge": extra.charge_id,
        "downstream_key": extra.downstream_key,
        "recorded_charge": extra.recorded,
        "found_by": found_by,
    });
    let event = AuditEvent {
        account_id,
        object_id: payment_id,
        action: "payment.extra_charge",
        request_id,
        idempotency_key_id: key_id,
        detail,
    };
    audit::record(conn, &event).await
}

/// After the transaction that audited `extra` committed (a phase or a delivery that rolled back
/// reports nothing): an error in the log and the counter `payments_extra_charges_total`, which
/// alerting watches.
pub fn report_extra_charge(payment_id: &PaymentId, extra: &ExtraCharge, found_by: &str) {
    tracing::error!(
        %payment_id,
        recorded_charge = extra.recorded,
        extra_charge = extra.charge_id,
        downstream_key = extra.downstream_key,
        found_by,
        "the processor charged the card once more than the payment records: a person must refund the extra charge"
    );
    metrics::counter!("payments_extra_charges_total").increment(1);
}
