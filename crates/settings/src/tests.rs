//! The settings as an operator meets them: defaults, overrides, and errors that name the
//! setting.

use super::*;

fn load(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    Settings::load_from(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

#[test]
fn the_inspector_needs_a_long_plain_token_when_enabled() {
    let on = ("PAYMENTS__INSPECTOR__ENABLED", "true");
    let refused = |vars: &[(&str, &str)]| match load(vars) {
        Err(err) => err.to_string(),
        Ok(_) => String::new(),
    };
    assert!(refused(&[on]).contains("PAYMENTS__INSPECTOR__TOKEN"));
    assert!(refused(&[on, ("PAYMENTS__INSPECTOR__TOKEN", "short")]).contains("16"));
    let spaced = refused(&[on, ("PAYMENTS__INSPECTOR__TOKEN", "a token; with spaces")]);
    assert!(spaced.contains("letters, digits"), "{spaced}");
    assert!(load(&[on, ("PAYMENTS__INSPECTOR__TOKEN", "0123456789abcdef-_.~")]).is_ok());
    assert!(load(&[]).is_ok_and(|s| !s.inspector.enabled));
}

#[test]
fn charge_metadata_is_read_from_the_environment_and_held_to_the_processors_limits() {
    let settings = load(&[("PAYMENTS__PROCESSOR__CHARGE_METADATA__RELEASE", "0042")]).unwrap();
    assert_eq!(settings.processor.charge_metadata.get("release").map(String::as_str), Some("0042"));
    for (name, value) in [
        ("PAYMENTS__PROCESSOR__CHARGE_METADATA__PAYMENT_ID", "x"),
        ("PAYMENTS__PROCESSOR__CHARGE_METADATA__A", &"v".repeat(501)),
    ] {
        let err = load(&[(name, value)]).unwrap_err().to_string();
        assert!(err.contains("processor.charge_metadata"), "{err}");
    }
}

#[test]
fn the_defaults_load_and_validate() {
    let settings = load(&[]).unwrap();
    assert_eq!(settings.http.port, 8080);
    assert_eq!(settings.log.format, LogFormat::Pretty);
    assert_eq!(settings.public_base_url(8080), "http://127.0.0.1:8080");
}

#[test]
fn environment_variables_override_the_defaults() {
    let settings = load(&[
        ("PAYMENTS__HTTP__PORT", "9191"),
        ("PAYMENTS__HTTP__PUBLIC_BASE_URL", "https://pay.example.com/"),
        ("PAYMENTS__LOG__FORMAT", "json"),
        ("DATABASE_URL", "postgres://u@db:5432/x"),
    ])
    .unwrap();
    assert_eq!(settings.http.port, 9191);
    assert_eq!(settings.public_base_url(9191), "https://pay.example.com");
    assert_eq!(settings.log.format, LogFormat::Json);
    assert_eq!(settings.database.url.expose_secret(), "postgres://u@db:5432/x");
}

#[test]
fn the_admin_listener_is_on_loopback_and_a_port_of_its_own() {
    let settings = load(&[]).unwrap();
    assert_eq!((settings.http.admin_host.as_str(), settings.http.admin_port), ("127.0.0.1", 8081));
    let err = load(&[("PAYMENTS__HTTP__ADMIN_PORT", "8080")]).unwrap_err().to_string();
    assert!(err.contains("http.admin_port") && err.contains("PAYMENTS__HTTP__ADMIN_PORT"), "{err}");
    let elsewhere = [("PAYMENTS__HTTP__ADMIN_PORT", "8080"), ("PAYMENTS__HTTP__ADMIN_HOST", "::1")];
    assert!(load(&elsewhere).is_ok(), "another address may share the port number");
    assert!(load(&[("PAYMENTS__HTTP__PORT", "0"), ("PAYMENTS__HTTP__ADMIN_PORT", "0")]).is_ok());
}

#[test]
fn a_port_that_is_not_a_number_names_the_setting() {
    let err = load(&[("PAYMENTS__HTTP__PORT", "eighty")]).unwrap_err().to_string();
    assert!(err.contains("http.port"), "{err}");
}

#[test]
fn a_port_out_of_range_names_the_setting() {
    let err = load(&[("PAYMENTS__HTTP__PORT", "70000")]).unwrap_err().to_string();
    assert!(err.contains("http.port"), "{err}");
}

#[test]
fn a_bad_public_base_url_names_the_setting_and_its_variable() {
    let err = load(&[("PAYMENTS__HTTP__PUBLIC_BASE_URL", "ftp://x")]).unwrap_err().to_string();
    assert!(err.contains("http.public_base_url"), "{err}");
    assert!(err.contains("PAYMENTS__HTTP__PUBLIC_BASE_URL"), "{err}");
}

#[test]
fn the_guides_base_url_is_a_web_address_or_nothing() {
    let var = "PAYMENTS__INSPECTOR__DOCS_BASE_URL";
    let err = load(&[(var, "javascript:alert(1)")]).unwrap_err().to_string();
    assert!(err.contains("inspector.docs_base_url") && err.contains(var), "{err}");
    let set = load(&[(var, "https://example.com/payments/blob/main")]).unwrap();
    assert_eq!(set.inspector.docs_base_url, "https://example.com/payments/blob/main");
    assert!(load(&[]).is_ok_and(|s| s.inspector.docs_base_url.is_empty()));
}

#[test]
fn a_bad_database_url_names_the_setting_without_printing_it() {
    let err = load(&[("DATABASE_URL", "mysql://root:hunter2@db")]).unwrap_err().to_string();
    assert!(err.contains("database.url"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn an_unknown_log_format_names_the_setting() {
    let err = load(&[("PAYMENTS__LOG__FORMAT", "xml")]).unwrap_err().to_string();
    assert!(err.contains("log.format"), "{err}");
}

#[test]
fn an_unknown_setting_is_refused_by_name() {
    let err = load(&[("PAYMENTS__HTTP__PROT", "1")]).unwrap_err().to_string();
    assert!(err.contains("prot"), "{err}");
}

#[test]
fn a_lease_shorter_than_the_longest_processor_call_is_refused() {
    let err =
        load(&[("PAYMENTS__PROCESSOR__REQUEST_TIMEOUT_MS", "30000")]).unwrap_err().to_string();
    assert!(err.contains("idempotency.lease_ms"), "{err}");
    assert!(
        load(&[
            ("PAYMENTS__PROCESSOR__REQUEST_TIMEOUT_MS", "30000"),
            ("PAYMENTS__IDEMPOTENCY__LEASE_MS", "200000"),
        ])
        .is_ok()
    );
}

#[test]
fn without_kept_phase_connections_the_lease_also_covers_a_statement_on_the_pool() {
    let pooled = ("PAYMENTS__IDEMPOTENCY__PHASE_CONNECTIONS", "0");
    let err = load(&[pooled]).unwrap_err().to_string();
    assert!(err.contains("idempotency.lease_ms"), "{err}");
    assert!(load(&[pooled, ("PAYMENTS__IDEMPOTENCY__LEASE_MS", "90000")]).is_ok());
    let unbounded = ("PAYMENTS__DATABASE__STATEMENT_TIMEOUT_MS", "0");
    let err = load(&[pooled, unbounded]).unwrap_err().to_string();
    assert!(err.contains("database.statement_timeout_ms"), "{err}");
    assert!(load(&[pooled, ("PAYMENTS__IDEMPOTENCY__FAST_PATH", "false")]).is_ok());
}

#[test]
fn a_bad_processor_url_names_the_setting() {
    let err =
        load(&[("PAYMENTS__PROCESSOR__BASE_URL", "localhost:12111")]).unwrap_err().to_string();
    assert!(err.contains("processor.base_url"), "{err}");
}

#[test]
fn the_processor_is_sent_a_dated_api_version_unless_the_setting_is_empty() {
    let settings = load(&[]).unwrap();
    let sent = settings.processor.client_config().stripe_version;
    assert_eq!(sent.as_deref(), Some("2026-10-28.endive"), "the pinned Python SDK's version");
    for version in ["2024-06-20", "2026-10-28.endive", "2025-03-31.basil"] {
        let settings = load(&[("PAYMENTS__PROCESSOR__STRIPE_VERSION", version)]).unwrap();
        assert_eq!(settings.processor.client_config().stripe_version.as_deref(), Some(version));
    }
    let none = load(&[("PAYMENTS__PROCESSOR__STRIPE_VERSION", "")]).unwrap();
    assert_eq!(none.processor.client_config().stripe_version, None);
    for version in [
        "latest",
        "2024-6-20",
        "2024-13-01",
        "2024-06-32",
        "2024-06-20.",
        "2024-06-20.Basil",
        "20240620",
    ] {
        let err =
            load(&[("PAYMENTS__PROCESSOR__STRIPE_VERSION", version)]).unwrap_err().to_string();
        assert!(err.contains("processor.stripe_version"), "{version}: {err}");
        assert!(err.contains("PAYMENTS__PROCESSOR__STRIPE_VERSION"), "{version}: {err}");
    }
}

#[test]
fn secrets_never_print() {
    let settings = load(&[
        ("DATABASE_URL", "postgres://u:hunter2@db:5432/x"),
        ("PAYMENTS__PROCESSOR__API_KEY", "sk_test_swordfish"),
        ("PAYMENTS__WORKER__SMTP_URL", "smtps://mail:opensesame@smtp.example.com"),
        ("PAYMENTS__INSPECTOR__ENABLED", "true"),
        ("PAYMENTS__INSPECTOR__TOKEN", "correcthorsebatterystaple"),
        ("PAYMENTS__WEBHOOKS__SEALING_KEY", &"ab".repeat(32)),
        ("PAYMENTS__WEBHOOKS__OLD_SEALING_KEYS", &"cd".repeat(32)),
    ])
    .unwrap();
    let keys = settings.sealing_keys().unwrap();
    let printed = format!("{settings:?} {keys:?}");
    for secret in ["hunter2", "swordfish", "opensesame", "correcthorse", "abab", "cdcd", "171"] {
        assert!(!printed.contains(secret), "{secret} in {printed}");
    }
}

#[test]
fn keys_and_tokens_of_digits_survive_exactly_as_written() {
    let settings = load(&[
        ("PAYMENTS__PROCESSOR__API_KEY", "000123"),
        ("PAYMENTS__INSPECTOR__TOKEN", "0000000000000000001"),
        ("PAYMENTS__WORKER__RECEIPT_FROM", "1e3"),
        ("PAYMENTS__HTTP__PORT", "9191"),
        ("PAYMENTS__INSPECTOR__ENABLED", "true"),
    ])
    .unwrap();
    assert_eq!(settings.processor.api_key.expose_secret(), "000123");
    assert_eq!(settings.inspector.token.expose_secret(), "0000000000000000001");
    assert_eq!(settings.worker.receipt_from, "1e3");
    // Numbers and switches still read from text.
    assert_eq!(settings.http.port, 9191);
    assert!(settings.inspector.enabled);
}

#[test]
fn a_zero_body_limit_is_refused() {
    let err = load(&[("PAYMENTS__HTTP__BODY_LIMIT_BYTES", "0")]).unwrap_err().to_string();
    assert!(err.contains("http.body_limit_bytes"), "{err}");
}

#[test]
fn the_write_timeout_defaults_to_thirty_seconds_and_zero_is_refused() {
    assert_eq!(load(&[]).unwrap().http.write_timeout_ms, 30_000);
    let err = load(&[("PAYMENTS__HTTP__WRITE_TIMEOUT_MS", "0")]).unwrap_err().to_string();
    assert!(err.contains("http.write_timeout_ms"), "{err}");
    assert!(err.contains("PAYMENTS__HTTP__WRITE_TIMEOUT_MS"), "{err}");
}

#[test]
fn headers_are_bounded_at_32_kib_and_the_bound_is_at_least_1024() {
    assert_eq!(load(&[]).unwrap().http.max_header_bytes, 32_768);
    let err = load(&[("PAYMENTS__HTTP__MAX_HEADER_BYTES", "100")]).unwrap_err().to_string();
    assert!(err.contains("http.max_header_bytes"), "{err}");
}

#[test]
fn batches_are_on_by_default_and_can_be_turned_off() {
    assert!(load(&[]).is_ok_and(|s| s.idempotency.batch_phases));
    let alone = ("PAYMENTS__IDEMPOTENCY__BATCH_PHASES", "false");
    assert!(load(&[alone]).is_ok_and(|s| !s.idempotency.batch_phases));
}

#[test]
fn the_fast_path_is_on_by_default_and_can_be_turned_off() {
    assert!(load(&[]).is_ok_and(|s| s.idempotency.fast_path));
    let reference = ("PAYMENTS__IDEMPOTENCY__FAST_PATH", "false");
    assert!(load(&[reference]).is_ok_and(|s| !s.idempotency.fast_path));
}

#[test]
fn deny_ranges_are_read_from_the_environment_as_one_string_and_a_bad_one_is_named() {
    assert!(load(&[]).unwrap().webhooks.deny_ranges.is_empty());
    let settings =
        load(&[("PAYMENTS__WEBHOOKS__DENY_RANGES", "203.0.113.0/24, 2001:db8::/32 198.51.100.7")])
            .unwrap();
    let ranges: Vec<String> =
        settings.webhooks.deny_ranges.ranges().iter().map(ToString::to_string).collect();
    assert_eq!(ranges, ["203.0.113.0/24", "2001:db8::/32", "198.51.100.7/32"]);
    assert!(
        load(&[("PAYMENTS__WEBHOOKS__DENY_RANGES", "")]).unwrap().webhooks.deny_ranges.is_empty()
    );
    let err = load(&[("PAYMENTS__WEBHOOKS__DENY_RANGES", "10.0.0.0/8, intranet")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("webhooks.deny_ranges") && err.contains("`intranet`"), "{err}");
    // In a file, a list.
    let from_file: Settings = Config::builder()
        .add_source(File::from_str(DEFAULTS, FileFormat::Toml))
        .add_source(File::from_str("[webhooks]\ndeny_ranges = [\"fd00::/8\"]", FileFormat::Toml))
        .build()
        .and_then(Config::try_deserialize)
        .unwrap();
    assert_eq!(
        from_file.webhooks.deny_ranges.ranges(),
        ["fd00::/8".parse::<ipnet::IpNet>().unwrap()]
    );
}

#[test]
fn no_proxy_is_trusted_by_default_and_the_environment_lists_ranges_by_commas() {
    let settings = load(&[]).unwrap();
    assert!(settings.http.trusted_proxies.is_empty());
    assert_eq!(settings.http.forwarded_header, ForwardedHeader::XForwardedFor);
    let settings = load(&[
        ("PAYMENTS__HTTP__TRUSTED_PROXIES", "10.0.0.0/8, 2001:db8::/32,192.0.2.7"),
        ("PAYMENTS__HTTP__FORWARDED_HEADER", "forwarded"),
    ])
    .unwrap();
    let proxies = &settings.http.trusted_proxies;
    for trusted in ["10.1.2.3", "::ffff:10.1.2.3", "2001:db8:5::1", "192.0.2.7"] {
        assert!(proxies.contains(trusted.parse().unwrap()), "{trusted}");
    }
    for untrusted in ["11.0.0.1", "2001:db9::1", "192.0.2.8"] {
        assert!(!proxies.contains(untrusted.parse().unwrap()), "{untrusted}");
    }
    assert_eq!(settings.http.forwarded_header, ForwardedHeader::Forwarded);
    assert!(
        load(&[("PAYMENTS__HTTP__TRUSTED_PROXIES", "")]).unwrap().http.trusted_proxies.is_empty()
    );
}

#[test]
fn a_trusted_proxy_that_is_not_a_range_names_the_setting() {
    for bad in ["10.0.0.0/33", "lb.internal", "10.0.0.0/8,,nope"] {
        let err = load(&[("PAYMENTS__HTTP__TRUSTED_PROXIES", bad)]).unwrap_err().to_string();
        assert!(err.contains("http.trusted_proxies"), "{err}");
    }
    let err = load(&[("PAYMENTS__HTTP__FORWARDED_HEADER", "x-real-ip")]).unwrap_err().to_string();
    assert!(err.contains("forwarded_header"), "{err}");
}

#[test]
fn a_source_may_open_64_connections_by_default_and_not_none() {
    assert_eq!(load(&[]).unwrap().http.max_connections_per_source, 64);
    let var = "PAYMENTS__HTTP__MAX_CONNECTIONS_PER_SOURCE";
    let err = load(&[(var, "0")]).unwrap_err().to_string();
    assert!(err.contains("http.max_connections_per_source") && err.contains(var), "{err}");
}

#[test]
fn deliveries_run_32_at_once_8_per_account_2_per_endpoint_and_none_is_refused() {
    let webhooks = load(&[]).unwrap().webhooks;
    assert_eq!(
        (
            webhooks.max_deliveries,
            webhooks.max_deliveries_per_account,
            webhooks.max_deliveries_per_endpoint,
            webhooks.connect_timeout_ms,
        ),
        (32, 8, 2, 2000)
    );
    for setting in [
        "MAX_DELIVERIES",
        "MAX_DELIVERIES_PER_ACCOUNT",
        "MAX_DELIVERIES_PER_ENDPOINT",
        "CONNECT_TIMEOUT_MS",
        "PAUSE_AFTER_FAILURES",
        "PAUSE_MS",
        "DISABLE_AFTER_HOURS",
    ] {
        let variable = format!("PAYMENTS__WEBHOOKS__{setting}");
        let err = load(&[(&variable, "0")]).unwrap_err().to_string();
        assert!(err.contains(&variable), "{err}");
    }
    let err = load(&[("PAYMENTS__WEBHOOKS__MAX_DELIVERIES", "5000")]).unwrap_err().to_string();
    assert!(err.contains("webhooks.max_deliveries"), "{err}");
}

#[test]
fn an_account_may_have_100_receipts_sent_an_hour_by_default_and_not_none() {
    assert_eq!(load(&[]).unwrap().worker.receipts_per_account_per_hour, 100);
    let var = "PAYMENTS__WORKER__RECEIPTS_PER_ACCOUNT_PER_HOUR";
    assert_eq!(load(&[(var, "5")]).unwrap().worker.receipts_per_account_per_hour, 5);
    let err = load(&[(var, "0")]).unwrap_err().to_string();
    assert!(err.contains("worker.receipts_per_account_per_hour") && err.contains(var), "{err}");
}

#[test]
fn the_sealing_key_is_required_to_serve_and_read_as_hex_with_old_keys_after_it() {
    let var = "PAYMENTS__WEBHOOKS__SEALING_KEY";
    // Not set: the settings load (migrations and accounts need no key), serving does not.
    let unset = load(&[]).unwrap().sealing_keys().unwrap_err().to_string();
    assert!(unset.contains("webhooks.sealing_key") && unset.contains(var), "{unset}");
    let current = "00".repeat(31) + "7f";
    let old = ["11".repeat(32), "FF".repeat(32)];
    let keys = load(&[(var, &current), ("PAYMENTS__WEBHOOKS__OLD_SEALING_KEYS", &old.join(", "))])
        .unwrap()
        .sealing_keys()
        .unwrap();
    assert_eq!(keys.current.0[31], 0x7f);
    assert_eq!(keys.old, [SealingKey([0x11; 32]), SealingKey([0xff; 32])]);
    // Written wrong: refused by every command, and the text is not repeated.
    for bad in ["abc", &"zz".repeat(32), &"ab".repeat(33)] {
        let err = load(&[(var, bad)]).unwrap_err().to_string();
        assert!(err.contains("webhooks.sealing_key") && err.contains(var), "{err}");
        assert!(!err.contains(bad), "{err}");
    }
    let err = load(&[(var, &current), ("PAYMENTS__WEBHOOKS__OLD_SEALING_KEYS", "12, 34")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("webhooks.old_sealing_keys"), "{err}");
    // Old keys without a current one seal nothing.
    let err = load(&[("PAYMENTS__WEBHOOKS__OLD_SEALING_KEYS", &old[0])]).unwrap_err().to_string();
    assert!(err.contains("webhooks.sealing_key"), "{err}");
}
