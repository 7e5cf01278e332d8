//! `[retention]`: how long the worker keeps the rows of each table that only grows (events,
//! webhook attempts, processor events, audit records, finished jobs), and how many rows one of its
//! statements deletes. Keys have their own, `idempotency.retention_hours`. What each rule keeps
//! and why is in `payments_domain::retention`; the checks below hold the rules to the settings
//! they depend on.

use serde::Deserialize;

use crate::validate::invalid;
use crate::{Settings, SettingsError};

/// How long the processor may deliver one of its events again, in days: Stripe retries a webhook
/// it got no 2xx for over up to 3 days.
pub const PROCESSOR_REDELIVERY_DAYS: u32 = 3;

/// `[retention]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSettings {
    /// Events are kept this long after they were written; `GET /v1/events` then no longer has
    /// them (Stripe's 30 days).
    pub events_days: u32,
    /// Each attempt of the delivery log is kept this long.
    pub webhook_attempts_days: u32,
    /// The processor's webhooks are kept this long after they arrived (the consumer's dedupe).
    pub processor_events_days: u32,
    /// Audit records are kept this long.
    pub audit_events_days: u32,
    /// A job done is kept this long after it was done.
    pub done_jobs_days: u32,
    /// A dead-lettered job is kept this long after it died: it is for a person.
    pub dead_jobs_days: u32,
    /// Rows one delete statement takes at most.
    pub batch_size: u32,
}

impl RetentionSettings {
    /// The checks of `[retention]`, alone and against the settings it depends on; the first
    /// failure returned. Not required, on purpose:
    ///
    /// - `webhook_attempts_days` at most `events_days`: an event is deleted only once no attempt
    ///   of its deliveries is left, so longer attempts keep their events as long;
    /// - `dead_jobs_days` at least `done_jobs_days`: the two rules are independent.
    pub(crate) fn check(&self, settings: &Settings) -> Result<(), SettingsError> {
        for (setting, days) in [
            ("retention.events_days", self.events_days),
            ("retention.webhook_attempts_days", self.webhook_attempts_days),
            ("retention.processor_events_days", self.processor_events_days),
            ("retention.audit_events_days", self.audit_events_days),
            ("retention.done_jobs_days", self.done_jobs_days),
            ("retention.dead_jobs_days", self.dead_jobs_days),
        ] {
            if !(1..=36_500).contains(&days) {
                return Err(invalid(setting, "must be from 1 to 36500 (days)".into()));
            }
        }
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return Err(invalid("retention.batch_size", "must be from 1 to 10000".into()));
        }
        // A delivery is retried until `webhooks.horizon_hours` after its event, and its receiver
        // may fetch the event by id (`GET /v1/events/{id}`) to handle it: the event must still be
        // there. (A delivery still pending past that, behind a backlog, keeps its event too: the
        // delete asks for it.)
        let horizon_hours = settings.webhooks.horizon_hours;
        if u64::from(self.events_days) * 24 <= u64::from(horizon_hours) {
            return Err(invalid(
                "retention.events_days",
                format!(
                    "must be longer than webhooks.horizon_hours ({horizon_hours} h): an event is \
                     kept while its deliveries are retried, so that a receiver can fetch it"
                ),
            ));
        }
        // The consumer tells a redelivery of the processor's event from a new one by its row: a
        // row deleted while the processor may still deliver the event again would let it be
        // consumed twice (an extra charge reported twice, say).
        if self.processor_events_days <= PROCESSOR_REDELIVERY_DAYS {
            return Err(invalid(
                "retention.processor_events_days",
                format!(
                    "must be more than {PROCESSOR_REDELIVERY_DAYS}: the processor delivers an \
                     event again for up to {PROCESSOR_REDELIVERY_DAYS} days, and its row is what \
                     makes a redelivery change nothing"
                ),
            ));
        }
        // The phase that settles a payment waiting on its customer looks for a success the
        // processor reported for it under another charge, until its authentication expires.
        let expires_s = settings.processor.authentication_expires_after_s;
        if u64::from(self.processor_events_days) * 86_400 <= expires_s {
            return Err(invalid(
                "retention.processor_events_days",
                format!(
                    "must be longer than processor.authentication_expires_after_s ({expires_s} \
                     s): a payment waiting on its customer reads the processor's events about it \
                     until then"
                ),
            ));
        }
        // A key's page in the inspector shows the audit records written under it; they should
        // last as long as the key.
        let key_hours = settings.idempotency.retention_hours;
        if u64::from(self.audit_events_days) * 24 < u64::from(key_hours) {
            return Err(invalid(
                "retention.audit_events_days",
                format!(
                    "must be at least idempotency.retention_hours ({key_hours} h): a key's audit \
                     records are kept as long as the key"
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::Settings;

    fn refused(vars: &[(&str, &str)]) -> String {
        let vars = vars.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        match Settings::load_from(vars) {
            Ok(_) => String::new(),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn the_defaults_keep_events_thirty_days_and_dead_jobs_ninety() {
        let settings = Settings::load_from(Vec::new()).expect("the defaults");
        let r = &settings.retention;
        assert_eq!((r.events_days, r.webhook_attempts_days, r.processor_events_days), (30, 30, 30));
        assert_eq!((r.audit_events_days, r.done_jobs_days, r.dead_jobs_days), (365, 7, 90));
        assert_eq!(r.batch_size, 1000);
    }

    #[test]
    fn every_retention_is_at_least_a_day_and_the_batch_at_least_a_row() {
        for name in ["EVENTS_DAYS", "WEBHOOK_ATTEMPTS_DAYS", "AUDIT_EVENTS_DAYS", "BATCH_SIZE"] {
            let variable = format!("PAYMENTS__RETENTION__{name}");
            let err = refused(&[(&variable, "0")]);
            assert!(err.contains(&variable), "{err}");
        }
        let err = refused(&[("PAYMENTS__RETENTION__DEAD_JOBS_DAYS", "0")]);
        assert!(err.contains("retention.dead_jobs_days"), "{err}");
        assert_eq!(refused(&[("PAYMENTS__RETENTION__DONE_JOBS_DAYS", "1")]), "");
    }

    #[test]
    fn events_too_short_for_the_webhook_horizon_are_refused() {
        let err = refused(&[("PAYMENTS__RETENTION__EVENTS_DAYS", "3")]);
        assert!(err.contains("PAYMENTS__RETENTION__EVENTS_DAYS"), "{err}");
        assert!(err.contains("webhooks.horizon_hours (72 h)"), "{err}");
        let shorter_horizon = ("PAYMENTS__WEBHOOKS__HORIZON_HOURS", "71");
        assert_eq!(refused(&[("PAYMENTS__RETENTION__EVENTS_DAYS", "3"), shorter_horizon]), "");
    }

    #[test]
    fn processor_events_outlive_redeliveries_and_waiting_payments() {
        let err = refused(&[("PAYMENTS__RETENTION__PROCESSOR_EVENTS_DAYS", "3")]);
        assert!(err.contains("delivers an event again"), "{err}");
        let week = ("PAYMENTS__PROCESSOR__AUTHENTICATION_EXPIRES_AFTER_S", "604800");
        let err = refused(&[("PAYMENTS__RETENTION__PROCESSOR_EVENTS_DAYS", "7"), week]);
        assert!(err.contains("processor.authentication_expires_after_s"), "{err}");
        assert_eq!(refused(&[("PAYMENTS__RETENTION__PROCESSOR_EVENTS_DAYS", "8"), week]), "");
    }

    #[test]
    fn audit_records_last_as_long_as_their_keys() {
        let keys = ("PAYMENTS__IDEMPOTENCY__RETENTION_HOURS", "72");
        let err = refused(&[("PAYMENTS__RETENTION__AUDIT_EVENTS_DAYS", "2"), keys]);
        assert!(err.contains("PAYMENTS__RETENTION__AUDIT_EVENTS_DAYS"), "{err}");
        assert_eq!(refused(&[("PAYMENTS__RETENTION__AUDIT_EVENTS_DAYS", "3"), keys]), "");
    }
}
