//! The `payments-api` command line: `serve`, `migrate`, and the operator commands.
//!
//! Commands that print a result (a new secret key) print it alone on standard output, so scripts
//! can capture it; everything else goes to standard error.

use clap::{Parser, Subcommand};
use payments_domain::webhooks::{self, SealingKeys};
use payments_domain::{AccountId, ApiKeyId, accounts};
use payments_settings::ExposeSecret as _;

use crate::app::{self, Application};
use crate::settings::Settings;
use crate::{MIGRATOR, telemetry};

/// The payments API server and its operator commands.
#[derive(Debug, Parser)]
#[command(name = "payments-api", version)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API until SIGTERM or Ctrl-C.
    Serve,
    /// Apply the schema migrations that are not applied yet, then exit.
    Migrate,
    /// Manage accounts.
    #[command(subcommand)]
    Accounts(AccountsCommand),
    /// Manage secret API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Manage webhook endpoints.
    #[command(subcommand)]
    Webhooks(WebhooksCommand),
}

#[derive(Debug, Subcommand)]
enum WebhooksCommand {
    /// Seal every endpoint's signing secret sealed by an old key again with
    /// `webhooks.sealing_key`, so that the old key can go (docs/webhooks.md, "Replacing the
    /// sealing key").
    Reseal,
}

#[derive(Debug, Subcommand)]
enum AccountsCommand {
    /// Create an account and its first secret key; prints the key (shown only this once).
    Create {
        /// A name for people.
        #[arg(long)]
        name: String,
    },
    /// Vouch for an email address as the account's own: test-mode receipts go only to these.
    VerifyEmail {
        /// The account, `acct_…`.
        #[arg(long)]
        account: AccountId,
        /// The address.
        #[arg(long)]
        email: String,
    },
    /// Forget a verified address of the account: receipts to it are withheld from then on.
    ForgetEmail {
        /// The account, `acct_…`.
        #[arg(long)]
        account: AccountId,
        /// The address.
        #[arg(long)]
        email: String,
    },
    /// List the account's verified addresses, one a line on standard output.
    Emails {
        /// The account, `acct_…`.
        #[arg(long)]
        account: AccountId,
    },
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Issue another secret key for an account; prints the key (shown only this once).
    Create {
        /// The account, `acct_…`.
        #[arg(long)]
        account: AccountId,
    },
    /// Revoke a key by its id (`key_…`); requests with it are refused from now on.
    Revoke {
        /// The key's id, `key_…` (not the secret).
        key_id: ApiKeyId,
    },
    /// List idempotency keys that wait for a person (flagged by the worker), oldest first.
    Stuck {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Runs the command the arguments name.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let settings = Settings::load()?;
    telemetry::init(&settings.log);
    match cli.command {
        Command::Serve => {
            let application = Application::build(settings).await?;
            tracing::info!(address = %application.local_addr()?, "payments-api listening");
            application.run_until_stopped().await
        }
        Command::Migrate => {
            create_database_if_missing(&settings).await?;
            migrate(&settings).await?;
            let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
            eprintln!("migrations applied; schema version {latest}");
            Ok(())
        }
        Command::Accounts(AccountsCommand::Create { name }) => {
            let pool = connect(&settings).await?;
            let (account, key, secret) = accounts::create_account(&pool, &name).await?;
            eprintln!("created account {} ({}) with key {}", account.id, account.name, key.id);
            println!("{}", secret.expose());
            Ok(())
        }
        Command::Accounts(AccountsCommand::VerifyEmail { account, email }) => {
            let pool = connect(&settings).await?;
            accounts::verify_email(&pool, &account, &email).await?;
            eprintln!("{email} is a verified address of account {account}");
            Ok(())
        }
        Command::Accounts(AccountsCommand::ForgetEmail { account, email }) => {
            let pool = connect(&settings).await?;
            accounts::forget_email(&pool, &account, &email).await?;
            eprintln!("{email} is no longer a verified address of account {account}");
            Ok(())
        }
        Command::Accounts(AccountsCommand::Emails { account }) => {
            let pool = connect(&settings).await?;
            for email in accounts::verified_emails(&pool, &account).await? {
                println!("{email}");
            }
            Ok(())
        }
        Command::Keys(KeysCommand::Create { account }) => {
            let pool = connect(&settings).await?;
            let (key, secret) = accounts::create_key(&pool, &account).await?;
            eprintln!("created key {} for account {}", key.id, key.account_id);
            println!("{}", secret.expose());
            Ok(())
        }
        Command::Keys(KeysCommand::Stuck { limit, json }) => {
            let pool = connect(&settings).await?;
            let stuck = idem::stuck_keys(&pool, limit).await?;
            if json {
                for key in &stuck {
                    println!("{}", serde_json::to_string(key)?);
                }
            } else {
                println!(
                    "{:<8} {:<30} {:<24} {:<18} {:<17} {:>8} {:>9}  last error",
                    "id", "account", "key", "operation", "recovery point", "attempts", "age (s)"
                );
                for key in &stuck {
                    println!(
                        "{:<8} {:<30} {:<24} {:<18} {:<17} {:>8} {:>9}  {}",
                        key.id,
                        key.account_id,
                        key.idempotency_key,
                        key.operation,
                        key.recovery_point,
                        key.attempts,
                        key.age_seconds,
                        key.last_error.as_deref().unwrap_or("-")
                    );
                }
            }
            eprintln!("{} key(s) wait for a person", stuck.len());
            Ok(())
        }
        Command::Keys(KeysCommand::Revoke { key_id }) => {
            let pool = connect(&settings).await?;
            accounts::revoke_key(&pool, &key_id).await?;
            eprintln!("revoked key {key_id}");
            Ok(())
        }
        Command::Webhooks(WebhooksCommand::Reseal) => {
            let keys = settings.sealing_keys()?;
            let keys = SealingKeys::new(keys.current.0, keys.old.iter().map(|k| k.0));
            let pool = connect(&settings).await?;
            let resealed = webhooks::reseal(&pool, &keys, RESEAL_BATCH).await?;
            eprintln!("sealed {resealed} signing secret(s) again with key {}", keys.current_id());
            Ok(())
        }
    }
}

/// Endpoints sealed again per transaction by `webhooks reseal`.
const RESEAL_BATCH: i64 = 500;

/// A fresh server has no `payments` database yet; `migrate` makes it, as `make run` expects.
async fn create_database_if_missing(settings: &Settings) -> anyhow::Result<()> {
    use sqlx::migrate::MigrateDatabase;
    let url = settings.database.url.expose_secret();
    if !sqlx::Postgres::database_exists(url).await.map_err(|err| {
        anyhow::anyhow!("cannot connect to the database (database.url / DATABASE_URL): {err}")
    })? {
        sqlx::Postgres::create_database(url).await?;
        let name = settings.database.connect_options()?.get_database().unwrap_or("").to_owned();
        eprintln!("created database {name}");
    }
    Ok(())
}

/// The advisory lock `migrate` takes before sqlx's migrator takes its own (any number that is
/// not sqlx's: it derives its key from the database's name).
const MIGRATE_TURN_LOCK: i64 = 0x7061_796d_656e_7473; // "payments"

/// How often a `migrate` waiting for another one's turn to end asks again.
const MIGRATE_TURN_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Applies the migrations not applied yet, on one connection of its own:
/// - with no `statement_timeout`: an index built `CONCURRENTLY` (outside a transaction, in a
///   `-- no-transaction` migration) scans the table twice and waits for every older snapshot,
///   which can take far longer than a request's statement may, and a build cut short leaves an
///   INVALID index behind; a migration that locks a live table bounds its own lock waits
///   (`SET LOCAL lock_timeout`);
/// - one `migrate` at a time, waiting its turn by asking for a lock without waiting on it:
///   sqlx's migrator waits for its own lock inside a statement, whose snapshot a concurrent
///   index build of the migrator holding it would wait for, a deadlock Postgres breaks by
///   cancelling one of them, possibly the build. Between two asks this waiter holds no
///   snapshot, so the build never waits for it.
async fn migrate(settings: &Settings) -> anyhow::Result<()> {
    use sqlx::Connection as _;
    let options = settings.database.connect_options()?.options([("statement_timeout", "0")]);
    let mut conn = sqlx::PgConnection::connect_with(&options).await.map_err(|err| {
        anyhow::anyhow!("cannot connect to the database (database.url / DATABASE_URL): {err}")
    })?;
    let mut said = false;
    while !sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1)")
        .bind(MIGRATE_TURN_LOCK)
        .fetch_one(&mut conn)
        .await?
    {
        if !said {
            eprintln!("another migrate is running; waiting for it to end");
            said = true;
        }
        tokio::time::sleep(MIGRATE_TURN_POLL).await;
    }
    let applied = MIGRATOR.run(&mut conn).await;
    // Closing the session releases the lock too; this says so at once.
    let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(MIGRATE_TURN_LOCK)
        .execute(&mut conn)
        .await;
    applied?;
    conn.close().await?;
    Ok(())
}

async fn connect(settings: &Settings) -> anyhow::Result<sqlx::PgPool> {
    let pool = app::pool(settings)?;
    // Fail with a clear message instead of on the first query.
    pool.acquire().await.map_err(|err| {
        anyhow::anyhow!("cannot connect to the database (database.url / DATABASE_URL): {err}")
    })?;
    Ok(pool)
}
