//! `processor-sim`: the stand-in card processor. See the library, `processor_sim`.

use std::process::ExitCode;

use clap::Parser;
use processor_sim::{
    DEFAULT_AUTHENTICATION_TTL_S, DEFAULT_KEY_TTL_S, DEFAULT_PORT, FaultConfig, Idempotency,
    Simulator, WebhookTarget,
};

/// A stand-in card processor speaking a subset of Stripe's API: PaymentIntents (create, confirm,
/// capture, cancel, retrieve, list, search by metadata), Charges (create, capture, retrieve, list,
/// search) and Refunds (by charge or payment_intent, and their lists), with Stripe's idempotency
/// semantics, Stripe's test payment methods (pm_card_visa, pm_card_chargeDeclined, …,
/// pm_card_authenticationRequired, pm_card_threeDSecure2Required) and seeded fault injection.
///
/// A card that asks for 3-D Secure leaves the PaymentIntent in requires_action, with a
/// next_action pointing at the stand-in's own test page (`GET /_sim/authenticate/{id}`); a test
/// completes or fails it with `POST /_sim/payment_intents/{id}/authenticate` and
/// `{"outcome":"complete"}` or `{"outcome":"fail"}`; one nobody completes fails after
/// `--authentication-ttl-s`.
///
/// By default it is as strict as Stripe (`--idempotency stripe`): the answer of every request
/// that began executing (2xx, 402, an operation's 4xx, a 500 after processing) is kept against
/// its Idempotency-Key and replayed with `Idempotent-Replayed: true`; a request refused before
/// executing (no API key, a malformed body or parameter, an injected 429 or plain 500, a drop)
/// keeps nothing; the same key with other parameters is `400 idempotency_error`; a key is
/// forgotten after `--key-ttl-s`. `--idempotency lenient` keeps only 2xx and 402.
///
/// With --webhook-url and --webhook-secret (or `PUT /_sim/webhooks` at run time) it sends a
/// Stripe-style event, signed with `Stripe-Signature`, for every change of a charge or a
/// PaymentIntent, at least once (retried with back-off), with seeded faults of its own (delay, duplicates, out of order).
///
/// Faults and these settings can be changed at run time with `PUT /_sim/faults` (a JSON document
/// of the same names); counters are at `GET /_sim/stats`. All state lives in memory: a restart
/// forgets every charge, intent and key.
///
/// Test suites in any language drive it over HTTP: `GET /healthz`; `POST /_sim/reset` forgets
/// everything (or, with `{"api_key":"sk_test_…"}`, only what that key made: charges, refunds,
/// PaymentIntents and their pending authentications, kept keys); `POST
/// /_sim/faults/aimed` aims a fault at particular requests (`{"method":"POST",
/// "path":"/v1/charges/{id}/capture", "match":{"idempotency_key":…} or {"metadata":{…}} or
/// {"param":{"name":…,"value":…}}, "fault":"lose_answer"|"error_after_processing"|"error"
/// |"rate_limit"|"drop"|"latency", "latency_ms":…, "times":1}`; `GET` lists, `DELETE` clears);
/// `POST /_sim/clock` `{"advance_s":3600}` moves its time (key expiry, authentication expiry,
/// search lag, the `created` of objects and webhook events).
// No `Debug`: the arguments hold the webhook secret.
#[derive(Parser)]
#[command(name = "processor-sim", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "SIM_HOST", default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (12111 is the port Stripe's own mock uses; 0 picks a free one).
    #[arg(long, env = "SIM_PORT", default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Seed of the fault generator; the same seed and requests give the same faults.
    #[arg(long, env = "SIM_SEED", default_value_t = 42)]
    seed: u64,
    /// Latency added to every request.
    #[arg(long, env = "SIM_LATENCY_MS", default_value_t = 0)]
    latency_ms: u64,
    /// Uniform extra latency, from 0 to this.
    #[arg(long, env = "SIM_JITTER_MS", default_value_t = 0)]
    jitter_ms: u64,
    /// Share of requests answered 500 without acting.
    #[arg(long, env = "SIM_ERROR_RATE", default_value_t = 0.0)]
    error_rate: f64,
    /// Share of requests answered 429 without acting.
    #[arg(long, env = "SIM_RATE_LIMIT_RATE", default_value_t = 0.0)]
    rate_limit_rate: f64,
    /// Share of requests acted on and then answered with a broken connection.
    #[arg(long, env = "SIM_LOST_RESPONSE_RATE", default_value_t = 0.0)]
    lost_response_rate: f64,
    /// Share of requests answered with a broken connection without acting.
    #[arg(long, env = "SIM_DROP_RATE", default_value_t = 0.0)]
    drop_rate: f64,
    /// Share of requests acted on (the charge, capture or refund happens) and then answered
    /// `500 api_error`; in strict mode that 500 is what the key keeps and replays.
    #[arg(long, env = "SIM_ERROR_AFTER_PROCESSING_RATE", default_value_t = 0.0)]
    error_after_processing_rate: f64,
    /// Which answers are kept against idempotency keys: `stripe` (every request that began
    /// executing) or `lenient` (2xx and 402 only).
    #[arg(long, env = "SIM_IDEMPOTENCY", value_enum, default_value_t = Idempotency::Stripe)]
    idempotency: Idempotency,
    /// Seconds an idempotency key is remembered (Stripe: 24 hours).
    #[arg(long, env = "SIM_KEY_TTL_S", default_value_t = DEFAULT_KEY_TTL_S)]
    key_ttl_s: u64,
    /// Milliseconds before a new charge or PaymentIntent shows in search (Stripe's search can
    /// trail writes by up to about a minute).
    #[arg(long, env = "SIM_SEARCH_LAG_MS", default_value_t = 0)]
    search_lag_ms: u64,
    /// Where to send Stripe-style webhooks (charge.succeeded, charge.failed, charge.captured,
    /// charge.refunded, payment_intent.succeeded, payment_intent.payment_failed,
    /// payment_intent.amount_capturable_updated, payment_intent.requires_action,
    /// payment_intent.canceled), e.g. http://127.0.0.1:8080/webhooks/processor; none are sent
    /// without it.
    #[arg(long, env = "SIM_WEBHOOK_URL", requires = "webhook_secret")]
    webhook_url: Option<String>,
    /// The endpoint's signing secret (whsec_…) for the Stripe-Signature header.
    #[arg(long, env = "SIM_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
    /// Milliseconds before the first attempt to deliver each webhook.
    #[arg(long, env = "SIM_WEBHOOK_DELAY_MS", default_value_t = 0)]
    webhook_delay_ms: u64,
    /// Share of webhooks delivered twice.
    #[arg(long, env = "SIM_WEBHOOK_DUPLICATE_RATE", default_value_t = 0.0)]
    webhook_duplicate_rate: f64,
    /// Share of webhooks held back until the next one has been sent (out of order).
    #[arg(long, env = "SIM_WEBHOOK_REORDER_RATE", default_value_t = 0.0)]
    webhook_reorder_rate: f64,
    /// Milliseconds before a failed webhook attempt is tried again; doubles per attempt.
    #[arg(long, env = "SIM_WEBHOOK_RETRY_BASE_MS", default_value_t = 500)]
    webhook_retry_base_ms: u64,
    /// Seconds a PaymentIntent waits in requires_action for the customer to authenticate before
    /// the authentication fails by itself.
    #[arg(long, env = "SIM_AUTHENTICATION_TTL_S", default_value_t = DEFAULT_AUTHENTICATION_TTL_S)]
    authentication_ttl_s: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let faults = FaultConfig {
        seed: args.seed,
        latency_ms: args.latency_ms,
        jitter_ms: args.jitter_ms,
        error_rate: args.error_rate,
        rate_limit_rate: args.rate_limit_rate,
        lost_response_rate: args.lost_response_rate,
        drop_rate: args.drop_rate,
        error_after_processing_rate: args.error_after_processing_rate,
        idempotency: args.idempotency,
        key_ttl_s: args.key_ttl_s,
        search_lag_ms: args.search_lag_ms,
        webhook_delay_ms: args.webhook_delay_ms,
        webhook_duplicate_rate: args.webhook_duplicate_rate,
        webhook_reorder_rate: args.webhook_reorder_rate,
        webhook_retry_base_ms: args.webhook_retry_base_ms,
        authentication_ttl_s: args.authentication_ttl_s,
    };
    let address = format!("{}:{}", args.host, args.port);
    let simulator = match Simulator::build(&address, faults).await {
        Ok(simulator) => simulator,
        Err(err) => {
            eprintln!("processor-sim: cannot start on {address}: {err}");
            return ExitCode::FAILURE;
        }
    };
    let target = match (args.webhook_url, args.webhook_secret) {
        (Some(url), Some(secret)) => Some(WebhookTarget { url, secret }),
        _ => None,
    };
    if let Err(message) = simulator.set_webhook_target(target) {
        eprintln!("processor-sim: --webhook-url/--webhook-secret: {message}");
        return ExitCode::FAILURE;
    }
    tracing::info!(port = simulator.port(), "processor-sim listening (state is in memory only)");
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let terminate = async {
        if let Ok(mut signal) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            signal.recv().await;
        }
    };
    let stopped = async move {
        tokio::select! { () = stop => {}, () = terminate => {} }
    };
    match simulator.run_until(stopped).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("processor-sim: {err}");
            ExitCode::FAILURE
        }
    }
}
