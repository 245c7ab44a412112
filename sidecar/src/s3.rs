//! An S3-compatible bucket as the artifact source (`s3://bucket/prefix`): the same `tree-v1`
//! objects as the NATS object store (`<prefix>/tree.<sha256>`, `<prefix>/file.<sha256>`),
//! read with signed GET requests (AWS Signature Version 4).
//!
//! Credentials and endpoint come from the standard AWS environment variables
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, optional `AWS_SESSION_TOKEN`, `AWS_REGION`
//! or `AWS_DEFAULT_REGION`, default `us-east-1`, and `AWS_ENDPOINT_URL_S3` /
//! `AWS_ENDPOINT_URL` for MinIO, Ceph, moto, ...). With an endpoint the bucket is addressed by
//! path (`<endpoint>/<bucket>/<key>`, what S3-compatible servers expect); without one,
//! virtual-hosted on AWS (`https://<bucket>.s3.<region>.amazonaws.com/<key>`).
//!
//! Only GET is needed here (workers never write), so this is the signing of one request over the
//! HTTP client and `ring` the sidecar already has, not an SDK: a whole S3 crate would add
//! minutes of compile time for a function of a few dozen lines. Its signatures are checked by
//! the test server (moto with authentication on, `tests/test_artifacts_s3.py`).

use std::time::{SystemTime, UNIX_EPOCH};

use ring::{digest, hmac};

const UNSIGNED: &str = "UNSIGNED-PAYLOAD";

#[derive(Debug, Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

#[derive(Debug, Clone)]
pub struct S3Source {
    bucket: String,
    prefix: String,
    region: String,
    endpoint: Option<String>,
    credentials: Credentials,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl S3Source {
    /// `s3://bucket[/prefix]` with region, endpoint and credentials from the environment.
    pub fn from_url_and_env(url: &str) -> Result<Self, String> {
        let credentials = Credentials {
            access_key_id: env("AWS_ACCESS_KEY_ID")
                .ok_or("AWS_ACCESS_KEY_ID is not set (needed for an s3:// artifact source)")?,
            secret_access_key: env("AWS_SECRET_ACCESS_KEY")
                .ok_or("AWS_SECRET_ACCESS_KEY is not set (needed for an s3:// artifact source)")?,
            session_token: env("AWS_SESSION_TOKEN"),
        };
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".into());
        let endpoint = env("AWS_ENDPOINT_URL_S3").or_else(|| env("AWS_ENDPOINT_URL"));
        Self::new(url, region, endpoint, credentials)
    }

    pub fn new(
        url: &str,
        region: String,
        endpoint: Option<String>,
        credentials: Credentials,
    ) -> Result<Self, String> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| format!("artifact source {url:?} is not an s3://bucket/prefix URL"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let valid_bucket = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !valid_bucket {
            return Err(format!("{url:?}: {bucket:?} is not an S3 bucket name"));
        }
        if let Some(e) = &endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(format!("S3 endpoint {e:?} is not an http(s) URL"));
            }
        }
        Ok(Self {
            bucket: bucket.into(),
            prefix: prefix.trim_matches('/').into(),
            region,
            endpoint: endpoint.map(|e| e.trim_end_matches('/').to_string()),
            credentials,
        })
    }

    /// Where the source is, for messages (never the credentials).
    pub fn describe(&self) -> String {
        match self.prefix.as_str() {
            "" => format!("s3://{}", self.bucket),
            p => format!("s3://{}/{p}", self.bucket),
        }
    }

    fn key(&self, object: &str) -> String {
        match self.prefix.as_str() {
            "" => object.into(),
            p => format!("{p}/{object}"),
        }
    }

    /// (URL, host, canonical path) of an object.
    fn address(&self, object: &str) -> (String, String, String) {
        let key = uri_encode(&self.key(object), false);
        match &self.endpoint {
            Some(endpoint) => {
                let host = endpoint
                    .split_once("://")
                    .map_or(endpoint.as_str(), |(_, h)| h)
                    .split('/')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let path = format!("/{}/{key}", uri_encode(&self.bucket, true));
                (format!("{endpoint}{path}"), host, path)
            }
            None => {
                let host = format!("{}.s3.{}.amazonaws.com", self.bucket, self.region);
                let path = format!("/{key}");
                (format!("https://{host}{path}"), host, path)
            }
        }
    }

    /// A signed GET request for one object (the caller sends it).
    pub fn get(&self, client: &reqwest::Client, object: &str) -> reqwest::RequestBuilder {
        let (url, host, path) = self.address(object);
        let headers = self.sign_get(&host, &path, SystemTime::now());
        headers
            .into_iter()
            .fold(client.get(url), |req, (name, value)| {
                req.header(name, value)
            })
    }

    /// The headers of a SigV4-signed GET of `path` on `host` at time `now`.
    pub fn sign_get(&self, host: &str, path: &str, now: SystemTime) -> Vec<(&'static str, String)> {
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let (date, amz_date) = amz_dates(secs);
        let mut headers: Vec<(&'static str, String)> = vec![
            ("host", host.to_string()),
            ("x-amz-content-sha256", UNSIGNED.into()),
            ("x-amz-date", amz_date.clone()),
        ];
        if let Some(token) = &self.credentials.session_token {
            headers.push(("x-amz-security-token", token.clone()));
        }
        let signed: Vec<&str> = headers.iter().map(|(n, _)| *n).collect();
        let signed = signed.join(";");
        let canonical_headers: String = headers
            .iter()
            .map(|(n, v)| format!("{n}:{}\n", v.trim()))
            .collect();
        let canonical = format!("GET\n{path}\n\n{canonical_headers}\n{signed}\n{UNSIGNED}");
        let scope = format!("{date}/{}/s3/aws4_request", self.region);
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref())
        );
        let mut key = format!("AWS4{}", self.credentials.secret_access_key).into_bytes();
        for part in [date.as_str(), self.region.as_str(), "s3", "aws4_request"] {
            key = hmac_sha256(&key, part.as_bytes());
        }
        let signature = hex(&hmac_sha256(&key, to_sign.as_bytes()));
        headers.push((
            "authorization",
            format!(
                "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
                self.credentials.access_key_id
            ),
        ));
        headers.retain(|(n, _)| *n != "host"); // the client sets Host from the URL
        headers
    }
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data)
        .as_ref()
        .to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// RFC 3986 encoding as SigV4 wants it: unreserved characters kept, '/' kept in keys.
fn uri_encode(s: &str, encode_slash: bool) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b'/' if !encode_slash => "/".into(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// (`YYYYMMDD`, `YYYYMMDDTHHMMSSZ`) of a Unix time, UTC.
fn amz_dates(secs: u64) -> (String, String) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let date = format!("{year:04}{month:02}{day:02}");
    let time = format!(
        "{date}T{:02}{:02}{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    );
    (date, time)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn example() -> S3Source {
        // The credentials and request of AWS's own SigV4 S3 example ("GET Object").
        S3Source::new(
            "s3://examplebucket",
            "us-east-1".into(),
            None,
            Credentials {
                access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
                secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
                session_token: None,
            },
        )
        .unwrap()
    }

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(amz_dates(0).1, "19700101T000000Z");
        assert_eq!(amz_dates(1_369_353_600).1, "20130524T000000Z");
        assert_eq!(amz_dates(951_782_400).0, "20000229"); // a leap day
    }

    #[test]
    fn signature_matches_a_reference_computation() {
        // Reference: botocore's SigV4 (S3SigV4Auth, UNSIGNED-PAYLOAD) for the same request,
        // computed once and pinned here.
        let src = example();
        let (_, host, path) = src.address("test.txt");
        assert_eq!(host, "examplebucket.s3.us-east-1.amazonaws.com");
        let at = UNIX_EPOCH + Duration::from_secs(1_369_353_600);
        let headers = src.sign_get(&host, &path, at);
        let auth = &headers
            .iter()
            .find(|(n, _)| *n == "authorization")
            .unwrap()
            .1;
        assert!(auth.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature="
        ), "{auth}");
        assert_eq!(auth.rsplit('=').next().unwrap(), REFERENCE_SIGNATURE);
    }

    const REFERENCE_SIGNATURE: &str =
        "071e0fbbb6cf12c8e611e36ed9ee45a49c5fbf50952551d1b46ceff59cc61b56";

    #[test]
    fn urls_are_parsed_and_addressed() {
        let creds = example().credentials;
        let src = S3Source::new(
            "s3://art-bucket/team/a b",
            "eu-central-1".into(),
            Some("http://127.0.0.1:9000/".into()),
            creds.clone(),
        )
        .unwrap();
        assert_eq!(src.describe(), "s3://art-bucket/team/a b");
        let (url, host, path) = src.address("tree.ab");
        assert_eq!(host, "127.0.0.1:9000");
        assert_eq!(path, "/art-bucket/team/a%20b/tree.ab");
        assert_eq!(url, "http://127.0.0.1:9000/art-bucket/team/a%20b/tree.ab");
        for bad in ["http://x/y", "s3://", "s3://UPPER/x", "s3://a/x"] {
            assert!(
                S3Source::new(bad, "us-east-1".into(), None, creds.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
