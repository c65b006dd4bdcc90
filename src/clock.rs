//! durun's clock: times as fixed-width RFC 3339 UTC text (the journal's,
//! and the wake times and timeouts of waiting steps), and milliseconds for
//! heartbeats.

/// The current time as fixed-width RFC 3339 UTC with milliseconds, so that
/// the text sorts as the time does.
pub(crate) fn now() -> String {
    stamp(std::time::SystemTime::now())
}

/// `at` as the journal writes times.
pub(crate) fn stamp(at: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// A time as the journal writes it, or as a user types it (`T` or a
/// space, `Z` or not: UTC either way).
pub(crate) fn parse(text: &str) -> Option<std::time::SystemTime> {
    humantime::parse_rfc3339_weak(text.trim_end_matches('Z')).ok()
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stamp_reads_back() {
        let now = std::time::SystemTime::now();
        let back = super::parse(&super::stamp(now)).expect("parses");
        let apart = now.duration_since(back).unwrap_or_default();
        assert!(apart < std::time::Duration::from_millis(1));
        assert!(super::parse("2026-12-01T09:00:00Z").is_some());
        assert!(super::parse("2026-12-01 09:00:00").is_some());
        assert!(super::parse("tomorrow").is_none());
    }
}
