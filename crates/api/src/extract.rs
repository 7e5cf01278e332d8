//! Extractors that turn every way a request can be malformed into a problem with a `param`,
//! instead of axum's plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use crate::error::{ApiError, ProblemCode};
use crate::limits::InFlight;

/// Query parameters, deserialised strictly: an unknown or malformed parameter is
/// `400 invalid_request` naming it.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        let deserializer =
            serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(deserializer)
            .map(ApiQuery)
            .map_err(|err| invalid_parameter(&err))
    }
}

/// A path parameter, whose rejection (a segment that does not percent-decode to UTF-8) is a
/// problem like every other error rather than axum's plain-text answer. No id can hold such a
/// segment, so it names nothing: `404 resource_missing`.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::resource_missing(format!(
                "Unrecognized request URL ({}: {}): {rejection}.",
                parts.method,
                parts.uri.path()
            ))
            .with_param("id")),
        }
    }
}

/// The media types a JSON body may be sent as, by essence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonMediaType {
    /// `application/json`
    Json,
    /// `application/merge-patch+json` (RFC 7386), accepted on PATCH.
    MergePatch,
}

impl JsonMediaType {
    /// The essence, as it counts in the fingerprint.
    pub fn essence(self) -> &'static str {
        match self {
            Self::Json => "application/json",
            Self::MergePatch => "application/merge-patch+json",
        }
    }
}

/// A JSON body: its media type, its raw bytes (for fingerprints) and its parsed value.
///
/// An empty body with no `Content-Type` stands for `{}`, so that POSTs whose parameters are all
/// optional can be sent bare. Other media types are `415`; a body over the limit is `413`; JSON
/// that does not match `T` (including unknown members) is `400 invalid_request` naming the member.
#[derive(Debug)]
pub struct JsonBody<T> {
    /// How the body was sent.
    pub media_type: JsonMediaType,
    /// The bytes as received (`{}` for an empty body).
    pub raw: Bytes,
    /// The parsed body.
    pub value: T,
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let accepts_merge_patch = request.method() == axum::http::Method::PATCH;
        let content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|value| value.to_str().map(str::to_owned));
        let media_type = match content_type {
            None => None,
            Some(Ok(value)) => Some(parse_media_type(&value, accepts_merge_patch)?),
            Some(Err(_)) => return Err(unsupported("(not visible ASCII)", accepts_merge_patch)),
        };
        let bytes = read_body(request, state).await?;
        let (media_type, raw) = match media_type {
            Some(media_type) => (media_type, bytes),
            None if bytes.is_empty() => (JsonMediaType::Json, Bytes::from_static(b"{}")),
            None => {
                return Err(ApiError::new(
                    ProblemCode::UnsupportedMediaType,
                    "A request body needs `Content-Type: application/json`.",
                ));
            }
        };
        // A body is an object of named members. serde would read an array as a struct's fields
        // in order (`[500,"usd","pm_card_visa"]` as a payment), which no client means to send.
        if raw.iter().find(|b| !b.is_ascii_whitespace()).is_some_and(|&b| b != b'{') {
            return Err(ApiError::invalid_request(
                "body",
                "The request body must be a JSON object.",
            ));
        }
        let mut deserializer = serde_json::Deserializer::from_slice(&raw);
        let value = serde_path_to_error::deserialize(&mut deserializer)
            .map_err(|err| invalid_body(&err))?;
        deserializer.end().map_err(|err| {
            ApiError::invalid_request("body", format!("The body is not valid JSON: {err}."))
        })?;
        Ok(Self { media_type, raw, value })
    }
}

/// A request's body, read holding no place in flight and within the body deadline
/// ([`InFlight::read_outside`]; a request that did not pass the edge has no places to leave).
pub async fn read_body<S: Send + Sync>(request: Request, state: &S) -> Result<Bytes, ApiError> {
    let in_flight = request.extensions().get::<InFlight>().cloned();
    let read = async {
        Bytes::from_request(request, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    ProblemCode::PayloadTooLarge,
                    "The request body is larger than the limit.",
                )
            } else {
                ApiError::invalid_request("body", "The request body could not be read.")
            }
        })
    };
    match in_flight {
        Some(in_flight) => in_flight.read_outside(read).await,
        None => read.await,
    }
}

fn parse_media_type(value: &str, accepts_merge_patch: bool) -> Result<JsonMediaType, ApiError> {
    let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    match essence.as_str() {
        "application/json" => Ok(JsonMediaType::Json),
        "application/merge-patch+json" if accepts_merge_patch => Ok(JsonMediaType::MergePatch),
        _ => Err(unsupported(value, accepts_merge_patch)),
    }
}

fn unsupported(value: &str, accepts_merge_patch: bool) -> ApiError {
    let accepted = if accepts_merge_patch {
        "`application/json` or `application/merge-patch+json`"
    } else {
        "`application/json`"
    };
    ApiError::new(
        ProblemCode::UnsupportedMediaType,
        format!("The body was sent as `{value}`; this endpoint accepts {accepted}."),
    )
}

fn invalid_parameter<E: std::fmt::Display>(err: &serde_path_to_error::Error<E>) -> ApiError {
    let message = err.inner().to_string();
    let param = param_name(&err.path().to_string(), &message);
    ApiError::invalid_request(param.clone(), format!("Invalid parameter `{param}`: {message}."))
}

fn invalid_body(err: &serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let inner = err.inner();
    if inner.is_syntax() || inner.is_eof() {
        return ApiError::invalid_request("body", format!("The body is not valid JSON: {inner}."));
    }
    let message = strip_position(&inner.to_string());
    let param = param_name(&err.path().to_string(), &message);
    ApiError::invalid_request(param.clone(), format!("Invalid parameter `{param}`: {message}."))
}

/// The parameter an error is about: its path (which for an unknown member already ends with the
/// member), or for a missing member the enclosing path followed by the member.
fn param_name(path: &str, message: &str) -> String {
    let path = (path != "." && !path.is_empty()).then_some(path);
    match (path, quoted_after(message, "missing field `")) {
        (Some(path), Some(member)) => format!("{path}.{member}"),
        (None, Some(member)) => member,
        (Some(path), None) => path.to_owned(),
        (None, None) => quoted_after(message, "unknown field `")
            .or_else(|| quoted_after(message, "duplicate field `"))
            .unwrap_or_else(|| "body".to_owned()),
    }
}

fn quoted_after(message: &str, prefix: &str) -> Option<String> {
    let rest = message.split_once(prefix)?.1;
    Some(rest.split_once('`')?.0.to_owned())
}

fn strip_position(message: &str) -> String {
    match message.rsplit_once(" at line ") {
        Some((head, _)) => head.to_owned(),
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_param_is_the_path_or_the_member_the_message_names() {
        assert_eq!(param_name("limit", "invalid digit found in string"), "limit");
        assert_eq!(param_name("foo", "unknown field `foo`, expected one of `a`"), "foo");
        assert_eq!(param_name(".", "unknown field `foo`, expected one of `a`"), "foo");
        assert_eq!(param_name(".", "missing field `amount`"), "amount");
        assert_eq!(param_name("metadata", "missing field `x`"), "metadata.x");
        assert_eq!(param_name(".", "something else"), "body");
        // `?limit=1&limit=2`, or a member given twice in a body.
        assert_eq!(param_name(".", "duplicate field `limit`"), "limit");
    }

    #[test]
    fn media_types_count_by_their_essence() {
        assert_eq!(
            parse_media_type("Application/JSON; charset=utf-8", false).unwrap(),
            JsonMediaType::Json
        );
        assert!(parse_media_type("application/merge-patch+json", false).is_err());
        assert_eq!(
            parse_media_type("application/merge-patch+json", true).unwrap(),
            JsonMediaType::MergePatch
        );
        assert!(parse_media_type("text/plain", true).is_err());
    }

    /// A router with the real edge and one route that takes a JSON body, for the extractor's
    /// answers as a client sees them.
    mod through_the_edge {
        use axum::Router;
        use axum::body::Body;
        use axum::http::{Request, StatusCode};
        use axum::routing::post;
        use serde::Deserialize;
        use serde_json::Value;
        use tower::ServiceExt;

        use super::super::JsonBody;
        use crate::edge::{self, EdgeConfig};

        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Order {
            #[allow(dead_code)]
            amount: u32,
            #[allow(dead_code)]
            note: Option<String>,
        }

        async fn send(
            method: &str,
            content_type: Option<&str>,
            body: &'static str,
        ) -> (StatusCode, Value) {
            let router = Router::new().route(
                "/orders",
                post(|body: JsonBody<Order>| async move { body.media_type.essence() })
                    .patch(|body: JsonBody<Value>| async move { body.media_type.essence() }),
            );
            let router = edge::wrap(
                router,
                EdgeConfig {
                    public_base_url: "http://test".into(),
                    body_limit_bytes: 64,
                    limits: crate::edge::EdgeLimits::unbounded(),
                    proxies: Default::default(),
                },
            );
            let mut request = Request::builder().method(method).uri("/orders");
            if let Some(content_type) = content_type {
                request = request.header("content-type", content_type);
            }
            let response = router.oneshot(request.body(Body::from(body)).unwrap()).await.unwrap();
            let status = response.status();
            let is_problem = response
                .headers()
                .get("content-type")
                .is_some_and(|v| v == "application/problem+json");
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
            let value = if is_problem {
                serde_json::from_slice(&bytes).unwrap()
            } else {
                Value::String(String::from_utf8(bytes.to_vec()).unwrap())
            };
            (status, value)
        }

        #[tokio::test]
        async fn a_json_body_with_parameters_in_the_media_type_is_accepted() {
            let (status, body) =
                send("POST", Some("application/json; charset=utf-8"), r#"{"amount":5}"#).await;
            assert_eq!((status, body), (StatusCode::OK, Value::from("application/json")));
        }

        #[tokio::test]
        async fn a_body_that_is_not_json_is_unsupported_media_type() {
            let (status, body) = send("POST", Some("text/plain"), "amount=5").await;
            assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
            assert_eq!(body["code"], "unsupported_media_type");
            assert_eq!(body["type"], "http://test/problems/unsupported_media_type");
            let (status, _) = send("POST", None, "amount=5").await;
            assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        }

        #[tokio::test]
        async fn merge_patch_is_accepted_on_patch_only() {
            let (status, body) = send("PATCH", Some("application/merge-patch+json"), "{}").await;
            assert_eq!(
                (status, body),
                (StatusCode::OK, Value::from("application/merge-patch+json"))
            );
            let (status, _) =
                send("POST", Some("application/merge-patch+json"), r#"{"amount":5}"#).await;
            assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        }

        #[tokio::test]
        async fn an_empty_body_without_a_content_type_stands_for_an_empty_object() {
            let (status, body) = send("PATCH", None, "").await;
            assert_eq!((status, body), (StatusCode::OK, Value::from("application/json")));
        }

        #[tokio::test]
        async fn a_streamed_body_over_the_limit_is_payload_too_large() {
            // A body with no Content-Length is only found too large while it is read.
            let router = edge::wrap(
                Router::new().route("/orders", post(|_: JsonBody<Value>| async { "read" })),
                EdgeConfig {
                    public_base_url: "http://test".into(),
                    body_limit_bytes: 64,
                    limits: crate::edge::EdgeLimits::unbounded(),
                    proxies: Default::default(),
                },
            );
            let chunks = futures_chunks(vec![vec![b' '; 40], vec![b' '; 40]]);
            let request = Request::post("/orders")
                .header("content-type", "application/json")
                .body(Body::from_stream(chunks))
                .unwrap();
            let response = router.oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        }

        fn futures_chunks(
            chunks: Vec<Vec<u8>>,
        ) -> impl futures::Stream<Item = Result<Vec<u8>, std::io::Error>> {
            futures::stream::iter(chunks.into_iter().map(Ok))
        }

        #[tokio::test]
        async fn malformed_json_and_bad_members_are_invalid_requests_naming_the_member() {
            let cases = [
                (r#"{"amount":"#, "body"),
                (r#"{"amount":5} trailing"#, "body"),
                (r#"{"amount":-1}"#, "amount"),
                (r#"{"amount":5,"colour":"red"}"#, "colour"),
                (r#"{"note":"x"}"#, "amount"),
                (r#"[5,"x"]"#, "body"),
                (r#" [5]"#, "body"),
                ("5", "body"),
                ("null", "body"),
                (r#""x""#, "body"),
            ];
            for (input, param) in cases {
                let (status, body) = send("POST", Some("application/json"), input).await;
                assert_eq!(status, StatusCode::BAD_REQUEST, "{input}");
                assert_eq!(body["code"], "invalid_request", "{input}");
                assert_eq!(body["param"], param, "{input}: {body}");
            }
        }
    }
}
