//! A page of an account's payments, by keyset (cursor) pagination, and the helpers the other lists
//! (refunds, events) share: the rows put back in walk order, and the page trimmed.

use std::collections::BTreeMap;

use sqlx::PgExecutor;
use sqlx::types::Json;

use super::{CancellationReason, CaptureMethod, Payment, PaymentRow, PaymentStatus};
use crate::DomainError;
use crate::ids::{AccountId, PaymentId};
use crate::money::{Amount, Currency};

/// Which side of a cursor a page lies on: the cursor is an object of the list, by its id.
#[derive(Debug, Clone)]
pub enum Cursor<Id> {
    /// Older than this id.
    After(Id),
    /// Newer than this id.
    Before(Id),
}

impl<Id> Cursor<Id> {
    /// The id, as `(starting_after, ending_before)`.
    pub(crate) fn sides(cursor: Option<&Self>) -> (Option<&Id>, Option<&Id>) {
        match cursor {
            None => (None, None),
            Some(Cursor::After(id)) => (Some(id), None),
            Some(Cursor::Before(id)) => (None, Some(id)),
        }
    }
}

/// A page of a list in creation order, by keyset, as one statement: the one walk that the
/// lists of `$table`'s rows of one `$scope` ($1) share (payments of an account, refunds of a
/// payment). `$rows` is a macro like `payment_rows_if_any!` that puts its table's columns of the
/// page's row `p`, each optional, between the walk's head and tail. `$2` is the limit, `$3` the
/// cursor to start after, `$4` the one to end before (at most one is set).
///
/// The cursor's position, whether it exists, and the page (one extra row tells whether there is
/// more), ordered by (created_at, seq). Each direction is its own branch, a walk of ($scope,
/// created_at DESC, seq DESC) from the cursor that stops at `limit + 1` rows; the branches not
/// asked for are switched off by a one-time filter on the parameters (no `ORDER BY CASE`, which
/// would sort the whole scope). The cursor's position is given as scalar subqueries, so that it
/// becomes the index scan's start rather than a join filter over every newer row. Going
/// backwards reads ascending; [`in_walk_order`] and [`finish_page`] put the rows in order.
macro_rules! keyset_page {
    ($rows:ident, $table:literal, $scope:literal, $($args:tt)*) => {
        $rows!(
            [
                r#"
        WITH cursor AS (
            SELECT created_at, seq FROM "#, $table, r#" WHERE "#, $scope, r#" = $1
               AND id = coalesce($3, $4)
        )
        SELECT p.seq AS "seq?",
               (extract(epoch FROM p.created_at) * 1000000)::bigint AS "created_us?","#
            ],
            [
                r#"
               (coalesce($3, $4) IS NULL OR EXISTS (SELECT 1 FROM cursor)) AS "cursor_found!"
          FROM (SELECT 1) one
          LEFT JOIN LATERAL (
              (SELECT * FROM "#, $table, r#"
                WHERE $3::text IS NULL AND $4::text IS NULL AND "#, $scope, r#" = $1
                ORDER BY created_at DESC, seq DESC
                LIMIT $2::bigint + 1)
              UNION ALL
              (SELECT q.* FROM "#, $table, r#" q
                WHERE $3::text IS NOT NULL AND q."#, $scope, r#" = $1
                  AND (q.created_at, q.seq)
                      < ((SELECT created_at FROM cursor), (SELECT seq FROM cursor))
                ORDER BY q.created_at DESC, q.seq DESC
                LIMIT $2::bigint + 1)
              UNION ALL
              (SELECT q.* FROM "#, $table, r#" q
                WHERE $4::text IS NOT NULL AND q."#, $scope, r#" = $1
                  AND (q.created_at, q.seq)
                      > ((SELECT created_at FROM cursor), (SELECT seq FROM cursor))
                ORDER BY q.created_at, q.seq
                LIMIT $2::bigint + 1)
          ) p ON true
        "#
            ],
            $($args)*
        )
    };
}
pub(crate) use keyset_page;

/// A page of the account's payments, newest first, and whether more lie beyond it. `None` when
/// the cursor names no payment of the account.
pub async fn list(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
    limit: i64,
    cursor: Option<&Cursor<PaymentId>>,
) -> Result<Option<(Vec<Payment>, bool)>, DomainError> {
    let (after, before) = Cursor::sides(cursor);
    // One statement: the walk of `keyset_page!` over the account's payments.
    let rows = keyset_page!(
        payment_rows_if_any,
        "payments",
        "account_id",
        account_id as &AccountId,
        limit,
        after as Option<&PaymentId>,
        before as Option<&PaymentId>,
    )
    .fetch_all(executor)
    .await?;
    if !rows.first().is_some_and(|r| r.cursor_found) {
        return Ok(None);
    }
    let mut payments = Vec::with_capacity(rows.len());
    let mut positions = Vec::with_capacity(rows.len());
    for r in rows {
        let position = (r.created_us.unwrap_or_default(), r.seq.unwrap_or_default());
        // The LEFT JOIN's empty row is no payment: a page without payments.
        if let Some(payment) = payment_if_any!(r) {
            positions.push(position);
            payments.push(Payment::from(payment));
        }
    }
    let payments = in_walk_order(payments, positions, before.is_some());
    Ok(Some(finish_page(payments, limit, before.is_some())))
}

/// Rows in the order their branch walked them (newest first; oldest first going backwards):
/// the order of a `UNION ALL` is not promised, so it is restored from each row's position.
pub(crate) fn in_walk_order<T>(
    items: Vec<T>,
    positions: Vec<(i64, i64)>,
    backwards: bool,
) -> Vec<T> {
    let mut keyed: Vec<_> = positions.into_iter().zip(items).collect();
    keyed.sort_by(|(a, _), (b, _)| if backwards { a.cmp(b) } else { b.cmp(a) });
    keyed.into_iter().map(|(_, item)| item).collect()
}

/// A page read with one row more than `limit`: trimmed, with whether there is more, newest
/// first (a page read backwards, oldest first, is turned around).
pub(crate) fn finish_page<T>(mut items: Vec<T>, limit: i64, backwards: bool) -> (Vec<T>, bool) {
    let limit = usize::try_from(limit).unwrap_or(0);
    let has_more = items.len() > limit;
    items.truncate(limit);
    if backwards {
        items.reverse();
    }
    (items, has_more)
}
