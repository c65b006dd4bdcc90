//! A connection lost under a run (a server restart, a network cut): the
//! journal connects again with backoff and does the failed call again
//! (SPEC 17). It tries for half the lease's stale time: a runner that
//! could not renew its lease for that long stops itself anyway, and by
//! then another runner may take the task over once the server is back. A
//! run whose lease was taken meanwhile learns it from the fence of its
//! next write, as it would without the outage.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::PostgresJournal;
use super::cached::Conn;
use super::open::connect;

/// The first wait before connecting again; it doubles up to [`LONGEST`].
const FIRST: Duration = Duration::from_millis(50);
const LONGEST: Duration = Duration::from_secs(1);

/// Whether a call is made for the first time or again on a new connection,
/// after one whose outcome is unknown: its commit may have landed before
/// the connection broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Attempt {
    First,
    Again,
}

impl PostgresJournal {
    /// `call`, made again on a new connection for as long as the one it
    /// ran on is lost and the time to reconnect lasts.
    pub(super) fn again<T>(
        &mut self,
        mut call: impl FnMut(&mut Self, Attempt) -> Result<T>,
    ) -> Result<T> {
        let err = match call(self, Attempt::First) {
            Err(err) if self.lost(&err) => err,
            done => return done,
        };
        let lost_at = Instant::now();
        let deadline = lost_at + (self.stale / 2).max(Duration::from_secs(1));
        if !self.quiet {
            crate::journal::notice(&format!(
                "warning: lost {} ({err:#}); reconnecting for up to {}",
                self.name,
                seconds(deadline - lost_at)
            ));
        }
        let mut wait = FIRST;
        let mut last = err;
        while Instant::now() < deadline {
            std::thread::sleep(wait.min(deadline.saturating_duration_since(Instant::now())));
            wait = (wait * 2).min(LONGEST);
            if let Err(err) = self.connect_again() {
                last = err;
                continue;
            }
            match call(self, Attempt::Again) {
                Err(err) if self.lost(&err) => last = err,
                done => {
                    if !self.quiet {
                        crate::journal::notice(&format!(
                            "{} is back after {}",
                            self.name,
                            seconds(lost_at.elapsed())
                        ));
                    }
                    return done;
                }
            }
        }
        Err(last.context(format!(
            "{} did not come back within {}",
            self.name,
            seconds(lost_at.elapsed())
        )))
    }

    /// Whether `err` left the connection unusable: the server went away
    /// or ended the session, not a query that failed on a live one.
    fn lost(&self, err: &anyhow::Error) -> bool {
        self.client.client.is_closed()
            || err.chain().any(|cause| {
                cause
                    .downcast_ref::<postgres::Error>()
                    .is_some_and(|err| err.is_closed() || is_shutdown(err))
            })
    }

    /// A new session, set up as the lost one was: its `synchronous_commit`
    /// and the channels it listened on. A notification sent while no
    /// session listened is lost, so the next watch looks at the task's row.
    fn connect_again(&mut self) -> Result<()> {
        let client = connect(&self.config, self.stale)?;
        self.client = Conn::new(client, self.client.unsynced);
        // `normal` went with the connection (`unsynced`); `full` is the
        // session's own.
        if self.synced_session {
            self.sync_session()?;
        }
        if self.listening {
            self.client.client.batch_execute("LISTEN durun_work")?;
        }
        if let Some(channel) = &self.channel {
            self.client
                .client
                .batch_execute(&format!("LISTEN {channel}"))?;
            self.missed = true;
        }
        Ok(())
    }
}

/// `2.5s`.
fn seconds(duration: Duration) -> String {
    format!("{:.1}s", duration.as_secs_f64())
}

/// The server said it is going away (SQLSTATE class 57P: shutdown, crash,
/// cannot connect now) or the connection failed (class 08).
fn is_shutdown(err: &postgres::Error) -> bool {
    err.code().is_some_and(|code| {
        let code = code.code();
        code.starts_with("57P") || code.starts_with("08")
    })
}
