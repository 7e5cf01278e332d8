//! The stand-in card processor: the subset of Stripe's API that integrations use, PaymentIntents
//! as integrations are written today and the older Charges beside them, with real in-memory
//! state, Stripe's idempotency semantics, Stripe's test payment methods, and seeded fault
//! injection, so that a run can be repeated exactly. The binary `processor-sim` serves it.
//!
//! It serves `POST /v1/charges` (and `…/{id}/capture`, `GET` one, the list and
//! `GET /v1/charges/search`), `POST /v1/payment_intents` (with `confirm=true`, or then
//! `…/{id}/confirm`), `…/{id}/capture`, `…/{id}/cancel`, `GET` one, the list (`starting_after`
//! or `ending_before`) and `GET /v1/payment_intents/search`, and `POST /v1/refunds` by `charge`
//! or `payment_intent` with `GET /v1/refunds?charge=…` or `?payment_intent=…`. The test card
//! decides a confirmation: a charge under the intent, Stripe's 402 `card_error` with the intent
//! inside, or `requires_action` with a `next_action` that sends the customer to the stand-in's
//! own 3-D Secure test page (`GET /_sim/authenticate/{id}`); a test completes or fails it with
//! `POST /_sim/payment_intents/{id}/authenticate`, and one nobody completes fails after
//! `authentication_ttl_s` (see `authentication`).
//!
//! By default it is as strict as Stripe ([`Idempotency::Stripe`]): the answer of every request
//! that began executing is kept against its key and replayed with `Idempotent-Replayed: true`
//! (2xx, 402, the 4xx an operation raises, 500s); a key reused with other parameters is
//! `400 idempotency_error`; a key is forgotten after `key_ttl_s`; search sees an object only
//! after `search_lag_ms`. [`Idempotency::Lenient`] keeps only 2xx and 402, as the stand-in first
//! did.
//!
//! Once told where (`PUT /_sim/webhooks`), it sends Stripe-style webhooks for every change of a
//! charge or a PaymentIntent, signed with `Stripe-Signature` (the scheme is
//! `provider::signature`'s, which the receiving side verifies with), at least once, with their
//! own seeded faults (see `webhooks`).
//!
//! State lives in memory: a restart forgets every charge and intent.
//!
//! A request goes through `routes` (the router and the charge and refund handlers) or
//! `intent_routes` (the PaymentIntent handlers), `middleware` (its fault), the `ledger` (the
//! books, with one module per operation: `charges`, `refunds`, `lists`, `search`,
//! `payment_intents`, each run under Stripe's idempotency rules in `ledger::idempotency`) and back
//! as an `answer`. `control` serves the `/_sim` surface that changes the `faults` at run time.
//!
//! Other test suites, in any language, drive it over HTTP (`drive`): `GET /healthz`,
//! `POST /_sim/reset` (everything, or one secret key's objects, PaymentIntents with their pending
//! authentications included, and kept keys), faults aimed at particular requests
//! (`/_sim/faults/aimed`, see `aimed`) beside the seeded ones, on the charge and the PaymentIntent
//! routes alike, and a test clock (`/_sim/clock`) that moves key expiry, authentication expiry,
//! the search lag and the `created` of objects and webhook events forward.

mod aimed;
mod answer;
mod authentication;
mod clock;
mod control;
mod drive;
mod faults;
mod intent_routes;
mod ledger;
mod middleware;
mod routes;
mod webhooks;

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

use clock::Clock;
pub use clock::ManualClock;
pub use faults::{DEFAULT_AUTHENTICATION_TTL_S, DEFAULT_KEY_TTL_S, FaultConfig, Idempotency};
use ledger::Ledger;
pub use ledger::Stats;
pub use webhooks::{MAX_ATTEMPTS as WEBHOOK_MAX_ATTEMPTS, WebhookTarget};

/// The default port, the one Stripe's own mock server uses.
pub const DEFAULT_PORT: u16 = 12111;

/// How long a request may be held by latency injection at the most, so a typo cannot hang a test
/// run for hours.
pub const MAX_LATENCY: Duration = Duration::from_secs(60);

/// Everything the stand-in holds, behind one lock.
#[derive(Debug)]
struct Inner {
    ledger: Ledger,
    faults: faults::Injector,
    /// The faults document it started with, which a full reset restores.
    initial_faults: FaultConfig,
    /// The rules of `/_sim/faults/aimed`.
    aimed: aimed::AimedFaults,
    /// Where webhook events go; `None`: nowhere (they are not raised).
    webhook_target: Option<WebhookTarget>,
    /// The webhook dispatcher's queue: each event with the epoch it was raised in.
    webhook_queue: Option<tokio::sync::mpsc::Sender<(u64, serde_json::Value)>>,
    /// Counts full resets: an event raised before the last one is not delivered (any more).
    webhook_epoch: u64,
}

impl Inner {
    /// Hands the events the last operation raised to the webhook dispatcher, if an endpoint is
    /// set (with none, there is no one to tell, as at Stripe).
    fn send_events(&mut self) {
        let events = self.ledger.take_events();
        if self.webhook_target.is_none() {
            return;
        }
        for event in events {
            let queued = self
                .webhook_queue
                .as_ref()
                .is_some_and(|queue| queue.try_send((self.webhook_epoch, event)).is_ok());
            if queued {
                self.ledger.stats.events_created += 1;
            } else {
                self.ledger.stats.webhooks_dropped += 1;
            }
        }
    }
}

/// The shared state, as the handlers and the webhook dispatcher hold it.
#[derive(Debug, Clone)]
struct Sim(Arc<Mutex<Inner>>);

impl Sim {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A bound, not yet serving, stand-in processor.
#[derive(Debug)]
pub struct Simulator {
    listener: TcpListener,
    router: Router,
    sim: Sim,
}

impl Simulator {
    /// Binds `address` (port 0 picks a free port) with the given faults in force; its time is
    /// the monotonic clock.
    pub async fn build(address: &str, faults: FaultConfig) -> std::io::Result<Self> {
        Self::build_on(address, faults, Clock::monotonic()).await
    }

    /// As [`Simulator::build`], on a clock the caller moves: for tests that cross a key's
    /// lifetime or the search lag without sleeping.
    pub async fn build_with_clock(
        address: &str,
        faults: FaultConfig,
        clock: ManualClock,
    ) -> std::io::Result<Self> {
        Self::build_on(address, faults, Clock::manual(clock)).await
    }

    async fn build_on(address: &str, faults: FaultConfig, clock: Clock) -> std::io::Result<Self> {
        faults.validate().map_err(std::io::Error::other)?;
        let listener = TcpListener::bind(address).await?;
        let sim = Sim(Arc::new(Mutex::new(Inner {
            ledger: Ledger::new(clock),
            initial_faults: faults.clone(),
            faults: faults::Injector::new(faults),
            aimed: aimed::AimedFaults::default(),
            webhook_target: None,
            webhook_queue: None,
            webhook_epoch: 0,
        })));
        let queue = webhooks::start(sim.clone());
        sim.lock().webhook_queue = Some(queue);
        let router = routes::router(sim.clone());
        Ok(Self { listener, router, sim })
    }

    /// Sends webhook events to `target` from now on (`None`: to nobody), as
    /// `PUT /_sim/webhooks` does.
    pub fn set_webhook_target(&self, target: Option<WebhookTarget>) -> Result<(), String> {
        if let Some(target) = &target {
            target.validate()?;
        }
        self.sim.lock().webhook_target = target;
        Ok(())
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// Serves until `stop` completes.
    pub async fn run_until(
        self,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(self.listener, self.router).with_graceful_shutdown(stop).await
    }
}
