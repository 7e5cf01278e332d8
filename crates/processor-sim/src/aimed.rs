//! Faults aimed at particular requests, beside the seeded probabilities of
//! [`FaultConfig`](crate::faults::FaultConfig): "lose the answer to the next create whose
//! idempotency key is `k`", "answer 500 after processing to the next capture", "delay one path".
//!
//! A rule (`POST /_sim/faults/aimed`) names the requests it fires on (a method, a path in which a
//! `{…}` segment stands for any id, the secret key, the `Idempotency-Key`, metadata, one
//! parameter; every member given must hold) and the fault, and fires on the next `times` matching
//! requests, then is spent and forgotten. The first live rule that matches fires; its fault and
//! latency replace the drawn plan for that request (the seeded draw is still made, so the drawn
//! sequence does not depend on the rules). The faults are carried out by the same code as the
//! drawn ones (`middleware`).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{Method, header};
use serde::{Deserialize, Serialize};

use crate::MAX_LATENCY;
use crate::faults::Fault;

/// Live rules at most, so that a suite that never clears them cannot grow the stand-in forever.
pub(crate) const MAX_RULES: usize = 1000;

/// The most requests one rule may fire on.
const MAX_TIMES: u32 = 100_000;

/// What a rule does to the request it fires on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AimedKind {
    /// Acted on, then the connection is broken: the caller does not learn the outcome.
    LoseAnswer,
    /// Acted on, then answered `500 api_error`, which the key keeps in `stripe` mode.
    ErrorAfterProcessing,
    /// Answered `500 api_error` before acting.
    Error,
    /// Answered `429` before acting.
    RateLimit,
    /// The connection is broken before acting.
    Drop,
    /// Delayed by `latency_ms`, then served as usual.
    Latency,
}

impl AimedKind {
    fn fault(self) -> Fault {
        match self {
            Self::LoseAnswer => Fault::LostResponse,
            Self::ErrorAfterProcessing => Fault::ErrorAfterProcessing,
            Self::Error => Fault::ServerError,
            Self::RateLimit => Fault::RateLimit,
            Self::Drop => Fault::Drop,
            Self::Latency => Fault::None,
        }
    }
}

/// A form (or query) parameter that must be sent with this value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ParamMatch {
    /// As sent, e.g. `amount` or `metadata[payment_id]`.
    pub name: String,
    /// As sent, e.g. `500`.
    pub value: String,
}

/// What a request must carry for a rule to fire; every member given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct Match {
    /// The `Idempotency-Key` header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// `metadata[key]=value` parameters, each of them.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// One parameter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub param: Option<ParamMatch>,
}

impl Match {
    /// Whether it reads the request's parameters (its body, for a POST).
    fn reads_params(&self) -> bool {
        !self.metadata.is_empty() || self.param.is_some()
    }
}

/// A rule, as `POST /_sim/faults/aimed` takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AimedRule {
    /// `GET`, `POST`, …; any if left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// An exact path, or one with `{…}` segments that stand for any id
    /// (`/v1/charges/{id}/capture`); any if left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Only requests made with this secret key, so that suites sharing one stand-in with their
    /// own keys aim at their own requests only; any if left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// What the request must carry.
    #[serde(default, rename = "match")]
    pub matcher: Match,
    /// What happens to it.
    pub fault: AimedKind,
    /// A delay before the answer (for `latency`, the whole fault).
    #[serde(default)]
    pub latency_ms: u64,
    /// How many matching requests it fires on before it is spent.
    #[serde(default = "once")]
    pub times: u32,
}

fn once() -> u32 {
    1
}

impl AimedRule {
    /// Checks the rule; the error is the message of a `400`.
    fn validate(&mut self) -> Result<(), String> {
        if let Some(method) = &mut self.method {
            if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
                return Err("method must be an HTTP method such as POST".into());
            }
            method.make_ascii_uppercase();
        }
        if let Some(path) = &self.path
            && !path.starts_with('/')
        {
            return Err("path must start with /".into());
        }
        if self.fault == AimedKind::ErrorAfterProcessing
            && self.method.as_deref().is_some_and(|method| method != "POST")
        {
            return Err("error_after_processing is a fault of POSTs: a read acts on nothing".into());
        }
        if self.fault == AimedKind::Latency && self.latency_ms == 0 {
            return Err("a latency fault needs latency_ms".into());
        }
        if Duration::from_millis(self.latency_ms) > MAX_LATENCY {
            return Err(format!("latency_ms must be at most {} ms", MAX_LATENCY.as_millis()));
        }
        if !(1..=MAX_TIMES).contains(&self.times) {
            return Err(format!("times must be from 1 to {MAX_TIMES}"));
        }
        Ok(())
    }

    /// Whether it could fire on a request with this method and path, before its parameters are
    /// read.
    fn aims_at(&self, method: &Method, path: &str) -> bool {
        let method_holds = match &self.method {
            Some(wanted) => wanted == method.as_str(),
            // "500 after processing" fires on POSTs only, as the drawn fault does.
            None => self.fault != AimedKind::ErrorAfterProcessing || method == Method::POST,
        };
        method_holds && self.path.as_deref().is_none_or(|pattern| path_matches(pattern, path))
    }

    fn matches(&self, request: &Aimed<'_>) -> bool {
        let Match { idempotency_key, metadata, param } = &self.matcher;
        let sent = |name: &str, value: &str| {
            request.params.iter().rev().find(|(k, _)| k == name).is_some_and(|(_, v)| v == value)
        };
        self.aims_at(request.method, request.path)
            && self.api_key.as_deref().is_none_or(|key| request.api_key == Some(key))
            && idempotency_key.as_deref().is_none_or(|key| request.idempotency_key == Some(key))
            && metadata.iter().all(|(key, value)| sent(&format!("metadata[{key}]"), value))
            && param.as_ref().is_none_or(|param| sent(&param.name, &param.value))
    }
}

/// Whether `path` is `pattern`, where a `{…}` segment of the pattern stands for any one
/// non-empty segment.
fn path_matches(pattern: &str, path: &str) -> bool {
    let mut wanted = pattern.split('/');
    let mut given = path.split('/');
    loop {
        match (wanted.next(), given.next()) {
            (None, None) => return true,
            (Some(w), Some(g)) if w.starts_with('{') && w.ends_with('}') && !g.is_empty() => {}
            (Some(w), Some(g)) if w == g => {}
            _ => return false,
        }
    }
}

/// A request, as the rules look at it.
#[derive(Debug)]
pub(crate) struct Aimed<'a> {
    method: &'a Method,
    path: &'a str,
    api_key: Option<&'a str>,
    idempotency_key: Option<&'a str>,
    /// The query's parameters, then the form's (read only when a rule needs them).
    params: &'a [(String, String)],
}

impl<'a> Aimed<'a> {
    /// `request` with the parameters read from it.
    pub(crate) fn of(request: &'a Request, params: &'a [(String, String)]) -> Self {
        let headers = request.headers();
        let api_key = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let idempotency_key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
        Self {
            method: request.method(),
            path: request.uri().path(),
            api_key,
            idempotency_key,
            params,
        }
    }
}

/// A rule in force, and how often it has fired.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LiveRule {
    /// `aim_1`, `aim_2`, … in the order they were added.
    pub id: String,
    #[serde(flatten)]
    pub rule: AimedRule,
    /// Requests it has fired on.
    pub fired: u32,
    /// Requests it will still fire on.
    pub remaining: u32,
}

/// The rules in force, oldest first.
#[derive(Debug, Default)]
pub(crate) struct AimedFaults {
    rules: Vec<LiveRule>,
    /// Rules added so far, for their ids.
    added: u64,
}

impl AimedFaults {
    /// Adds a rule after the others; the error is the message of a `400`.
    pub(crate) fn add(&mut self, mut rule: AimedRule) -> Result<LiveRule, String> {
        rule.validate()?;
        if self.rules.len() >= MAX_RULES {
            return Err(format!("at most {MAX_RULES} aimed rules may be live at once"));
        }
        self.added += 1;
        let remaining = rule.times;
        let live = LiveRule { id: format!("aim_{}", self.added), rule, fired: 0, remaining };
        self.rules.push(live.clone());
        Ok(live)
    }

    /// The live rules, oldest first.
    pub(crate) fn live(&self) -> &[LiveRule] {
        &self.rules
    }

    /// Forgets every rule; returns how many were live.
    pub(crate) fn clear(&mut self) -> usize {
        std::mem::take(&mut self.rules).len()
    }

    /// Forgets the rules aimed at `api_key`'s requests; returns how many.
    pub(crate) fn forget_account(&mut self, api_key: &str) -> usize {
        let before = self.rules.len();
        self.rules.retain(|live| live.rule.api_key.as_deref() != Some(api_key));
        before - self.rules.len()
    }

    /// Whether a live rule that could fire on this method and path needs the request's
    /// parameters: only then does the middleware read the body before the handler.
    pub(crate) fn needs_params(&self, method: &Method, path: &str) -> bool {
        self.rules
            .iter()
            .any(|live| live.rule.matcher.reads_params() && live.rule.aims_at(method, path))
    }

    /// Fires the first live rule that matches `request`, if any: its fault and delay. A rule
    /// fired its last time is forgotten.
    pub(crate) fn fire(&mut self, request: &Aimed<'_>) -> Option<(Fault, Duration)> {
        let position = self.rules.iter().position(|live| live.rule.matches(request))?;
        let live = self.rules.get_mut(position)?;
        live.fired += 1;
        live.remaining -= 1;
        let plan = (live.rule.fault.fault(), Duration::from_millis(live.rule.latency_ms));
        if live.remaining == 0 {
            self.rules.remove(position);
        }
        Some(plan)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_id_segment_stands_for_any_one_segment() {
        let pattern = "/v1/charges/{id}/capture";
        assert!(path_matches(pattern, "/v1/charges/ch_123/capture"));
        assert!(!path_matches(pattern, "/v1/charges//capture"));
        assert!(!path_matches(pattern, "/v1/charges/ch_123"));
        assert!(!path_matches(pattern, "/v1/charges/ch_123/capture/more"));
        assert!(path_matches("/v1/charges", "/v1/charges"));
        assert!(!path_matches("/v1/charges", "/v1/charges/search"));
    }

    #[test]
    fn a_rule_is_checked_before_it_is_kept() {
        let rule = |json: serde_json::Value| serde_json::from_value::<AimedRule>(json).unwrap();
        let mut faults = AimedFaults::default();
        for bad in [
            serde_json::json!({"fault": "latency"}),
            serde_json::json!({"fault": "drop", "times": 0}),
            serde_json::json!({"fault": "error_after_processing", "method": "GET"}),
            serde_json::json!({"fault": "drop", "path": "v1/charges"}),
            serde_json::json!({"fault": "drop", "latency_ms": 60_001}),
        ] {
            assert!(faults.add(rule(bad.clone())).is_err(), "{bad}");
        }
        let live =
            faults.add(rule(serde_json::json!({"fault": "drop", "method": "post"}))).unwrap();
        assert_eq!((live.id.as_str(), live.rule.method.as_deref()), ("aim_1", Some("POST")));
        assert!(serde_json::from_value::<AimedRule>(serde_json::json!({"fault": "boom"})).is_err());
    }
}
