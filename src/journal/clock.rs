//! The journal's clock: times as fixed-width RFC 3339 UTC text, and
//! milliseconds for heartbeats.

/// The current time as fixed-width RFC 3339 UTC with milliseconds, so that
/// the text sorts as the time does.
pub(crate) fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}
