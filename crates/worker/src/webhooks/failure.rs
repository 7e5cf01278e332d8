//! How a failed delivery is told: the coarse [`Failure`] the account is shown (from the error's
//! chain, never its text), and the whole chain for operators. A name the resolver refuses is one
//! failure whether it resolves to refused addresses or not at all ([`RefusedName`]), so that the
//! delivery log does not tell which internal names exist.

use std::error::Error;
use std::{fmt, io};

use payments_domain::webhooks::Failure;

/// A name that resolves to no address the rule permits, or does not resolve (`cause`): one
/// [`Failure::RefusedAddress`] for the account either way.
#[derive(Debug)]
pub(super) struct RefusedName {
    pub(super) name: String,
    pub(super) cause: Option<io::Error>,
}

impl fmt::Display for RefusedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cause {
            None => write!(f, "{} resolves to no address webhooks may be delivered to", self.name),
            Some(_) => write!(f, "{} could not be resolved", self.name),
        }
    }
}

impl Error for RefusedName {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.cause.as_ref().map(|cause| cause as &(dyn Error + 'static))
    }
}

/// A send that got no answer.
#[derive(Debug)]
pub(super) struct Failed {
    /// What the account is shown.
    pub(super) failure: Failure,
    /// The error's whole chain, for operators.
    pub(super) error: String,
    /// Whether no retry can succeed.
    pub(super) for_good: bool,
}

/// The coarse class of a failed send, from the error's chain.
pub(super) fn failure_of(err: &reqwest::Error) -> Failure {
    if err.is_timeout() {
        return Failure::Timeout;
    }
    let mut source: Option<&(dyn Error + 'static)> = Some(err);
    while let Some(cause) = source {
        if cause.is::<RefusedName>() {
            return Failure::RefusedAddress;
        }
        // An I/O error may wrap another (the TLS connector wraps rustls' in one of kind
        // `Other`), and its `source` skips what it wraps: each is looked at.
        let mut io = cause.downcast_ref::<io::Error>();
        while let Some(err) = io {
            match err.kind() {
                io::ErrorKind::ConnectionRefused => return Failure::ConnectionRefused,
                io::ErrorKind::TimedOut => return Failure::Timeout,
                // What rustls reports for every failed handshake: a certificate refused, or a
                // peer that does not speak TLS.
                io::ErrorKind::InvalidData => return Failure::TlsError,
                _ => io = err.get_ref().and_then(|inner| inner.downcast_ref::<io::Error>()),
            }
        }
        source = cause.source();
    }
    Failure::ConnectionError
}

/// An error with its sources, so a log line says "connection refused", not "error sending".
pub(super) fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use payments_settings::{AddressRanges, WebhookSettings};

    use super::*;
    use crate::webhooks::Deliverer;

    fn deliverer(allow_loopback: bool, deny: &[&str]) -> Deliverer {
        let settings = WebhookSettings {
            allow_loopback,
            deny_ranges: AddressRanges::parse(deny.iter().copied()).unwrap(),
            timeout_ms: 1000,
            connect_timeout_ms: 1000,
            max_deliveries: 32,
            max_deliveries_per_account: 8,
            max_deliveries_per_endpoint: 2,
            pause_after_failures: 20,
            pause_after_minutes: 15,
            pause_ms: 60_000,
            disable_after_hours: 72,
            backoff_base_ms: 1000,
            backoff_cap_ms: 10_000,
            horizon_hours: 72,
            sealing_key: String::new().into(),
            old_sealing_keys: String::new().into(),
        };
        let keys = std::sync::Arc::new(payments_domain::webhooks::SealingKeys::new([1; 32], []));
        Deliverer::new(&settings, keys).unwrap_or_else(|err| panic!("{err}"))
    }

    /// What a delivery to `url` comes to: its class, and whether for good.
    async fn failure(deliverer: &Deliverer, url: &str) -> (Failure, bool) {
        match deliverer.send(url, "whsec_test", b"{}".to_vec()).await {
            Ok(status) => panic!("{url} answered {status}"),
            Err(Failed { failure, error, for_good }) => {
                assert!(!error.is_empty(), "the operator's log has the error's text");
                (failure, for_good)
            }
        }
    }

    /// A listener that reads the request of every connection, answers `reply`, and holds the
    /// connection open.
    async fn listener(reply: &'static [u8]) -> u16 {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut connection, _)) = listener.accept().await {
                // The request first (a client may take an answer sent before it as garbage).
                let _ = connection.read(&mut [0; 4096]).await;
                let _ = connection.write_all(reply).await;
                held.push(connection);
            }
        });
        port
    }

    #[tokio::test]
    async fn a_failed_delivery_is_told_by_its_coarse_class() {
        let d = deliverer(true, &[]);
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let refused = failure(&d, &format!("http://127.0.0.1:{closed_port}/hooks")).await;
        assert_eq!(refused, (Failure::ConnectionRefused, false));
        let silent = listener(b"").await;
        let timeout = failure(&d, &format!("http://127.0.0.1:{silent}/hooks")).await;
        assert_eq!(timeout, (Failure::Timeout, false));
        let plain = listener(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await;
        let tls = failure(&d, &format!("https://127.0.0.1:{plain}/hooks")).await;
        assert_eq!(tls, (Failure::TlsError, false));
    }

    #[tokio::test]
    async fn an_address_the_rule_refuses_is_a_refused_address_named_or_not() {
        let live = deliverer(false, &[]);
        // The URL itself: refused for good.
        let literal = failure(&live, "http://10.0.0.1/hooks").await;
        assert_eq!(literal, (Failure::RefusedAddress, true));
        // A name that resolves only to refused addresses (loopback, allowed but then denied):
        // refused at resolution, and tried again later (the name may change).
        let denied = deliverer(true, &["127.0.0.0/8", "::1/128"]);
        let named = failure(&denied, "http://localhost/hooks").await;
        assert_eq!(named, (Failure::RefusedAddress, false));
    }
}
