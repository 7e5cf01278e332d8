//! Accounts (tenants), their secret API keys, and their verified email addresses (where a
//! test-mode receipt may go).
//!
//! A secret key is `sk_test_` followed by 32 random alphanumeric characters (about 190 bits from
//! the operating system's generator). It is returned once, when it is created; the database keeps
//! only its SHA-256 digest and its last four characters. Authentication hashes the presented key
//! and looks the digest up: one indexed read, and nothing in the database can be replayed as a key.

use std::fmt;

use rand::Rng;
use rand::distributions::Alphanumeric;
use sha2::{Digest, Sha256};
use sqlx::PgExecutor;

use crate::DomainError;
pub use crate::ids::{AccountId, ApiKeyId};
use crate::text::{self, Lines};

/// The prefix of every secret key this server issues (test mode only, for now).
pub const SECRET_KEY_PREFIX: &str = "sk_test_";
/// Random characters after the prefix.
const SECRET_KEY_RANDOM_CHARS: usize = 32;
/// The longest account name accepted (the database checks it too).
pub const ACCOUNT_NAME_MAX_CHARS: usize = 200;

/// A plaintext secret key. It exists only between its creation and the moment it is shown, and
/// it never prints through `Debug`, so it cannot end up in a log by accident.
pub struct SecretKey(String);

impl SecretKey {
    /// Generates a fresh key from the operating system's random source.
    pub fn generate() -> Self {
        let mut key = String::with_capacity(SECRET_KEY_PREFIX.len() + SECRET_KEY_RANDOM_CHARS);
        key.push_str(SECRET_KEY_PREFIX);
        key.extend(
            rand::rngs::OsRng
                .sample_iter(&Alphanumeric)
                .take(SECRET_KEY_RANDOM_CHARS)
                .map(char::from),
        );
        Self(key)
    }

    /// The plaintext, for showing to the operator exactly once.
    pub fn expose(&self) -> &str {
        &self.0
    }

    fn last4(&self) -> &str {
        &self.0[self.0.len() - 4..]
    }
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretKey({SECRET_KEY_PREFIX}…{})", self.last4())
    }
}

/// The digest stored for a key and looked up on every request.
pub fn key_digest(presented: &str) -> [u8; 32] {
    Sha256::digest(presented.as_bytes()).into()
}

/// An account as an operator sees it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Account {
    /// `acct_…`
    pub id: AccountId,
    /// A name for people.
    pub name: String,
}

/// A key as an operator sees it: never the secret.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ApiKey {
    /// `key_…`
    pub id: ApiKeyId,
    /// The account the key acts for.
    pub account_id: AccountId,
    /// The secret's last four characters.
    pub last4: String,
}

/// Creates an account and its first secret key in one transaction.
pub async fn create_account(
    pool: &sqlx::PgPool,
    name: &str,
) -> Result<(Account, ApiKey, SecretKey), DomainError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > ACCOUNT_NAME_MAX_CHARS {
        return Err(DomainError::Invalid {
            param: "name",
            message: format!("an account name is 1 to {ACCOUNT_NAME_MAX_CHARS} characters"),
        });
    }
    text::check("name", name, Lines::Refused)?;
    let account = Account { id: AccountId::generate(), name: name.to_owned() };
    let mut tx = pool.begin().await?;
    sqlx::query!(
        "INSERT INTO accounts (id, name) VALUES ($1, $2)",
        &account.id as &AccountId,
        account.name
    )
    .execute(&mut *tx)
    .await?;
    let (key, secret) = insert_key(&mut *tx, &account.id).await?;
    tx.commit().await?;
    Ok((account, key, secret))
}

/// Issues another secret key for an existing account.
pub async fn create_key(
    executor: impl PgExecutor<'_> + Copy,
    account_id: &AccountId,
) -> Result<(ApiKey, SecretKey), DomainError> {
    let account = sqlx::query_scalar!(
        r#"SELECT id AS "id: AccountId" FROM accounts WHERE id = $1"#,
        account_id as &AccountId
    )
    .fetch_optional(executor)
    .await?
    .ok_or(DomainError::NotFound("account"))?;
    insert_key(executor, &account).await
}

async fn insert_key(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
) -> Result<(ApiKey, SecretKey), DomainError> {
    let secret = SecretKey::generate();
    let key = ApiKey {
        id: ApiKeyId::generate(),
        account_id: account_id.clone(),
        last4: secret.last4().to_owned(),
    };
    sqlx::query!(
        "INSERT INTO api_keys (id, account_id, key_hash, last4) VALUES ($1, $2, $3, $4)",
        &key.id as &ApiKeyId,
        account_id as &AccountId,
        &key_digest(secret.expose())[..],
        key.last4,
    )
    .execute(executor)
    .await?;
    Ok((key, secret))
}

/// Revokes a key at once; requests that present it afterwards are refused. Revoking a revoked
/// key is not an error, and keeps the first revocation time.
pub async fn revoke_key(
    executor: impl PgExecutor<'_>,
    key_id: &ApiKeyId,
) -> Result<(), DomainError> {
    let found = sqlx::query_scalar!(
        "UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1 RETURNING id",
        key_id as &ApiKeyId
    )
    .fetch_optional(executor)
    .await?;
    found.map(drop).ok_or(DomainError::NotFound("api key"))
}

/// The account a presented secret key acts for, if the key exists and is not revoked.
pub async fn authenticate(
    executor: impl PgExecutor<'_>,
    presented: &str,
) -> Result<Option<AccountId>, DomainError> {
    authenticate_digest(executor, &key_digest(presented)).await
}

/// `authenticate`, for a key already digested (`key_digest`).
pub async fn authenticate_digest(
    executor: impl PgExecutor<'_>,
    digest: &[u8; 32],
) -> Result<Option<AccountId>, DomainError> {
    let account = sqlx::query_scalar!(
        r#"SELECT account_id AS "account_id: AccountId" FROM api_keys
            WHERE key_hash = $1 AND revoked_at IS NULL"#,
        &digest[..]
    )
    .fetch_optional(executor)
    .await?;
    Ok(account)
}

/// The first `limit` accounts by name (then id), for an operator's overview.
pub async fn first_by_name(
    executor: impl PgExecutor<'_>,
    limit: i64,
) -> Result<Vec<Account>, DomainError> {
    let accounts = sqlx::query_as!(
        Account,
        r#"SELECT id AS "id: AccountId", name FROM accounts ORDER BY name, id LIMIT $1"#,
        limit
    )
    .fetch_all(executor)
    .await?;
    Ok(accounts)
}

/// The name of account `id`, if it exists.
pub async fn name(
    executor: impl PgExecutor<'_>,
    id: &AccountId,
) -> Result<Option<String>, DomainError> {
    let name = sqlx::query_scalar!("SELECT name FROM accounts WHERE id = $1", id as &AccountId)
        .fetch_optional(executor)
        .await?;
    Ok(name)
}

/// Records `email` as a verified address of account `account_id`: the operator vouches for it
/// (`payments-api accounts verify-email`). A test-mode receipt goes only to such an address
/// ([`crate::receipts`]). Stored lower case; verifying an address again is not an error.
pub async fn verify_email(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
    email: &str,
) -> Result<(), DomainError> {
    crate::payments::validate_email("email", email)?;
    let inserted = sqlx::query!(
        "INSERT INTO verified_emails (account_id, email) VALUES ($1, lower($2))
         ON CONFLICT (account_id, email) DO NOTHING",
        account_id as &AccountId,
        email,
    )
    .execute(executor)
    .await;
    match inserted {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(err)) if err.is_foreign_key_violation() => {
            Err(DomainError::NotFound("account"))
        }
        Err(err) => Err(err.into()),
    }
}

/// Forgets a verified address of an account: receipts to it are withheld from then on.
pub async fn forget_email(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
    email: &str,
) -> Result<(), DomainError> {
    let forgotten = sqlx::query!(
        "DELETE FROM verified_emails WHERE account_id = $1 AND email = lower($2)",
        account_id as &AccountId,
        email,
    )
    .execute(executor)
    .await?
    .rows_affected();
    if forgotten == 0 {
        return Err(DomainError::NotFound("verified email of the account"));
    }
    Ok(())
}

/// The verified addresses of an account, in order.
pub async fn verified_emails(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
) -> Result<Vec<String>, DomainError> {
    let emails = sqlx::query_scalar!(
        "SELECT email FROM verified_emails WHERE account_id = $1 ORDER BY email",
        account_id as &AccountId
    )
    .fetch_all(executor)
    .await?;
    Ok(emails)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_keys_have_the_prefix_and_enough_randomness() {
        let key = SecretKey::generate();
        let random = &key.expose()[SECRET_KEY_PREFIX.len()..];
        assert!(key.expose().starts_with(SECRET_KEY_PREFIX));
        assert_eq!(random.len(), SECRET_KEY_RANDOM_CHARS);
        // 62 symbols per character: log2(62) * 32 ≈ 190 bits, well above the 128 required.
        assert!((62f64).log2() * random.len() as f64 >= 128.0);
        assert_ne!(key.expose(), SecretKey::generate().expose());
    }

    #[test]
    fn a_secret_key_never_prints_in_debug() {
        let key = SecretKey::generate();
        let printed = format!("{key:?}");
        assert!(
            !printed.contains(&key.expose()[SECRET_KEY_PREFIX.len()..SECRET_KEY_PREFIX.len() + 8])
        );
        assert!(printed.ends_with(&format!("{})", key.last4())));
    }

    #[tokio::test]
    async fn an_account_name_with_a_control_or_format_character_is_refused() {
        // Refused before any statement: the pool never connects.
        let pool = sqlx::PgPool::connect_lazy("postgres://nobody@127.0.0.1:1/none").unwrap();
        for name in ["Shop\u{0}", "Shop\u{1b}[31m", "Sh\u{200b}op", "\u{202e}pohS"] {
            let refused = create_account(&pool, name).await;
            assert!(matches!(refused, Err(DomainError::Invalid { param: "name", .. })), "{name:?}");
        }
    }

    #[test]
    fn the_digest_is_sha256_of_the_whole_key() {
        // SHA-256("abc"), from FIPS 180-2.
        assert_eq!(key_digest("abc")[..4], [0xba, 0x78, 0x16, 0xbf],);
    }
}
