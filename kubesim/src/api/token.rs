//! `serviceaccounts/token`: the TokenRequest `kubectl create token` posts.
//!
//! kubesim authenticates no one, so the token it hands out is an unsigned JWT (`alg: none`) with
//! the claims a real API server puts in one (audiences, expiry, the service account's namespace,
//! name and uid), for clients that read them. The service account must exist (404 otherwise), and
//! an `expirationSeconds` under ten minutes is refused as a real API server refuses it.

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use joist_messages::time::rfc3339;
use serde_json::{Value, json};

use crate::object::Pointer;
use crate::{error::ApiError, object::text};

/// The issuer and default audience of an EKS cluster's service account tokens.
const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The lifetime of a token whose request names none: one hour.
const DEFAULT_SECONDS: i64 = 3600;
/// The shortest lifetime the API server grants.
const MIN_SECONDS: i64 = 600;

/// Answers a TokenRequest (`request`, possibly `{}`) for `account` at `now` (epoch seconds).
pub fn issue(account: &Value, request: &Value, now: i64) -> Result<Value, ApiError> {
    let (namespace, name) = (
        text(account, "/metadata/namespace"),
        text(account, "/metadata/name"),
    );
    let seconds = request
        .at("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(DEFAULT_SECONDS);
    if seconds < MIN_SECONDS {
        return Err(ApiError::Invalid {
            kind: "TokenRequest".to_owned(),
            name: name.to_owned(),
            reason: format!(
                "spec.expirationSeconds: Invalid value: {seconds}: may not specify a duration less than 10 minutes"
            ),
        });
    }
    let audiences = match request.at("/spec/audiences") {
        Some(Value::Array(audiences)) if !audiences.is_empty() => Value::Array(audiences.clone()),
        _ => json!([ISSUER]),
    };
    let claims = json!({
        "aud": audiences,
        "exp": now + seconds,
        "iat": now,
        "nbf": now,
        "iss": ISSUER,
        "sub": format!("system:serviceaccount:{namespace}:{name}"),
        "kubernetes.io": {
            "namespace": namespace,
            "serviceaccount": {"name": name, "uid": text(account, "/metadata/uid")},
        },
    });
    let segment = |value: &Value| URL_SAFE_NO_PAD.encode(value.to_string());
    let token = format!(
        "{}.{}.",
        segment(&json!({"alg": "none", "typ": "JWT"})),
        segment(&claims)
    );
    let mut spec = json!({"audiences": audiences, "expirationSeconds": seconds});
    if let Some(bound) = request.at("/spec/boundObjectRef") {
        spec["boundObjectRef"] = bound.clone();
    }
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
        "status": {"token": token, "expirationTimestamp": rfc3339(now + seconds)},
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn account() -> Value {
        json!({"metadata": {"name": "bot", "namespace": "ci", "uid": "u-7"}})
    }

    fn claims(token: &str) -> Value {
        let mut parts = token.split('.');
        let header: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts.next().unwrap()).unwrap()).unwrap();
        assert_eq!(header["alg"], "none");
        let claims = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts.next().unwrap()).unwrap()).unwrap();
        assert_eq!(parts.next(), Some(""), "no signature");
        claims
    }

    #[test]
    fn a_token_names_its_service_account_and_expires_in_an_hour_by_default() {
        let answer = issue(&account(), &json!({}), 1_800_000_000).unwrap();
        assert_eq!(answer["status"]["expirationTimestamp"], "2027-01-15T09:00:00Z");
        assert_eq!(answer["spec"]["expirationSeconds"], 3600);
        let claims = claims(answer["status"]["token"].as_str().unwrap());
        assert_eq!(claims["sub"], "system:serviceaccount:ci:bot");
        assert_eq!(claims["kubernetes.io"]["serviceaccount"]["uid"], "u-7");
        assert_eq!(claims["exp"], 1_800_003_600);
        assert_eq!(claims["aud"], json!([ISSUER]));
    }

    #[test]
    fn a_request_sets_the_audiences_and_lifetime_within_the_minimum() {
        let request = json!({"spec": {"audiences": ["vault"], "expirationSeconds": 7200}});
        let answer = issue(&account(), &request, 0).unwrap();
        assert_eq!(
            claims(answer["status"]["token"].as_str().unwrap())["aud"],
            json!(["vault"])
        );
        assert_eq!(answer["status"]["expirationTimestamp"], "1970-01-01T02:00:00Z");

        let short = json!({"spec": {"expirationSeconds": 60}});
        let error = issue(&account(), &short, 0).unwrap_err().to_string();
        assert!(error.contains("less than 10 minutes"), "{error}");
    }
}
