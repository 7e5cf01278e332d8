//! The checks every setting passes at start-up, each error naming the setting and the
//! environment variable that sets it.

use std::str::FromStr;

use crate::{ENV_PREFIX, ExposeSecret as _, INSPECTOR_TOKEN_MIN_CHARS, Settings, SettingsError};

impl Settings {
    /// Every check, the first failure returned.
    pub(crate) fn validate(&self) -> Result<(), SettingsError> {
        if !self.http.public_base_url.is_empty() {
            check_base_url(&self.http.public_base_url)
                .map_err(|reason| invalid("http.public_base_url", reason))?;
        }
        if self.http.admin_port != 0
            && self.http.admin_port == self.http.port
            && self.http.admin_host == self.http.host
        {
            return Err(invalid(
                "http.admin_port",
                "must differ from http.port: the admin listener is a listener of its own".into(),
            ));
        }
        if self.http.body_limit_bytes == 0 {
            return Err(invalid("http.body_limit_bytes", "must be at least 1".into()));
        }
        let is_postgres_url = ["postgres://", "postgresql://"]
            .iter()
            .any(|scheme| self.database.url.expose_secret().starts_with(scheme));
        if !is_postgres_url || self.database.connect_options().is_err() {
            // The URL itself is not repeated: it may hold a password.
            return Err(invalid("database.url", "not a valid postgres:// URL".into()));
        }
        if self.http.max_header_bytes < 1024 {
            return Err(invalid("http.max_header_bytes", "must be at least 1024".into()));
        }
        for (setting, value) in [
            ("http.header_read_timeout_ms", self.http.header_read_timeout_ms),
            ("http.idle_timeout_ms", self.http.idle_timeout_ms),
            ("http.write_timeout_ms", self.http.write_timeout_ms),
            ("http.body_timeout_ms", self.http.body_timeout_ms),
            ("http.body_deadline_ms", self.http.body_deadline_ms),
            ("http.request_timeout_ms", self.http.request_timeout_ms),
            ("http.max_connections", u64::from(self.http.max_connections)),
            ("http.max_connections_per_source", u64::from(self.http.max_connections_per_source)),
            ("http.max_in_flight_requests", u64::from(self.http.max_in_flight_requests)),
        ] {
            if value == 0 {
                return Err(invalid(setting, "must be at least 1".into()));
            }
        }
        if self.rate_limit.anonymous_per_second > 0 && self.rate_limit.anonymous_burst == 0 {
            return Err(invalid(
                "rate_limit.anonymous_burst",
                "must be at least 1 when a rate is set".into(),
            ));
        }
        if self.rate_limit.per_address_per_second > 0 && self.rate_limit.per_address_burst == 0 {
            return Err(invalid(
                "rate_limit.per_address_burst",
                "must be at least 1 when a rate is set".into(),
            ));
        }
        if self.database.max_connections == 0 {
            return Err(invalid("database.max_connections", "must be at least 1".into()));
        }
        if self.database.acquire_timeout_ms == 0 {
            return Err(invalid("database.acquire_timeout_ms", "must be at least 1".into()));
        }
        if self.rate_limit.per_second > 0 && self.rate_limit.burst == 0 {
            return Err(invalid(
                "rate_limit.burst",
                "must be at least 1 when a rate is set".into(),
            ));
        }
        if self.idempotency.lease_ms < 1000 {
            return Err(invalid("idempotency.lease_ms", "must be at least 1000".into()));
        }
        check_base_url(&self.processor.base_url)
            .map_err(|reason| invalid("processor.base_url", reason))?;
        if self.processor.api_key.expose_secret().is_empty() {
            return Err(invalid("processor.api_key", "must not be empty".into()));
        }
        if self.processor.request_timeout_ms == 0 || self.processor.connect_timeout_ms == 0 {
            return Err(invalid(
                "processor.request_timeout_ms",
                "timeouts must be at least 1 ms".into(),
            ));
        }
        // The lease must outlive the longest processor call, or a slow call would let another
        // process take the key over while this one still waits.
        let longest = self.processor.client_config().longest_call();
        self.engine_config()
            .check_lease_covers(longest)
            .map_err(|reason| invalid("idempotency.lease_ms", reason))?;
        // Without kept connections, a new payment's last phase tries its one statement on the
        // pool, bounded only by the pool's statement_timeout, before its general phase holds the
        // key: the lease must cover that too.
        if self.idempotency.fast_path && self.idempotency.phase_connections == 0 {
            let statement = std::time::Duration::from_millis(self.database.statement_timeout_ms);
            if statement.is_zero() {
                return Err(invalid(
                    "database.statement_timeout_ms",
                    "must be set when idempotency.fast_path runs its phases on the pool \
                     (idempotency.phase_connections = 0)"
                        .into(),
                ));
            }
            self.engine_config()
                .check_lease_covers(longest + statement)
                .map_err(|reason| invalid("idempotency.lease_ms", reason))?;
        }
        let version = self.processor.stripe_version.trim();
        if !(version.is_empty() || is_dated_version(version)) {
            return Err(invalid(
                "processor.stripe_version",
                "must be a dated API version, `YYYY-MM-DD` with an optional `.name` (e.g. \
                 `2026-10-28.endive`), or empty to take the account's default"
                    .into(),
            ));
        }
        // Stripe's own limits on metadata: a charge form the processor refuses would fail every
        // payment with a 400 that blames the client.
        let metadata = &self.processor.charge_metadata;
        if metadata.len() > 49
            || metadata.iter().any(|(name, value)| {
                name.is_empty()
                    || name.chars().count() > 40
                    || name.contains(['[', ']'])
                    || name == "payment_id"
                    || value.chars().count() > 500
            })
        {
            return Err(invalid(
                "processor.charge_metadata",
                "at most 49 members beside payment_id, names of 1 to 40 characters without `[` \
                 or `]`, values of at most 500 characters"
                    .into(),
            ));
        }
        let webhook_secret = self.processor.webhook_secret.expose_secret();
        let looks_like_a_secret =
            webhook_secret.starts_with("whsec_") && webhook_secret.len() >= 12;
        if !(webhook_secret.is_empty() || looks_like_a_secret) {
            return Err(invalid(
                "processor.webhook_secret",
                "must be the processor's endpoint secret, `whsec_…`, or empty to turn inbound \
                 webhooks off"
                    .into(),
            ));
        }
        let processor = &self.processor;
        if processor.authentication_check_after_s == 0
            || processor.authentication_expires_after_s < processor.authentication_check_after_s
        {
            return Err(invalid(
                "processor.authentication_check_after_s",
                "must be at least 1, and at most processor.authentication_expires_after_s".into(),
            ));
        }
        let return_url = processor.return_url.trim();
        if !return_url.is_empty()
            && !return_url.starts_with("https://")
            && !return_url.starts_with("http://")
        {
            return Err(invalid("processor.return_url", "must be an http(s) URL".into()));
        }
        if self.processor.webhook_tolerance_s == 0 || self.processor.webhook_tolerance_s > 3600 {
            return Err(invalid("processor.webhook_tolerance_s", "must be from 1 to 3600".into()));
        }
        if self.processor.webhook_max_unverified == 0 {
            return Err(invalid("processor.webhook_max_unverified", "must be at least 1".into()));
        }
        if self.worker.batch_size == 0 || self.worker.batch_size > 10_000 {
            return Err(invalid("worker.batch_size", "must be from 1 to 10000".into()));
        }
        if self.worker.interval_ms == 0 {
            return Err(invalid("worker.interval_ms", "must be at least 1".into()));
        }
        if self.worker.processor_window_hours == 0 || self.worker.processor_window_hours >= 24 {
            return Err(invalid(
                "worker.processor_window_hours",
                "must be from 1 to 23: the processor keeps its idempotency keys for 24 hours"
                    .into(),
            ));
        }
        if self.worker.max_attempts == 0 || self.worker.job_max_attempts == 0 {
            return Err(invalid("worker.max_attempts", "attempt bounds must be at least 1".into()));
        }
        let webhooks = &self.webhooks;
        for (setting, value) in [
            ("webhooks.timeout_ms", webhooks.timeout_ms),
            ("webhooks.connect_timeout_ms", webhooks.connect_timeout_ms),
            ("webhooks.max_deliveries", u64::from(webhooks.max_deliveries)),
            ("webhooks.max_deliveries_per_account", u64::from(webhooks.max_deliveries_per_account)),
            (
                "webhooks.max_deliveries_per_endpoint",
                u64::from(webhooks.max_deliveries_per_endpoint),
            ),
            ("webhooks.pause_after_failures", u64::from(webhooks.pause_after_failures)),
            ("webhooks.pause_ms", webhooks.pause_ms),
            ("webhooks.disable_after_hours", u64::from(webhooks.disable_after_hours)),
        ] {
            if value == 0 {
                return Err(invalid(setting, "must be at least 1".into()));
            }
        }
        if webhooks.max_deliveries > 1024 {
            return Err(invalid("webhooks.max_deliveries", "must be at most 1024".into()));
        }
        if self.worker.receipts_per_account_per_hour == 0 {
            return Err(invalid(
                "worker.receipts_per_account_per_hour",
                "must be at least 1 (a receipt beyond it is recorded, not sent)".into(),
            ));
        }
        let smtp_url = self.worker.smtp_url.expose_secret();
        if !smtp_url.is_empty() && !["smtp://", "smtps://"].iter().any(|s| smtp_url.starts_with(s))
        {
            return Err(invalid("worker.smtp_url", "must start with smtp:// or smtps://".into()));
        }
        let token = self.inspector.token.expose_secret();
        if !token.chars().all(|c| c.is_ascii_alphanumeric() || "-_.~".contains(c)) {
            return Err(invalid(
                "inspector.token",
                "may hold only letters, digits, `-`, `_`, `.` and `~` (it travels in a form and a \
                 header)"
                    .into(),
            ));
        }
        if self.inspector.enabled && token.chars().count() < INSPECTOR_TOKEN_MIN_CHARS {
            return Err(invalid(
                "inspector.token",
                format!(
                    "must be at least {INSPECTOR_TOKEN_MIN_CHARS} characters when the inspector is \
                     enabled (make run generates one)"
                ),
            ));
        }
        let docs = &self.inspector.docs_base_url;
        if !docs.is_empty() && !["http://", "https://"].iter().any(|s| docs.starts_with(s)) {
            return Err(invalid(
                "inspector.docs_base_url",
                "must be empty or start with http:// or https:// (the page links to it)".into(),
            ));
        }
        // Written wrong is refused by every command; missing, only by those that need the keys
        // (`Settings::sealing_keys`).
        if let Err((setting, reason)) = self.webhooks.read_sealing_keys() {
            return Err(invalid(setting, reason));
        }
        if self.idempotency.claim_timeout_ms == 0 {
            return Err(invalid("idempotency.claim_timeout_ms", "must be at least 1".into()));
        }
        if self.idempotency.claim_connections > 256 {
            return Err(invalid("idempotency.claim_connections", "must be at most 256".into()));
        }
        if self.idempotency.answer_memory_bytes > 1 << 30 {
            return Err(invalid("idempotency.answer_memory_bytes", "must be at most 1 GiB".into()));
        }
        if self.idempotency.phase_connections > 256 {
            return Err(invalid("idempotency.phase_connections", "must be at most 256".into()));
        }
        if self.idempotency.retention_hours == 0 {
            return Err(invalid("idempotency.retention_hours", "must be at least 1".into()));
        }
        self.retention.check(self)?;
        tracing_subscriber::EnvFilter::try_new(&self.log.filter)
            .map_err(|e| invalid("log.filter", e.to_string()))?;
        Ok(())
    }
}

pub(crate) fn invalid(setting: &'static str, reason: String) -> SettingsError {
    let env = if setting == "database.url" {
        "DATABASE_URL or PAYMENTS__DATABASE__URL".to_owned()
    } else {
        format!("{ENV_PREFIX}__{}", setting.replace('.', "__").to_uppercase())
    };
    SettingsError::Invalid { setting, env, reason }
}

fn check_base_url(url: &str) -> Result<(), String> {
    let uri = http::Uri::from_str(url).map_err(|e| format!("not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err("must start with http:// or https://".into()),
    }
    if uri.authority().is_none() {
        return Err("must name a host".into());
    }
    if uri.query().is_some() {
        return Err("must not have a query string".into());
    }
    Ok(())
}

/// Whether `version` is a dated API version as Stripe names them: `YYYY-MM-DD`, a real month and
/// day, then optionally `.` and a lower-case release name (`2026-10-28.endive`).
fn is_dated_version(version: &str) -> bool {
    let (date, name) = match version.split_once('.') {
        Some((date, name)) => (date, Some(name)),
        None => (version, None),
    };
    let name_ok = name.is_none_or(|name| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_')
    });
    let parts: Vec<&str> = date.split('-').collect();
    let number = |part: &str, digits: usize, range: std::ops::RangeInclusive<u32>| {
        part.len() == digits
            && part.chars().all(|c| c.is_ascii_digit())
            && part.parse::<u32>().is_ok_and(|n| range.contains(&n))
    };
    name_ok
        && matches!(parts.as_slice(), [year, month, day]
            if number(year, 4, 2011..=9999) && number(month, 2, 1..=12) && number(day, 2, 1..=31))
}
