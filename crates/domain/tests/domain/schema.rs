//! The database keeps the rules of what it stores, whoever writes it: each value a rule refuses is
//! refused by PostgreSQL itself (`check_violation`), not only by the Rust types that write it.
//! The one-column rules of the tables every money-moving request writes live in domains
//! (the `CREATE DOMAIN`s of migrations/, docs/schema.sql), which
//! PostgreSQL plans once per session instead of once per writing statement; the last test keeps
//! them there.

use sqlx::PgPool;

/// One payment `pay_1` with a refund `re_1`, an event `evt_1` and an unfinished key (id 1).
async fn one_of_each(pool: &PgPool) {
    sqlx::raw_sql(
        "INSERT INTO accounts (id, name) VALUES ('acct_1', 'shop');
         INSERT INTO payments (id, account_id, amount, currency, status, capture_method,
                               amount_captured, amount_refunded, payment_method)
         VALUES ('pay_1', 'acct_1', 500, 'usd', 'succeeded', 'automatic', 500, 100,
                 'pm_card_visa');
         INSERT INTO refunds (id, account_id, payment_id, amount, currency, status, reason)
         VALUES ('re_1', 'acct_1', 'pay_1', 100, 'usd', 'succeeded', 'duplicate');
         INSERT INTO events (id, account_id, type, object)
         VALUES ('evt_1', 'acct_1', 'payment.succeeded', '{}');
         INSERT INTO idempotency_keys (id, account_id, idempotency_key, fingerprint,
                                       request_method, request_path, request_id, operation,
                                       request_params)
         OVERRIDING SYSTEM VALUE
         VALUES (1, 'acct_1', 'k', sha256('k'), 'POST', '/v1/payments', 'req_1',
                 'payments.create', '{}')",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// The name of the rule that refused `statement`, or `None` if it was not refused by a rule.
async fn refused_by(pool: &PgPool, statement: &str) -> Option<String> {
    let mut tx = pool.begin().await.unwrap();
    let result = sqlx::raw_sql(statement).execute(&mut *tx).await;
    tx.rollback().await.unwrap();
    match result {
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23514") => {
            db.constraint().map(str::to_owned)
        }
        Err(other) => panic!("{statement}: refused, but not by a rule: {other}"),
        Ok(_) => None,
    }
}

#[sqlx::test(migrations = "../../migrations")]
async fn every_rule_refuses_what_it_rules_out_and_lets_the_rest_through(pool: PgPool) {
    one_of_each(&pool).await;
    // (statement, the rule that must refuse it); each has a neighbour the rule lets through.
    let refused = [
        ("UPDATE payments SET id = 'pax_1'", "payment_id_prefix"),
        ("UPDATE payments SET id = 'payX1'", "payment_id_prefix"),
        ("UPDATE payments SET amount = 0", "amount_range"),
        ("UPDATE payments SET amount = 100000000", "amount_range"),
        ("UPDATE payments SET currency = 'USD'", "currency_code"),
        ("UPDATE payments SET status = 'pending'", "payment_status_known"),
        ("UPDATE payments SET capture_method = 'delayed'", "capture_method_known"),
        ("UPDATE payments SET amount_captured = 501", "payments_check"),
        ("UPDATE payments SET amount_captured = -1", "minor_units_not_negative"),
        ("UPDATE payments SET amount_refunded = -1", "minor_units_not_negative"),
        ("UPDATE payments SET amount_refunded = 501", "payments_check1"),
        ("UPDATE payments SET status = 'requires_action'", "payments_next_action"),
        ("UPDATE payments SET next_action_url = 'https://x.example'", "payments_next_action"),
        ("UPDATE refunds SET id = 'rf_1'", "refund_id_prefix"),
        ("UPDATE refunds SET id = 'reX1'", "refund_id_prefix"),
        ("UPDATE refunds SET amount = 0", "amount_range"),
        ("UPDATE refunds SET amount = 100000000", "amount_range"),
        ("UPDATE refunds SET status = 'refunded'", "refund_status_known"),
        ("UPDATE refunds SET reason = 'mistake'", "refund_reason_known"),
        ("UPDATE events SET id = 'ev_1'", "event_id_prefix"),
        ("UPDATE events SET id = 'evtX1'", "event_id_prefix"),
        ("UPDATE idempotency_keys SET idempotency_key = ''", "idempotency_key_length"),
        (
            "UPDATE idempotency_keys SET idempotency_key = repeat('k', 256)",
            "idempotency_key_length",
        ),
        (
            "UPDATE idempotency_keys SET fingerprint = substring(fingerprint FROM 2)",
            "fingerprint_sha256",
        ),
        ("UPDATE idempotency_keys SET attempts = -1", "attempt_count_not_negative"),
        (
            "UPDATE idempotency_keys SET response_status = 99, response_headers = '[]',
                    response_body = '', completed_at = now(), recovery_point = 'finished'",
            "http_status_range",
        ),
        (
            "UPDATE idempotency_keys SET response_status = 200, response_body = ''",
            "idempotency_keys_final_whole",
        ),
        (
            "UPDATE idempotency_keys SET owner_token = gen_random_uuid()",
            "idempotency_keys_lease_whole",
        ),
        (
            "INSERT INTO payments (id, account_id, amount, currency, status, capture_method,
                                   payment_method)
             VALUES ('pay_2', 'acct_1', 500, 'usd', 'paid', 'automatic', 'pm_card_visa')",
            "payment_status_known",
        ),
    ];
    for (statement, rule) in refused {
        assert_eq!(refused_by(&pool, statement).await.as_deref(), Some(rule), "{statement}");
    }
    let allowed = [
        "INSERT INTO payments (id, account_id, amount, currency, status, capture_method,
                               payment_method)
         VALUES ('pay_2', 'acct_1', 1, 'jpy', 'requires_capture', 'manual', 'pm_card_visa')",
        "UPDATE payments SET amount = 99999999",
        "UPDATE payments SET status = 'requires_action', amount_captured = 0,
                             amount_refunded = 0, next_action_url = 'https://x.example'",
        "UPDATE payments SET amount = 500, currency = 'eur', status = 'canceled',
                             capture_method = 'manual', amount_captured = 500,
                             amount_refunded = 500",
        "UPDATE refunds SET id = 're_2', amount = 1, status = 'pending', reason = NULL",
        "UPDATE events SET id = 'evt_2'",
        "UPDATE idempotency_keys SET idempotency_key = repeat('k', 255), attempts = 0",
        "UPDATE idempotency_keys SET response_status = 599, response_headers = '[]',
                response_body = '', completed_at = now(), recovery_point = 'finished'",
        "UPDATE idempotency_keys SET owner_token = gen_random_uuid(), locked_until = now()",
    ];
    for statement in allowed {
        assert_eq!(refused_by(&pool, statement).await, None, "{statement}");
    }
}

#[sqlx::test(migrations = "../../migrations")]
async fn the_tables_of_money_moving_requests_keep_their_one_column_rules_in_domains(pool: PgPool) {
    // A CHECK of one column on these tables is planned again by every statement that writes the
    // table (PostgreSQL 15); as a domain it is planned once per session.
    let on_a_table: Vec<String> = sqlx::query_scalar(
        "SELECT conrelid::regclass::text || '.' || conname
           FROM pg_constraint
          WHERE contype = 'c' AND cardinality(conkey) = 1
            AND conrelid = ANY ('{payments,refunds,events,idempotency_keys}'::regclass[])
          ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(on_a_table, Vec::<String>::new(), "write these as domains");
    let typed: Vec<(String, String)> = sqlx::query_as(
        "SELECT table_name || '.' || column_name, domain_name
           FROM information_schema.columns
          WHERE table_schema = 'public' AND domain_name IS NOT NULL
          ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let expected = [
        ("events.id", "event_id"),
        ("idempotency_keys.attempts", "attempt_count"),
        ("idempotency_keys.fingerprint", "fingerprint"),
        ("idempotency_keys.idempotency_key", "idempotency_key"),
        ("idempotency_keys.response_status", "http_status"),
        ("payments.amount", "amount"),
        ("payments.amount_captured", "minor_units"),
        ("payments.amount_refunded", "minor_units"),
        ("payments.capture_method", "capture_method"),
        ("payments.currency", "currency"),
        ("payments.id", "payment_id"),
        ("payments.status", "payment_status"),
        ("refunds.amount", "amount"),
        ("refunds.id", "refund_id"),
        ("refunds.reason", "refund_reason"),
        ("refunds.status", "refund_status"),
    ]
    .map(|(column, domain)| (column.to_owned(), domain.to_owned()));
    assert_eq!(typed, expected);
}
