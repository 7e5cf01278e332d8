//! The SQL of the `refunds` table: every read and write of a refund goes through here.

use std::collections::BTreeMap;

use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};

use super::{PendingRefund, Refund, RefundReason, RefundStatus};
use crate::DomainError;
use crate::ids::{AccountId, PaymentId, RefundId};
use crate::money::{Amount, Currency};
use crate::payments::{Cursor, finish_page, in_walk_order, keyset_page};

/// A row of `refunds` as the queries below read it: every column decoded to its type, so an
/// unknown status, reason or currency is a decode error there.
struct RefundRow {
    id: RefundId,
    account_id: AccountId,
    payment_id: PaymentId,
    amount: Amount,
    currency: Currency,
    status: RefundStatus,
    reason: Option<RefundReason>,
    metadata: Json<BTreeMap<String, String>>,
    processor_refund_id: Option<String>,
    created: i64,
}

impl From<RefundRow> for Refund {
    fn from(row: RefundRow) -> Self {
        Self {
            id: row.id,
            account_id: row.account_id,
            payment_id: row.payment_id,
            amount: row.amount,
            currency: row.currency,
            status: row.status,
            reason: row.reason,
            metadata: row.metadata.0,
            processor_refund_id: row.processor_refund_id,
            created: row.created,
        }
    }
}

/// Inserts a `pending` refund.
pub async fn insert(
    conn: &mut PgConnection,
    new: &PendingRefund<'_>,
) -> Result<Refund, DomainError> {
    let row = sqlx::query_as!(
        RefundRow,
        r#"
        INSERT INTO refunds (id, account_id, payment_id, idempotency_key_id, amount, currency,
                             status, reason, metadata)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
        RETURNING id AS "id: _", account_id AS "account_id: _", payment_id AS "payment_id: _",
                  amount AS "amount: _", currency AS "currency: _", status AS "status: _",
                  reason AS "reason: _", metadata AS "metadata: _", processor_refund_id,
                  extract(epoch FROM created_at)::bigint AS "created!"
        "#,
        new.id as &RefundId,
        new.account_id as &AccountId,
        new.payment_id as &PaymentId,
        new.key_id,
        new.amount as Amount,
        new.currency as Currency,
        RefundStatus::Pending as RefundStatus,
        new.reason as Option<RefundReason>,
        Json(new.metadata) as Json<&BTreeMap<String, String>>,
    )
    .fetch_one(conn)
    .await?;
    Ok(row.into())
}

/// Marks a refund `succeeded` (with the processor's id) or `failed`.
pub async fn settle(
    conn: &mut PgConnection,
    id: &RefundId,
    processor_refund_id: Option<&str>,
    failure_code: Option<&str>,
) -> Result<Refund, DomainError> {
    let status =
        if failure_code.is_some() { RefundStatus::Failed } else { RefundStatus::Succeeded };
    let row = sqlx::query_as!(
        RefundRow,
        r#"
        UPDATE refunds SET status = $2, processor_refund_id = $3, failure_code = $4
         WHERE id = $1
        RETURNING id AS "id: _", account_id AS "account_id: _", payment_id AS "payment_id: _",
                  amount AS "amount: _", currency AS "currency: _", status AS "status: _",
                  reason AS "reason: _", metadata AS "metadata: _", processor_refund_id,
                  extract(epoch FROM created_at)::bigint AS "created!"
        "#,
        id as &RefundId,
        status as RefundStatus,
        processor_refund_id,
        failure_code,
    )
    .fetch_one(conn)
    .await?;
    Ok(row.into())
}

/// A refund of the account.
pub async fn find(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
    id: &RefundId,
) -> Result<Option<Refund>, DomainError> {
    let row = sqlx::query_as!(
        RefundRow,
        r#"
        SELECT id AS "id: _", account_id AS "account_id: _", payment_id AS "payment_id: _",
               amount AS "amount: _", currency AS "currency: _", status AS "status: _",
               reason AS "reason: _", metadata AS "metadata: _", processor_refund_id,
               extract(epoch FROM created_at)::bigint AS "created!"
          FROM refunds WHERE account_id = $1 AND id = $2
        "#,
        account_id as &AccountId,
        id as &RefundId
    )
    .fetch_optional(executor)
    .await?;
    Ok(row.map(Refund::from))
}

/// The refund created by an idempotency key.
pub async fn find_by_key(
    executor: impl PgExecutor<'_>,
    key_id: i64,
) -> Result<Option<Refund>, DomainError> {
    let row = sqlx::query_as!(
        RefundRow,
        r#"
        SELECT id AS "id: _", account_id AS "account_id: _", payment_id AS "payment_id: _",
               amount AS "amount: _", currency AS "currency: _", status AS "status: _",
               reason AS "reason: _", metadata AS "metadata: _", processor_refund_id,
               extract(epoch FROM created_at)::bigint AS "created!"
          FROM refunds WHERE idempotency_key_id = $1
        "#,
        key_id
    )
    .fetch_optional(executor)
    .await?;
    Ok(row.map(Refund::from))
}

/// As `payment_rows_if_any!`, for the refund `p` of a list's page (`keyset_page!`): the pieces of
/// `$head`, every column of `p` as an `Option`, then the pieces of `$tail`.
macro_rules! refund_rows_if_any {
    ([$($head:literal),*], [$($tail:literal),*], $($args:tt)*) => {
        sqlx::query!(
            $($head +)* r#"
               p.id AS "id?: RefundId", p.account_id AS "account_id?: AccountId",
               p.payment_id AS "payment_id?: PaymentId", p.amount AS "amount?: Amount",
               p.currency AS "currency?: Currency", p.status AS "status?: RefundStatus",
               p.reason AS "reason?: RefundReason",
               p.metadata AS "metadata?: Json<BTreeMap<String, String>>", p.processor_refund_id,
               extract(epoch FROM p.created_at)::bigint AS "created?","# $(+ $tail)*,
            $($args)*
        )
    };
}

/// A page of a payment's refunds, newest first. `None` when the cursor names no refund of it.
pub async fn list(
    executor: impl PgExecutor<'_>,
    payment_id: &PaymentId,
    limit: i64,
    cursor: Option<&Cursor<RefundId>>,
) -> Result<Option<(Vec<Refund>, bool)>, DomainError> {
    let (after, before) = Cursor::sides(cursor);
    // One statement: the walk of `keyset_page!` over the payment's refunds.
    let rows = keyset_page!(
        refund_rows_if_any,
        "refunds",
        "payment_id",
        payment_id as &PaymentId,
        limit,
        after as Option<&RefundId>,
        before as Option<&RefundId>,
    )
    .fetch_all(executor)
    .await?;
    if !rows.first().is_some_and(|r| r.cursor_found) {
        return Ok(None);
    }
    let mut refunds = Vec::with_capacity(rows.len());
    let mut positions = Vec::with_capacity(rows.len());
    for r in rows {
        let (
            Some(id),
            Some(account_id),
            Some(payment_id),
            Some(amount),
            Some(currency),
            Some(status),
            Some(metadata),
        ) = (r.id, r.account_id, r.payment_id, r.amount, r.currency, r.status, r.metadata)
        else {
            continue; // the LEFT JOIN's empty row: no refunds on this page
        };
        positions.push((r.created_us.unwrap_or_default(), r.seq.unwrap_or_default()));
        refunds.push(Refund::from(RefundRow {
            id,
            account_id,
            payment_id,
            amount,
            currency,
            status,
            reason: r.reason,
            metadata,
            processor_refund_id: r.processor_refund_id,
            created: r.created.unwrap_or_default(),
        }));
    }
    let refunds = in_walk_order(refunds, positions, before.is_some());
    Ok(Some(finish_page(refunds, limit, before.is_some())))
}
