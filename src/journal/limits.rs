//! The state of the limits every run and worker on the journal share
//! (SPEC 19): when the next request under a limit may go, a pause an
//! upstream asked for, and the slots of the requests in flight. Written
//! without waiting for the disk: a crash loses at most a pacing step.

use anyhow::Result;

use super::sql;
use super::tx::Tx;
use crate::lease::Holder;

/// The turn of a request under limit `name`: it goes `interval_ms` after
/// the one before, its tokens `tokens_ms` after theirs. How long it waits
/// for it, in ms.
pub(crate) fn turn(tx: &mut dyn Tx, name: &str, interval_ms: u64, tokens_ms: u64) -> Result<u64> {
    let args = [name.into(), interval_ms.into(), tokens_ms.into()];
    let read = |row: &dyn super::tx::Row| Ok((row.some_int(0)?, row.some_int(1)?));
    let mut at = tx.query_opt(&sql::LIMIT_TURN, &args, read)?;
    if at.is_none() {
        // The limit's first request: its row is made, once.
        tx.execute(&sql::LIMIT_ROW, &[name.into()])?;
        at = tx.query_opt(&sql::LIMIT_TURN, &args, read)?;
    }
    Ok(at.map_or(0, |(turn, now)| turn.saturating_sub(now).max(0) as u64))
}

/// Pauses limit `name` for `ms` from now.
pub(crate) fn pause(tx: &mut dyn Tx, name: &str, ms: u64) -> Result<()> {
    tx.execute(&sql::LIMIT_ROW, &[name.into()])?;
    tx.execute(&sql::LIMIT_PAUSE, &[name.into(), ms.into()])?;
    Ok(())
}

/// A slot of limit `name` for a request in flight, if fewer than `max`
/// are held. A slot whose process is gone (on this host), or that is older
/// than `stale_ms` (elsewhere), is freed first.
pub(crate) fn take_slot(
    tx: &mut dyn Tx,
    name: &str,
    max: u64,
    me: &Holder,
    stale_ms: i64,
) -> Result<Option<i64>> {
    if tx
        .query_opt(&sql::LIMIT_LOCK, &[name.into()], |_| Ok(()))?
        .is_none()
    {
        tx.execute(&sql::LIMIT_ROW, &[name.into()])?;
        tx.query_opt(&sql::LIMIT_LOCK, &[name.into()], |_| Ok(()))?;
    }
    let mut held = Vec::new();
    tx.query(&sql::LIMIT_SLOTS, &[name.into()], &mut |row| {
        held.push((
            row.some_int(0)?,
            row.some_text(1)?.to_owned(),
            row.some_int(2)?,
            row.some_int(3)?,
            row.some_int(4)?,
        ));
        Ok(())
    })?;
    let mut live = 0;
    for (id, host, pid, taken_at, now) in held {
        let gone = if host == me.host {
            u32::try_from(pid).map_or(true, |pid| crate::lease::process_started(pid).is_none())
        } else {
            now - taken_at > stale_ms
        };
        if gone {
            tx.execute(&sql::LIMIT_SLOT_FREE, &[id.into()])?;
        } else {
            live += 1;
        }
    }
    if live >= max {
        return Ok(None);
    }
    let slot = tx.query_opt(
        &sql::LIMIT_SLOT_TAKE,
        &[name.into(), me.host.as_str().into(), me.pid.into()],
        |row| row.some_int(0),
    )?;
    Ok(slot)
}

/// Frees a slot: its request ended.
pub(crate) fn free_slot(tx: &mut dyn Tx, slot: i64) -> Result<()> {
    tx.execute(&sql::LIMIT_SLOT_FREE, &[slot.into()])?;
    Ok(())
}
