//! The queries of the limits every run and worker shares (SPEC 19): a
//! request's turn, a pause, and the slots of the requests in flight.

use super::{NOW_MS, Sql};

/// A limit's row, made at its first use.
pub(crate) static LIMIT_ROW: Sql =
    Sql::new("INSERT INTO limits (name) VALUES ($1) ON CONFLICT (name) DO NOTHING");

/// A request's turn under limit `$1`: it goes `$2` ms after the one
/// before (`rpm`), and its tokens `$3` ms after theirs (`tpm`), never
/// before a pause ends; returns its time and the clock's, in ms.
pub(crate) static LIMIT_TURN: Sql = Sql::made(|| {
    format!(
        "UPDATE limits SET next_at = greatest(next_at, {NOW_MS}, paused_until) + $2,
             tokens_at = greatest(tokens_at, {NOW_MS}, paused_until) + $3
         WHERE name = $1
         RETURNING greatest(next_at - $2, tokens_at - $3), {NOW_MS}"
    )
});

/// Pauses limit `$1` for `$2` ms from now (an upstream's Retry-After).
pub(crate) static LIMIT_PAUSE: Sql = Sql::made(|| {
    format!(
        "UPDATE limits SET paused_until = greatest(paused_until, {NOW_MS} + $2) WHERE name = $1"
    )
});

/// Limit `$1`'s row, locked while a request takes one of its slots.
pub(crate) static LIMIT_LOCK: Sql = Sql::new("SELECT name FROM limits WHERE name = $1 FOR UPDATE");

/// The slots of limit `$1`, with the clock.
pub(crate) static LIMIT_SLOTS: Sql = Sql::made(|| {
    format!("SELECT id, host, pid, taken_at, {NOW_MS} FROM limit_slots WHERE name = $1")
});

/// A slot that no request holds any more.
pub(crate) static LIMIT_SLOT_FREE: Sql = Sql::new("DELETE FROM limit_slots WHERE id = $1");

/// A request in flight takes a slot of limit `$1`.
pub(crate) static LIMIT_SLOT_TAKE: Sql = Sql::made(|| {
    format!(
        "INSERT INTO limit_slots (name, host, pid, taken_at) VALUES ($1, $2, $3, {NOW_MS}) RETURNING id, {NOW_MS}"
    )
});
