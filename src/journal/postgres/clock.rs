//! The PostgreSQL journal's clock: the server's, for every lease time.

/// The server's clock in milliseconds: every lease time is stamped and
/// compared on the one clock all runners share, so hosts whose clocks
/// disagree still agree on whether a heartbeat is stale.
pub(super) const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT";
