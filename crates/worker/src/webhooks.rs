//! Webhook delivery: one staged `webhook` job per (event, endpoint), posted signed, at least
//! once.
//!
//! The job was staged in the transaction that wrote the event (`payments_domain::events`), so a
//! committed change is always delivered and a rolled-back one never is. A delivery is done on any
//! 2xx answer. Anything else (another status, a refused connection, a timeout) is retried with
//! exponential back-off and full jitter, capped, until the horizon after the event's creation;
//! then the job is dead-lettered. Every attempt is written to the endpoint's delivery log.
//!
//! A worker killed mid-delivery leaves the job claimed; the claim runs out and another run posts
//! the event again, with the same event id: receivers dedupe by it.
//!
//! A connection gets `webhooks.connect_timeout_ms` of the attempt's `webhooks.timeout_ms`, so a
//! host that never answers fails in seconds. Each outcome is also recorded on the endpoint's
//! health (`payments_domain::deliveries::health`), in the transaction that records the job's:
//! an endpoint that keeps failing is paused, then disabled with an event.
//!
//! The address rule holds at connection time too: names are resolved by [`CheckedResolver`],
//! which refuses every address the rule does not permit, so a name that later points inward
//! (DNS rebinding) reaches nothing; redirects are not followed.
//!
//! The delivery log stores the coarse [`Failure`] of an attempt, the one the account is shown;
//! the error's whole chain goes to this process's log (and the job's `last_error`), for
//! operators only.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use payments_backoff::{Backoff, Jitter};
use payments_domain::deliveries::{Caps, FailureRecorded, HealthRules, health};
use payments_domain::jobs::{self, Job, WebhookJob};
use payments_domain::webhooks::{
    self, AddressRule, Attempt, Failure, Outcome, SIGNATURE_HEADER, SealingKeys,
};
use payments_settings::{Settings, WebhookSettings};
use sqlx::{PgExecutor, PgPool};

use crate::jobs::SEND_TIMEOUT;

mod failure;

use failure::{Failed, RefusedName, error_chain, failure_of};

/// The keys that open the endpoints' signing secrets (and seal one, when the completer finishes a
/// keyed creation): `webhooks.sealing_key` and the old ones. Without one the worker does not
/// start.
pub fn sealing_keys(settings: &Settings) -> anyhow::Result<Arc<SealingKeys>> {
    let keys = settings.sealing_keys()?;
    Ok(Arc::new(SealingKeys::new(keys.current.0, keys.old.iter().map(|key| key.0))))
}

/// Resolves names for deliveries, keeping only the addresses the rule permits.
#[derive(Debug, Clone)]
pub struct CheckedResolver {
    rule: Arc<AddressRule>,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let rule = self.rule.clone();
        Box::pin(async move {
            let refused = |cause| RefusedName { name: name.as_str().to_owned(), cause };
            let found: Vec<SocketAddr> = match tokio::net::lookup_host((name.as_str(), 0)).await {
                Ok(found) => found.collect(),
                Err(err) => return Err(refused(Some(err)).into()),
            };
            let permitted: Vec<SocketAddr> =
                found.into_iter().filter(|addr| rule.permits(addr.ip())).collect();
            if permitted.is_empty() {
                return Err(refused(None).into());
            }
            let addrs: reqwest::dns::Addrs = Box::new(permitted.into_iter());
            Ok(addrs)
        })
    }
}

/// Posts webhooks.
#[derive(Debug, Clone)]
pub struct Deliverer {
    client: reqwest::Client,
    rule: Arc<AddressRule>,
    settings: WebhookSettings,
    health: HealthRules,
    /// Open the endpoints' sealed signing secrets.
    sealing_keys: Arc<SealingKeys>,
}

/// What one delivery job came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    /// A 2xx answer, or nothing to deliver (the endpoint was disabled or deleted).
    Done,
    /// Failed; scheduled again.
    Retrying,
    /// Failed past the horizon, or refused by the address rule.
    Dead,
    /// Another runner claimed the job meanwhile; its run decides.
    Lost,
}

impl Deliverer {
    /// A deliverer for these settings, opening signing secrets with `sealing_keys`.
    pub fn new(settings: &WebhookSettings, sealing_keys: Arc<SealingKeys>) -> anyhow::Result<Self> {
        let rule = Arc::new(AddressRule {
            allow_loopback: settings.allow_loopback,
            deny_ranges: settings.deny_ranges.ranges().to_vec(),
        });
        // Bounded by the job claim: a delivery never outlives it, so it is not posted twice at
        // once by two runners.
        let timeout = Duration::from_millis(settings.timeout_ms).min(SEND_TIMEOUT);
        let connect_timeout = Duration::from_millis(settings.connect_timeout_ms).min(timeout);
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(CheckedResolver { rule: rule.clone() }))
            // No proxy from the environment (`HTTP_PROXY`, `ALL_PROXY`, …): a proxy resolves the
            // endpoint's name itself, past the address rule.
            .no_proxy()
            .user_agent(concat!("payments-webhooks/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let health = HealthRules {
            pause_after_failures: settings.pause_after_failures,
            pause_after: Duration::from_secs(u64::from(settings.pause_after_minutes) * 60),
            pause: Duration::from_millis(settings.pause_ms),
            longest_pause: Duration::from_millis(settings.backoff_cap_ms.max(settings.pause_ms)),
            disable_after: Duration::from_secs(u64::from(settings.disable_after_hours) * 3600),
        };
        Ok(Self { client, rule, settings: settings.clone(), health, sealing_keys })
    }

    /// The caps on deliveries run at once, across every worker.
    pub fn caps(&self) -> Caps {
        Caps {
            per_endpoint: self.settings.max_deliveries_per_endpoint,
            per_account: self.settings.max_deliveries_per_account,
        }
    }

    /// Deliveries this worker runs at once.
    pub fn max_deliveries(&self) -> usize {
        self.settings.max_deliveries as usize
    }

    /// The delay before attempt `attempt + 1`: base × 2^(attempt-1), capped, with full jitter
    /// over its upper half (so retries of many deliveries spread out, and none comes sooner than
    /// half the schedule).
    pub fn backoff(&self, attempt: i32) -> Duration {
        let backoff = Backoff::new(
            Duration::from_millis(self.settings.backoff_base_ms.max(1)),
            Duration::from_millis(self.settings.backoff_cap_ms.max(1)),
            Jitter::UpperHalf,
        );
        backoff.delay(u32::try_from(attempt).unwrap_or(0))
    }

    /// Posts `body` to `url`, signed with `secret`: the receiver's status, or why none came.
    async fn send(&self, url: &str, secret: &str, body: Vec<u8>) -> Result<u16, Failed> {
        let url = self.rule.check_url(url).map_err(|err| Failed {
            failure: Failure::RefusedAddress,
            error: err.to_string(),
            // The rule changed since the URL was registered: no retry will pass it.
            for_good: true,
        })?;
        let signature = webhooks::signature_header(secret, unix_now(), &body);
        let sent = self
            .client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature)
            .body(body)
            .send()
            .await;
        match sent {
            Ok(response) => Ok(response.status().as_u16()),
            Err(err) => {
                Err(Failed { failure: failure_of(&err), error: error_chain(&err), for_good: false })
            }
        }
    }

    /// Runs one claimed `webhook` job, the delivery `work`.
    pub async fn run(
        &self,
        pool: &PgPool,
        job: &Job,
        work: &WebhookJob,
    ) -> Result<Delivered, String> {
        let WebhookJob { event_id, endpoint_id } = work;
        let found =
            webhooks::delivery(pool, event_id, endpoint_id).await.map_err(|err| err.to_string())?;
        let Some((event, endpoint, age_ms)) = found else {
            return Err(format!("no event {event_id}"));
        };
        let Some(endpoint) = endpoint else {
            // Disabled or deleted since: nothing to deliver.
            return finish(pool, job, true, "").await;
        };
        // A secret that does not open (its key was dropped from the settings) fails the job, as
        // the database being away would: the operator's to mend, the delivery kept meanwhile.
        let secret = self.sealing_keys.open(&endpoint.secret, &endpoint.id);
        let secret = secret.map_err(|err| format!("endpoint {}: {err}", endpoint.id))?;
        let started = Instant::now();
        let answer = self.send(&endpoint.url, secret.expose(), event.to_json()).await;
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let horizon_ms = u64::from(self.settings.horizon_hours) * 3_600_000;
        let (status_code, failure, error, refused) = match answer {
            Ok(status) if (200..300).contains(&status) => (Some(status), None, None, false),
            Ok(status) => {
                (Some(status), Some(Failure::HttpStatus), Some(format!("answered {status}")), false)
            }
            Err(Failed { failure, error, for_good }) => {
                (None, Some(failure), Some(error), for_good)
            }
        };
        if let (Some(failure), Some(error)) = (failure, &error) {
            tracing::warn!(
                endpoint_id = %endpoint.id, event_id = %event.id, %failure, error, duration_ms,
                "webhook delivery failed"
            );
        }
        let delay = self.backoff(job.attempts);
        let outcome = match &error {
            None => Outcome::Delivered,
            Some(_) => {
                let next_at_ms = u64::try_from(age_ms)
                    .unwrap_or(0)
                    .saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
                if refused || next_at_ms > horizon_ms { Outcome::Dead } else { Outcome::Retrying }
            }
        };
        webhooks::log_attempt(
            pool,
            &Attempt {
                endpoint_id: &endpoint.id,
                event_id: &event.id,
                attempt: job.attempts,
                status_code,
                failure,
                duration_ms,
                outcome,
            },
        )
        .await
        .map_err(|err| err.to_string())?;
        // The endpoint's health and the job's outcome commit together: a probe's claim is let go
        // only with the pause it extends (or ends).
        let db = |err: payments_domain::DomainError| err.to_string();
        let mut tx = pool.begin().await.map_err(|err| err.to_string())?;
        if error.is_none() {
            health::delivered(&mut *tx, &endpoint.id).await.map_err(db)?;
        } else {
            match health::failed(&mut tx, &endpoint.id, &self.health).await.map_err(db)? {
                FailureRecorded::Counted | FailureRecorded::Closed => {}
                FailureRecorded::Paused { probe_in } => tracing::warn!(
                    endpoint_id = %endpoint.id, probe_in_ms = probe_in.as_millis() as u64,
                    "webhook endpoint paused: it keeps failing"
                ),
                FailureRecorded::Disabled => tracing::warn!(
                    endpoint_id = %endpoint.id, account_id = %endpoint.account_id,
                    "webhook endpoint disabled: it has failed for too long"
                ),
            }
        }
        let delivered = match (outcome, error) {
            (Outcome::Delivered, _) | (_, None) => finish(&mut *tx, job, true, "").await?,
            (Outcome::Retrying, Some(error)) => {
                let recorded = jobs::failed(&mut *tx, job.id, job.attempts, &error, delay, false)
                    .await
                    .map_err(db)?;
                if recorded { Delivered::Retrying } else { Delivered::Lost }
            }
            (Outcome::Dead, Some(error)) => finish(&mut *tx, job, false, &error).await?,
        };
        // A run whose claim another worker has taken since records nothing: not the job's
        // outcome (the fence), and not the endpoint's health either (it would count a failure
        // twice, or pause and disable on a stale run's word).
        if matches!(delivered, Delivered::Lost) {
            tx.rollback().await.map_err(|err| err.to_string())?;
            return Ok(delivered);
        }
        tx.commit().await.map_err(|err| err.to_string())?;
        Ok(delivered)
    }
}

async fn finish(
    executor: impl PgExecutor<'_>,
    job: &Job,
    done: bool,
    error: &str,
) -> Result<Delivered, String> {
    let recorded = if done {
        jobs::done(executor, job.id, job.attempts).await
    } else {
        jobs::failed(executor, job.id, job.attempts, error, Duration::ZERO, true).await
    }
    .map_err(|err| err.to_string())?;
    Ok(match (recorded, done) {
        (false, _) => Delivered::Lost,
        (true, true) => Delivered::Done,
        (true, false) => Delivered::Dead,
    })
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deliverer(base: u64, cap: u64) -> Deliverer {
        deliverer_timed(base, cap, 1000, 1000)
    }

    fn deliverer_timed(base: u64, cap: u64, timeout_ms: u64, connect_timeout_ms: u64) -> Deliverer {
        let settings = WebhookSettings {
            allow_loopback: true,
            deny_ranges: payments_settings::AddressRanges::default(),
            timeout_ms,
            connect_timeout_ms,
            max_deliveries: 32,
            max_deliveries_per_account: 8,
            max_deliveries_per_endpoint: 2,
            pause_after_failures: 20,
            pause_after_minutes: 15,
            pause_ms: 60_000,
            disable_after_hours: 72,
            backoff_base_ms: base,
            backoff_cap_ms: cap,
            horizon_hours: 72,
            sealing_key: String::new().into(),
            old_sealing_keys: String::new().into(),
        };
        let keys = Arc::new(SealingKeys::new([1; 32], []));
        Deliverer::new(&settings, keys).unwrap_or_else(|err| panic!("{err}"))
    }

    #[test]
    fn the_backoff_doubles_per_attempt_within_its_jitter_and_stops_at_the_cap() {
        let d = deliverer(1000, 10_000);
        for _ in 0..50 {
            let first = d.backoff(1).as_millis();
            assert!((500..=1000).contains(&first), "{first}");
            let third = d.backoff(3).as_millis();
            assert!((2000..=4000).contains(&third), "{third}");
            let late = d.backoff(40).as_millis();
            assert!((5000..=10_000).contains(&late), "{late}");
        }
    }

    /// A host that never completes the handshake (a listener whose queue is full drops every
    /// further SYN) fails within the connect timeout, not the whole delivery's.
    #[tokio::test]
    async fn a_connection_that_is_never_accepted_fails_at_the_connect_timeout() {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let address = socket.local_addr().unwrap();
        let listener = socket.listen(1).unwrap();
        // Fill its queue (it never accepts) until a connection hangs.
        let mut queued = Vec::new();
        let full = loop {
            let connect = tokio::net::TcpStream::connect(address);
            match tokio::time::timeout(Duration::from_millis(200), connect).await {
                Ok(connected) => queued.push(connected.unwrap()),
                Err(_) => break true,
            }
            if queued.len() > 64 {
                break false;
            }
        };
        assert!(full, "the listen queue never filled");
        let d = deliverer_timed(1000, 10_000, 8000, 300);
        let started = Instant::now();
        let sent = d.send(&format!("http://{address}/hooks"), "whsec_test", b"{}".to_vec()).await;
        let took = started.elapsed();
        assert!(matches!(sent, Err(Failed { failure: Failure::Timeout, .. })), "{sent:?}");
        assert!(took < Duration::from_secs(3), "the connection took the whole timeout: {took:?}");
        drop((listener, queued));
    }
}
