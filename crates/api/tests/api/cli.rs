//! The `payments-api` binary as an operator and a script use it.

use std::process::Output;

use payments_testkit::{WAIT, eventually};
use sqlx::PgPool;
use tokio::process::Command;

fn database_url(pool: &PgPool) -> String {
    let options = pool.connect_options();
    format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or_default()
    )
}

async fn payments_api(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_payments-api"));
    command.args(args).env_remove("RUST_LOG");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().await.expect("payments-api runs")
}

#[tokio::test]
async fn a_bad_setting_stops_start_up_naming_the_setting() {
    let output = payments_api(&["serve"], &[("PAYMENTS__HTTP__PORT", "eighty")]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("http.port"), "{stderr}");

    let output = payments_api(&["serve"], &[("PAYMENTS__LOG__FILTER", "info,[")]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("log.filter") && stderr.contains("PAYMENTS__LOG__FILTER"), "{stderr}");
}

/// The key that seals webhook signing secrets, which `serve` needs.
const SEALING_KEY: (&str, &str) = (
    "PAYMENTS__WEBHOOKS__SEALING_KEY",
    "4242424242424242424242424242424242424242424242424242424242424242",
);

#[tokio::test]
async fn serving_without_a_sealing_key_stops_start_up_naming_it() {
    let output = payments_api(&["serve"], &[("PAYMENTS__HTTP__PORT", "0")]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("PAYMENTS__WEBHOOKS__SEALING_KEY"), "{stderr}");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn reseal_seals_every_secret_again_with_the_new_key(pool: PgPool) {
    use payments_domain::webhooks::{self, AddressRule, EnabledEvents, SealingKeys};
    let (account, _, _) = payments_domain::accounts::create_account(&pool, "shop").await.unwrap();
    let rule = AddressRule { allow_loopback: false, deny_ranges: Vec::new() };
    let url = rule.check_url("https://example.com/hook").unwrap();
    let old = SealingKeys::new([0x42; 32], []);
    let mut conn = pool.acquire().await.unwrap();
    let all = EnabledEvents::All;
    let endpoint = webhooks::create(&mut conn, &old, &account.id, &url, &all).await.unwrap();
    let secret = old.open(&endpoint.secret, &endpoint.id).unwrap();
    let (database, new_key) = (database_url(&pool), "17".repeat(32));
    let env = [
        ("DATABASE_URL", database.as_str()),
        (SEALING_KEY.0, new_key.as_str()),
        ("PAYMENTS__WEBHOOKS__OLD_SEALING_KEYS", SEALING_KEY.1),
    ];
    let output = payments_api(&["webhooks", "reseal"], &env).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("sealed 1 signing secret(s) again"), "{stderr}");
    let new_only = SealingKeys::new([0x17; 32], []);
    let found = webhooks::find(&pool, &account.id, &endpoint.id).await.unwrap().unwrap();
    assert_eq!(new_only.open(&found.secret, &endpoint.id).unwrap().expose(), secret.expose());
}

#[tokio::test]
async fn help_describes_the_command_itself_not_the_crate() {
    let output = payments_api(&["--help"], &[]).await;
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let about = stdout.lines().next().expect("help has a first line");
    assert_eq!(about, "The payments API server and its operator commands", "{stdout}");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn accounts_create_prints_the_new_key_alone_on_standard_output(pool: PgPool) {
    let url = database_url(&pool);
    let output =
        payments_api(&["accounts", "create", "--name", "Demo shop"], &[("DATABASE_URL", &url)])
            .await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let key = stdout.strip_suffix('\n').unwrap();
    assert!(key.starts_with("sk_test_") && !key.contains(char::is_whitespace), "{stdout:?}");
    let account = payments_domain::accounts::authenticate(&pool, key).await.unwrap();
    assert!(account.is_some(), "the printed key authenticates");
    assert!(String::from_utf8_lossy(&output.stderr).contains("created account acct_"));
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn keys_revoke_refuses_the_key_from_then_on(pool: PgPool) {
    let url = database_url(&pool);
    let (account, _, first) =
        payments_domain::accounts::create_account(&pool, "shop").await.unwrap();
    let output = payments_api(
        &["keys", "create", "--account", account.id.as_str()],
        &[("DATABASE_URL", &url)],
    )
    .await;
    assert!(output.status.success());
    let second = String::from_utf8(output.stdout).unwrap().trim().to_owned();

    let first_id: String = sqlx::query_scalar("SELECT id FROM api_keys WHERE last4 = $1")
        .bind(&first.expose()[first.expose().len() - 4..])
        .fetch_one(&pool)
        .await
        .unwrap();
    let output = payments_api(&["keys", "revoke", &first_id], &[("DATABASE_URL", &url)]).await;
    assert!(output.status.success());

    assert!(
        payments_domain::accounts::authenticate(&pool, first.expose()).await.unwrap().is_none()
    );
    assert!(payments_domain::accounts::authenticate(&pool, &second).await.unwrap().is_some());

    let output = payments_api(&["keys", "revoke", "key_nope"], &[("DATABASE_URL", &url)]).await;
    assert!(!output.status.success());
}

/// The least machinery that makes test-mode receipts usable: the operator vouches for an
/// account's own addresses, lists them, and forgets one.
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn accounts_verify_email_lists_and_forgets_the_accounts_own_addresses(pool: PgPool) {
    let url = database_url(&pool);
    let env = [("DATABASE_URL", url.as_str())];
    let (account, _, _) = payments_domain::accounts::create_account(&pool, "shop").await.unwrap();
    let account = account.id.to_string();
    for email in ["Billing@Shop.example", "owner@shop.example", "billing@shop.example"] {
        let args = ["accounts", "verify-email", "--account", &account, "--email", email];
        let output = payments_api(&args, &env).await;
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    }
    let list = ["accounts", "emails", "--account", account.as_str()];
    let emails = || payments_api(&list, &env);
    let listed = String::from_utf8(emails().await.stdout).unwrap();
    assert_eq!(listed, "billing@shop.example\nowner@shop.example\n", "lower case, once each");

    let forget =
        ["accounts", "forget-email", "--account", &account, "--email", "OWNER@shop.example"];
    assert!(payments_api(&forget, &env).await.status.success());
    assert_eq!(String::from_utf8(emails().await.stdout).unwrap(), "billing@shop.example\n");
    assert!(!payments_api(&forget, &env).await.status.success(), "forgotten already");

    // Not an address, or not an account: refused, and nothing stored.
    for (account, email) in [(account.as_str(), "not an address"), ("acct_nope", "a@shop.example")]
    {
        let args = ["accounts", "verify-email", "--account", account, "--email", email];
        assert!(!payments_api(&args, &env).await.status.success(), "{account} {email}");
    }
    assert_eq!(String::from_utf8(emails().await.stdout).unwrap(), "billing@shop.example\n");
}

#[sqlx::test(migrations = false)]
async fn migrate_creates_a_missing_database_and_is_idempotent(pool: PgPool) {
    let fresh = format!("payments_cli_{}", std::process::id());
    let url = database_url(&pool);
    let url = format!("{}/{fresh}", url.rsplit_once('/').unwrap().0);
    for _ in 0..2 {
        let output = payments_api(&["migrate"], &[("DATABASE_URL", &url)]).await;
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    }
    let tables: i64 =
        sqlx::query_scalar(&format!("SELECT count(*) FROM pg_database WHERE datname = '{fresh}'"))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(tables, 1);
    sqlx::query(&format!("DROP DATABASE {fresh} WITH (FORCE)")).execute(&pool).await.unwrap();
}

/// `migrate` applies every migration with no statement timeout, whatever the pool's setting (an
/// index built concurrently on a big table takes longer than any request's statement may), and
/// waits for another `migrate` to end before it starts, holding no snapshot while it waits.
#[sqlx::test(migrations = false)]
async fn migrate_ignores_the_statement_timeout_and_waits_for_another_migrate(pool: PgPool) {
    let fresh = format!("payments_cli_turn_{}", std::process::id());
    let url = database_url(&pool);
    let url = format!("{}/{fresh}", url.rsplit_once('/').unwrap().0);
    sqlx::query(&format!("CREATE DATABASE {fresh}")).execute(&pool).await.unwrap();
    let other = PgPool::connect(&url).await.unwrap();
    // Another `migrate` holds its turn.
    let mut holder = other.acquire().await.unwrap();
    assert!(
        sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock(8097887115748996211)")
            .fetch_one(&mut *holder)
            .await
            .unwrap()
    );
    let url_for_migrate = url.clone();
    let waiting = tokio::spawn(async move {
        let timeout = ("PAYMENTS__DATABASE__STATEMENT_TIMEOUT_MS", "1");
        payments_api(&["migrate"], &[("DATABASE_URL", &url_for_migrate), timeout]).await
    });
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(!waiting.is_finished(), "migrate did not wait for the other one");
    let applied: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT FROM pg_tables WHERE tablename = '_sqlx_migrations')",
    )
    .fetch_one(&mut *holder)
    .await
    .unwrap();
    assert!(!applied, "nothing applied while the other migrate runs");
    // Waiting, it holds no snapshot (no transaction, no statement running).
    let snapshots: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
            AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL",
    )
    .fetch_one(&mut *holder)
    .await
    .unwrap();
    assert_eq!(snapshots, 0);
    drop(holder);
    other.close().await;
    let output = waiting.await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("another migrate is running"), "{stderr}");
    sqlx::query(&format!("DROP DATABASE {fresh} WITH (FORCE)")).execute(&pool).await.unwrap();
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn json_logs_carry_the_request_and_account_ids_and_never_the_key(pool: PgPool) {
    let url = database_url(&pool);
    let (account, _, secret) =
        payments_domain::accounts::create_account(&pool, "shop").await.unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let server = Command::new(env!("CARGO_BIN_EXE_payments-api"))
        .arg("serve")
        .env("DATABASE_URL", &url)
        .env("PAYMENTS__HTTP__PORT", port.to_string())
        .env("PAYMENTS__HTTP__ADMIN_PORT", "0")
        .env("PAYMENTS__LOG__FORMAT", "json")
        .env(SEALING_KEY.0, SEALING_KEY.1)
        .env_remove("RUST_LOG")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    let answered = std::sync::Mutex::new(None);
    let answers = || async {
        let request = http.get(format!("http://127.0.0.1:{port}/v1/payments"));
        let Ok(response) = request.bearer_auth(secret.expose()).send().await else { return false };
        let request_id = response.headers()["request-id"].to_str().unwrap().to_owned();
        *answered.lock().unwrap() = Some(request_id);
        true
    };
    eventually("the server to answer", WAIT, answers).await;
    let request_id = answered.into_inner().unwrap().expect("the server answered");
    let pid = server.id().unwrap().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().await.unwrap();
    let output = server.wait_with_output().await.unwrap();
    let logs = String::from_utf8(output.stderr).unwrap();
    let line = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["message"] == "answered")
        .expect("an access log line in JSON");
    assert_eq!(line["span"]["request_id"], request_id.as_str());
    assert_eq!(line["span"]["account_id"], account.id.as_str());
    assert!(!logs.contains(&secret.expose()[8..]), "the secret key never reaches a log");
    assert!(!logs.to_lowercase().contains("bearer"), "nor does the Authorization header");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn keys_stuck_lists_the_keys_that_wait_for_a_person(pool: PgPool) {
    let url = database_url(&pool);
    sqlx::query(
        "INSERT INTO idempotency_keys (account_id, idempotency_key, fingerprint, request_method, request_path, \
         request_id, operation, request_params, recovery_point, needs_human_at, last_error) \
         VALUES ('acct_x', 'order-7', decode(repeat('00', 32), 'hex'), 'POST', '/v1/payments', 'req_x', \
         'payments.create', '{}', 'payment_created', now(), 'older than the processor''s idempotency window'), \
         ('acct_x', 'fine', decode(repeat('00', 32), 'hex'), 'POST', '/v1/payments', 'req_y', \
         'payments.create', '{}', 'payment_created', NULL, NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let output = payments_api(&["keys", "stuck", "--json"], &[("DATABASE_URL", &url)]).await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "only the flagged key: {lines:?}");
    assert_eq!(lines[0]["idempotency_key"], "order-7");
    assert_eq!(lines[0]["recovery_point"], "payment_created");
    assert!(lines[0]["last_error"].as_str().unwrap().contains("idempotency window"));
    let table = payments_api(&["keys", "stuck"], &[("DATABASE_URL", &url)]).await;
    assert!(String::from_utf8_lossy(&table.stdout).contains("order-7"));
}
