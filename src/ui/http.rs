//! The web view's requests and answers, plain: a request read whole (a
//! page's forms are small), an answer built by the pages, and what every
//! answer carries: the security headers, and the token check every
//! request passes first.

use std::collections::HashMap;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Response, StatusCode};
use sha2::{Digest as _, Sha256};

use crate::proxy::{Body, is_secret};
use crate::step_key::hex;

/// The largest form a page posts.
const MAX_FORM: usize = 1 << 20;

/// No script, style, image or connection but the page's own; no frame, no
/// form to another place. Journal data is escaped besides: this is the
/// second wall.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; form-action 'self'; \
    frame-ancestors 'none'; base-uri 'none'";

/// A request, read whole.
pub(crate) struct Req {
    pub(crate) method: Method,
    /// The path's segments, percent-decoded.
    pub(crate) path: Vec<String>,
    pub(crate) query: HashMap<String, String>,
    pub(crate) form: HashMap<String, String>,
    /// The body as sent (an API call's JSON).
    pub(crate) body: Bytes,
    headers: hyper::HeaderMap,
}

impl Req {
    pub(crate) async fn read(request: hyper::Request<Incoming>) -> Result<Self, Reply> {
        let (parts, body) = request.into_parts();
        let body = http_body_util::Limited::new(body, MAX_FORM)
            .collect()
            .await
            .map_err(|_| Reply::text(StatusCode::PAYLOAD_TOO_LARGE, "the form is too large"))?
            .to_bytes();
        let path = parts
            .uri
            .path()
            .split('/')
            .filter(|segment| !segment.is_empty())
            .map(|segment| {
                percent_encoding::percent_decode_str(segment)
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .collect();
        let pairs = |bytes: &[u8]| form_urlencoded::parse(bytes).into_owned().collect();
        let is_form = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("application/x-www-form-urlencoded"));
        Ok(Self {
            method: parts.method,
            query: pairs(parts.uri.query().unwrap_or_default().as_bytes()),
            form: if is_form {
                pairs(&body)
            } else {
                HashMap::new()
            },
            body,
            path,
            headers: parts.headers,
        })
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    fn cookie(&self, name: &str) -> Option<&str> {
        self.headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|line| line.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value)
    }

    /// A form field, or a query parameter.
    pub(crate) fn field(&self, name: &str) -> Option<&str> {
        self.form
            .get(name)
            .or_else(|| self.query.get(name))
            .map(String::as_str)
    }
}

/// The operator's token, and what is made of it.
pub(crate) struct Keys {
    token: String,
    /// The CSRF token: derived from the token, so it is the same for every
    /// page and unknown to anyone without the token.
    pub(crate) csrf: String,
    /// The cookie's name: one per port, as cookies are not kept per port.
    cookie: String,
    /// The cookie's value: derived from the token and the port. A browser
    /// sends 127.0.0.1's cookies to every port of it, so another server
    /// there may read this one; it learns a key to this port's pages, not
    /// the token (SPEC 17).
    cookie_value: String,
}

/// How a request stands with the token.
pub(crate) enum Pass {
    /// It carries the bearer token: a script, not a browser.
    Bearer,
    /// It carries the cookie.
    Cookie,
    /// It carries `?token=`: a page's GET trades it for the cookie;
    /// nothing else takes it (a URL ends up in logs and histories).
    Given,
    Denied,
}

impl Keys {
    pub(crate) fn new(token: String, port: u16) -> Self {
        let csrf = hex(&Sha256::digest(
            format!("durun ui csrf\0{token}").as_bytes(),
        ));
        let cookie_value = hex(&Sha256::digest(
            format!("durun ui cookie\0{port}\0{token}").as_bytes(),
        ));
        Self {
            token,
            csrf,
            cookie: format!("durun_ui_{port}"),
            cookie_value,
        }
    }

    pub(crate) fn check(&self, req: &Req) -> Pass {
        let bearer = req
            .header("authorization")
            .and_then(|value| value.strip_prefix("Bearer "));
        if bearer.is_some_and(|given| is_secret(given, &self.token)) {
            Pass::Bearer
        } else if req
            .cookie(&self.cookie)
            .is_some_and(|given| is_secret(given, &self.cookie_value))
        {
            Pass::Cookie
        } else if req
            .query
            .get("token")
            .is_some_and(|given| is_secret(given, &self.token))
        {
            Pass::Given
        } else {
            Pass::Denied
        }
    }

    /// Whether a POST carries the CSRF token, as a form field or header.
    pub(crate) fn csrf_ok(&self, req: &Req) -> bool {
        req.form
            .get("csrf")
            .map(String::as_str)
            .or_else(|| req.header("x-csrf-token"))
            .is_some_and(|given| is_secret(given, &self.csrf))
    }

    /// The cookie that carries the token from the first visit on: not for
    /// scripts, not sent from another site's pages.
    pub(crate) fn set_cookie(&self) -> String {
        format!(
            "{}={}; Path=/; HttpOnly; SameSite=Strict",
            self.cookie, self.cookie_value
        )
    }
}

/// An answer, before the headers every answer gets.
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    content_type: &'static str,
    body: Bytes,
    headers: Vec<(header::HeaderName, String)>,
    /// How long the server took to make it, for `Server-Timing`.
    pub(crate) took: Option<std::time::Duration>,
}

impl Reply {
    pub(crate) fn html(body: String) -> Self {
        Self::new(StatusCode::OK, "text/html; charset=utf-8", body)
    }

    pub(crate) fn json(body: Vec<u8>) -> Self {
        Self::new(StatusCode::OK, "application/json", body)
    }

    pub(crate) fn text(status: StatusCode, body: impl Into<String>) -> Self {
        let mut body = body.into();
        body.push('\n');
        Self::new(status, "text/plain; charset=utf-8", body)
    }

    pub(crate) fn asset(content_type: &'static str, body: &'static str) -> Self {
        Self::new(
            StatusCode::OK,
            content_type,
            Bytes::from_static(body.as_bytes()),
        )
    }

    pub(crate) fn new(
        status: StatusCode,
        content_type: &'static str,
        body: impl Into<Bytes>,
    ) -> Self {
        Self {
            status,
            content_type,
            body: body.into(),
            headers: Vec::new(),
            took: None,
        }
    }

    /// A redirect after a POST or a token in the URL: to `location`, a
    /// path on this server.
    pub(crate) fn see_other(location: &str) -> Self {
        Self::new(StatusCode::SEE_OTHER, "text/plain; charset=utf-8", "")
            .with(header::LOCATION, location.to_owned())
    }

    pub(crate) fn with(mut self, name: header::HeaderName, value: String) -> Self {
        self.headers.push((name, value));
        self
    }

    pub(crate) fn status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    pub(crate) fn into_response(self) -> Response<Body> {
        let body = http_body_util::Full::new(self.body.clone())
            .map_err(|never| match never {})
            .boxed();
        self.into_response_with(body)
    }

    /// The answer's status and headers with `body` as its body (a stream).
    pub(crate) fn into_response_with(self, body: Body) -> Response<Body> {
        let mut response = Response::new(body);
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(self.content_type),
        );
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(POLICY),
        );
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
        headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(took) = self.took
            && let Ok(value) =
                HeaderValue::from_str(&format!("render;dur={:.3}", took.as_secs_f64() * 1000.0))
        {
            headers.insert("server-timing", value);
        }
        for (name, value) in self.headers {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.append(name, value);
            }
        }
        response
    }
}
