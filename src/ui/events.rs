//! `GET /api/tasks/ID/events`: the task's events as server-sent events
//! (SPEC 20), from the start or from right after `Last-Event-ID` (or
//! `?after=ID`, for a client that cannot set the header), then live as
//! the journal gets them. The ids are the journal's, so a client that
//! comes back, to this server or to one started since, misses nothing and
//! gets nothing twice.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::{Response, StatusCode};

use super::Shared;
use super::http::{Reply, Req};
use crate::proxy::Body;
use crate::task::events::{Cursor, Event, Follower};

/// How often the stream looks at the journal for new events.
const POLL: Duration = Duration::from_millis(100);
/// How long the stream stays quiet before it sends a comment, which keeps
/// proxies from closing it and tells the server of a client gone.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The most journal rows read at a time.
const BATCH: u64 = 256;

pub(super) async fn stream(req: &Req, shared: Arc<Shared>, task: &str) -> Response<Body> {
    let given = req
        .header("last-event-id")
        .or_else(|| req.query.get("after").map(String::as_str))
        .filter(|id| !id.is_empty());
    let cursor = match given.map(Cursor::after) {
        None => Cursor::default(),
        Some(Some(cursor)) => cursor,
        Some(None) => {
            return Reply::text(
                StatusCode::BAD_REQUEST,
                "durun ui: Last-Event-ID is not an event id this server gave: leave it out to start from the task's first event",
            )
            .into_response();
        }
    };
    let task = task.to_owned();
    let live = crate::task::live::Live::of(&shared.settings, &shared.location, &task);
    let there = {
        let shared = Arc::clone(&shared);
        let task = task.clone();
        tokio::task::spawn_blocking(move || {
            shared.read_task(&task, |_, record| {
                Ok(crate::task::shown_status(&record, &shared.settings)
                    == crate::journal::TaskStatus::Running)
            })
        })
        .await
        .map_err(anyhow::Error::from)
        .and_then(|read| read)
    };
    let running = match there {
        Ok(Some(running)) => running,
        Ok(None) => {
            return Reply::text(StatusCode::NOT_FOUND, format!("durun ui: no task {task}"))
                .into_response();
        }
        Err(err) => {
            return Reply::text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("durun ui: cannot read the journal: {err:#}"),
            )
            .into_response();
        }
    };
    let follower = Follower::new(&task, cursor, live, running);
    let (sender, body) = http_body_util::channel::Channel::<Bytes, std::io::Error>::new(4);
    tokio::spawn(pump(shared, follower, sender));
    Reply::new(StatusCode::OK, "text/event-stream", "").into_response_with(body.boxed())
}

/// Sends the task's events as they come, until the client goes.
async fn pump(
    shared: Arc<Shared>,
    mut follower: Follower,
    mut sender: http_body_util::channel::Sender<Bytes, std::io::Error>,
) {
    // A client that lost the stream comes back within a second.
    if sender
        .send_data(Bytes::from_static(b"retry: 1000\n\n"))
        .await
        .is_err()
    {
        return;
    }
    let mut quiet = Duration::ZERO;
    loop {
        let read = {
            let shared = Arc::clone(&shared);
            tokio::task::spawn_blocking(move || {
                let events = shared.read(|journal| match journal {
                    Some(journal) => follower.next(journal, BATCH),
                    None => Ok(Vec::new()),
                });
                (follower, events)
            })
            .await
        };
        let events = match read {
            Ok((back, Ok(events))) => {
                follower = back;
                events
            }
            Ok((_, Err(err))) => {
                // The client comes back (`retry`) and goes on from its last id.
                let said = serde_json::json!({"error": format!("{err:#}")});
                let _ = sender
                    .send_data(Bytes::from(format!("event: error\ndata: {said}\n\n")))
                    .await;
                return;
            }
            Err(_) => return,
        };
        let full = events.len() as u64 >= BATCH;
        if events.is_empty() {
            if quiet >= KEEP_ALIVE {
                quiet = Duration::ZERO;
                if sender
                    .send_data(Bytes::from_static(b": quiet\n\n"))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        } else {
            quiet = Duration::ZERO;
            let frames: String = events.iter().map(Event::sse).collect();
            if sender.send_data(Bytes::from(frames)).await.is_err() {
                return;
            }
        }
        if !full {
            tokio::time::sleep(POLL).await;
            quiet += POLL;
        }
    }
}
