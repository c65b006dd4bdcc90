//! `durun ui`: a web view of the journal (SPEC 15), served from the binary.
//!
//! Pages are HTML made on the server with every journal string escaped
//! (`html.rs`), with one small script for live updates and actions and one
//! style sheet, both embedded: no request leaves for another host. Every
//! request carries the token (`http.rs`); an action is a POST with the
//! CSRF token too, and runs the very `durun` command it names
//! (`actions.rs`), so the page can do nothing the command line cannot.
//! The HTTP loop is the proxy's; journal reads run on tokio's blocking
//! threads (the PostgreSQL client blocks), each with a journal from a
//! small pool.

mod actions;
mod api;
mod compare_page;
mod events;
mod html;
mod http;
mod pages;
mod step_page;
mod task_page;
mod timeline;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use hyper::body::Incoming;
use hyper::header;
use hyper::{Method, Request, Response, StatusCode};

use crate::cli::UiArgs;
use crate::error::Failure;
use crate::journal::{Access, Journal, Location};
use crate::proxy::Body;
use crate::settings::Settings;
use http::{Keys, Pass, Reply, Req};

/// What every request's handler shares.
struct Shared {
    keys: Keys,
    location: Location,
    settings: Settings,
    /// Journals not in use, for the next request.
    pool: Mutex<Vec<Box<dyn Journal>>>,
    /// `--allow-submit`: `POST /api/tasks` may queue a task.
    allow_submit: bool,
    /// `/mcp` alone (`durun mcp-server --listen`).
    mcp_only: bool,
}

impl Shared {
    /// Runs `read` with a journal from the pool (a new one if none is
    /// free), or with none while the journal has not been made yet.
    fn read<T>(&self, read: impl FnOnce(Option<&mut dyn Journal>) -> Result<T>) -> Result<T> {
        let pooled = self.pool.lock().map_or(None, |mut pool| pool.pop());
        let mut journal = match pooled {
            Some(journal) => journal,
            None if !self.location.exists()? => return read(None),
            None => self.location.open(Access::Read, &self.settings)?,
        };
        let result = read(Some(journal.as_mut()));
        // A journal that failed may be broken (a lost connection): not kept.
        if result.is_ok()
            && let Ok(mut pool) = self.pool.lock()
            && pool.len() < 4
        {
            pool.push(journal);
        }
        result
    }
}

impl Shared {
    /// Runs `read` on task `id` as the journal has it; `None` when there
    /// is no such task (or no journal yet).
    fn read_task<T>(
        &self,
        id: &str,
        read: impl FnOnce(&mut dyn Journal, crate::journal::TaskRecord) -> Result<T>,
    ) -> Result<Option<T>> {
        self.read(|journal| {
            let Some(journal) = journal else {
                return Ok(None);
            };
            match journal.task(id)? {
                Some(task) => read(journal, task).map(Some),
                None => Ok(None),
            }
        })
    }
}

pub(crate) fn exec(args: &UiArgs, settings: &Settings) -> Result<i32> {
    serve(
        &Serving {
            listen: args.listen,
            token_file: args.token_file.as_deref(),
            open: args.open,
            allow_submit: args.allow_submit,
            mcp_only: false,
        },
        settings,
    )
}

/// `durun mcp-server --listen`: the MCP server on the streamable HTTP
/// transport (SPEC 22), at `/mcp` alone, with the web view's listener and
/// token rules.
pub(crate) fn serve_mcp(
    listen: SocketAddr,
    token_file: Option<&std::path::Path>,
    settings: &Settings,
) -> Result<i32> {
    serve(
        &Serving {
            listen,
            token_file,
            open: false,
            allow_submit: false,
            mcp_only: true,
        },
        settings,
    )
}

/// What a server serves, and where.
struct Serving<'a> {
    listen: SocketAddr,
    token_file: Option<&'a std::path::Path>,
    open: bool,
    allow_submit: bool,
    /// `/mcp` alone (`durun mcp-server --listen`), not the web view.
    mcp_only: bool,
}

fn serve(args: &Serving<'_>, settings: &Settings) -> Result<i32> {
    let token = token(args.listen, args.token_file)?;
    let location = Location::of(settings)?;
    // A journal this user may not read, or one that is not a journal, is
    // said now, once, and not on every page.
    let first = if location.exists()? {
        Some(location.open(Access::Read, settings)?)
    } else {
        None
    };
    let listener = std::net::TcpListener::bind(args.listen).map_err(|err| {
        Failure::config(format!("cannot serve on {}: {err}", args.listen)).hint(
            if err.kind() == std::io::ErrorKind::AddrInUse {
                "another program (another `durun ui`?) has that port: pick another with --listen 127.0.0.1:PORT, or 127.0.0.1:0 for any free one"
            } else {
                "pick another address with --listen ADDR:PORT"
            },
        )
    })?;
    listener.set_nonblocking(true)?;
    let at: SocketAddr = listener.local_addr()?;
    let shown_token = args.token_file.is_none().then_some(token.as_str());
    let url = if args.mcp_only {
        // A client sends the token in a header, never in the URL.
        let url = format!("http://{at}/mcp");
        match shown_token {
            Some(token) => println!("{url}\n{token}"),
            None => println!("{url}"),
        }
        url
    } else {
        let url = match shown_token {
            Some(token) => format!("http://{at}/?token={token}"),
            None => format!("http://{at}/"),
        };
        println!("{url}");
        url
    };
    crate::report::say(&format!(
        "serving {} at {}{}; Ctrl-C stops",
        location.describe(),
        if args.mcp_only {
            url.clone()
        } else {
            format!("http://{at}/")
        },
        match (shown_token.is_some(), args.mcp_only) {
            (true, false) => "",
            (true, true) => " (send the token above as Authorization: Bearer TOKEN)",
            (false, _) => " (with the token in --token-file)",
        }
    ));
    if args.open {
        open_browser(&url);
    }
    let shared = Arc::new(Shared {
        keys: Keys::new(token, at.port()),
        location,
        settings: settings.clone(),
        pool: Mutex::new(first.into_iter().collect()),
        allow_submit: args.allow_submit,
        mcp_only: args.mcp_only,
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    std::thread::Builder::new()
        .name("durun-ui-signals".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                let _ = stop.send(());
            }
        })?;
    runtime.block_on(crate::proxy::accept(
        listener,
        Arc::clone(&shared),
        stopped,
        |request, shared| Box::pin(async move { Ok(handle(request, shared).await) }),
    ));
    runtime.shutdown_background();
    // The PostgreSQL client runs a runtime of its own, which may not be
    // dropped inside tokio's: the pool goes here, outside.
    if let Ok(mut pool) = shared.pool.lock() {
        pool.clear();
    }
    crate::report::say("stopped serving");
    Ok(0)
}

/// The operator's token from `--token-file`, or a new one; a listener
/// that others can reach must have the operator's.
fn token(listen: SocketAddr, token_file: Option<&std::path::Path>) -> Result<String> {
    let Some(path) = token_file else {
        if !listen.ip().is_loopback() {
            return Err(Failure::usage(format!(
                "--listen {listen} is reachable from other hosts: it needs --token-file FILE"
            ))
            .hint("put a long random token in a file only you can read (e.g. `openssl rand -hex 24 > ~/.durun-ui-token`); visitors bring it as ?token=, a cookie, or Authorization: Bearer")
            .into());
        }
        return Ok(crate::proxy::secret()?);
    };
    let text = std::fs::read_to_string(path).map_err(|err| {
        Failure::config(format!(
            "cannot read the token file {}: {err}",
            path.display()
        ))
    })?;
    let token = text.trim();
    if token.len() < 16
        || !token
            .bytes()
            .all(|byte| byte.is_ascii_graphic() && !b";,=".contains(&byte))
    {
        return Err(Failure::config(format!(
            "the token in {} is not usable: it must be one line of at least 16 printable characters, without spaces, `;`, `,` or `=`",
            path.display()
        ))
        .hint("`openssl rand -hex 24` makes one")
        .into());
    }
    Ok(token.to_owned())
}

/// `durun mcp-server --listen`'s one endpoint, `/mcp`, on the streamable
/// HTTP transport: a client POSTs a message (or a batch) with the token as
/// a bearer, and gets the answer as JSON (202 for notifications alone).
/// The tools run durun's commands, which may take long (`resume`, `test`):
/// off the server's thread.
async fn mcp(req: Req, shared: Arc<Shared>) -> Reply {
    if !matches!(shared.keys.check(&req), Pass::Bearer) {
        return Reply::text(
            StatusCode::UNAUTHORIZED,
            "durun mcp-server: send the token it printed as Authorization: Bearer TOKEN",
        )
        .with(header::WWW_AUTHENTICATE, "Bearer".to_owned());
    }
    if req.path != ["mcp"] {
        return Reply::text(StatusCode::NOT_FOUND, "durun mcp-server serves /mcp alone");
    }
    if req.method != Method::POST {
        // No stream of the server's own: it sends nothing unasked.
        return Reply::text(
            StatusCode::METHOD_NOT_ALLOWED,
            "durun mcp-server takes POST at /mcp",
        )
        .with(header::ALLOW, "POST".to_owned());
    }
    let body = req.body.clone();
    let answered =
        tokio::task::spawn_blocking(move || crate::mcp_server::answers(&body, &shared.settings))
            .await;
    match answered {
        Ok(Some(answers)) => Reply::json(answers.to_string().into_bytes()),
        Ok(None) => Reply::text(StatusCode::ACCEPTED, ""),
        Err(err) => Reply::text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("durun mcp-server: the call failed: {err}"),
        ),
    }
}

fn open_browser(url: &str) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    let opened = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if let Err(err) = opened {
        crate::report::say(&format!(
            "cannot start {opener} to open the page ({err}); open the URL above"
        ));
    }
}

async fn handle(request: Request<Incoming>, shared: Arc<Shared>) -> Response<Body> {
    let req = match Req::read(request).await {
        Ok(req) => req,
        Err(reply) => return reply.into_response(),
    };
    if shared.mcp_only {
        return mcp(req, shared).await.into_response();
    }
    let pass = shared.keys.check(&req);
    if matches!(pass, Pass::Denied) {
        return Reply::text(
            StatusCode::UNAUTHORIZED,
            "durun ui: this page needs its token: open the URL `durun ui` printed, or send Authorization: Bearer TOKEN",
        )
        .with(header::WWW_AUTHENTICATE, "Bearer".to_owned())
        .into_response();
    }
    let a_page = req.method == Method::GET && req.path.first().is_none_or(|first| first != "api");
    if matches!(pass, Pass::Given) && !a_page {
        return Reply::text(
            StatusCode::UNAUTHORIZED,
            "durun ui: the API and the actions take the token in an Authorization: Bearer header or the page's cookie, never in the URL",
        )
        .with(header::WWW_AUTHENTICATE, "Bearer".to_owned())
        .into_response();
    }
    if matches!(pass, Pass::Given) {
        // The token leaves the address bar (and the history) for the cookie.
        let rest: Vec<(&String, &String)> = req
            .query
            .iter()
            .filter(|(key, _)| *key != "token")
            .collect();
        let mut location = format!(
            "/{}",
            req.path
                .iter()
                .map(|segment| html::segment(segment))
                .collect::<Vec<_>>()
                .join("/")
        );
        if !rest.is_empty() {
            location.push('?');
            location.push_str(
                &form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(rest)
                    .finish(),
            );
        }
        return Reply::see_other(&location)
            .with(header::SET_COOKIE, shared.keys.set_cookie())
            .into_response();
    }
    // A script with the bearer token sends no CSRF token: no browser sends
    // that header on its own, so no other site can make one send it.
    if req.method == Method::GET
        && let [api, tasks, id, last] = req.path.as_slice()
        && (api.as_str(), tasks.as_str(), last.as_str()) == ("api", "tasks", "events")
    {
        let id = id.clone();
        return events::stream(&req, shared, &id).await;
    }
    let vouched = matches!(pass, Pass::Bearer) || shared.keys.csrf_ok(&req);
    let started = std::time::Instant::now();
    let serving = Arc::clone(&shared);
    let reply = tokio::task::spawn_blocking(move || route(&req, &serving, vouched))
        .await
        .unwrap_or_else(|_| {
            Reply::text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "durun ui: the page failed",
            )
        });
    let mut reply = reply;
    reply.took = Some(started.elapsed());
    reply.into_response()
}

/// The page, file or action a request asks for.
/// `vouched`: a POST may act (it carries the CSRF token, or the bearer
/// token).
fn route(req: &Req, shared: &Shared, vouched: bool) -> Reply {
    let path: Vec<&str> = req.path.iter().map(String::as_str).collect();
    let answer = match (&req.method, path.as_slice()) {
        (&Method::GET, ["assets", "ui.css"]) => Ok(Reply::asset(
            "text/css; charset=utf-8",
            include_str!("assets/ui.css"),
        )),
        (&Method::GET, ["assets", "ui.js"]) => Ok(Reply::asset(
            "text/javascript; charset=utf-8",
            include_str!("assets/ui.js"),
        )),
        (&Method::GET, []) => pages::task_list(req, shared),
        (&Method::GET, ["tokens"]) => pages::tokens(shared),
        (&Method::GET, ["workers"]) => pages::workers(shared),
        (&Method::GET, ["diff"]) => compare_page::diff(req, shared),
        (&Method::GET, ["tasks", id]) => task_page::task(req, shared, id),
        (&Method::GET, ["tasks", id, "steps", step]) => step_page::step(shared, id, step),
        (&Method::GET, ["api", "tasks"]) => pages::api_tasks(shared),
        (&Method::GET, ["api", "tasks", id]) => task_page::api_task(shared, id),
        (&Method::GET, ["api", "live"]) => pages::live(req, shared),
        (&Method::POST, ["api", ..]) if !vouched => Ok(Reply::text(
            StatusCode::FORBIDDEN,
            "durun ui: an API call needs Authorization: Bearer TOKEN (or, from the page, its CSRF token)",
        )),
        (&Method::POST, ["api", "tasks"]) => Ok(api::submit(req, shared)),
        (&Method::POST, ["api", "tasks", id, "signals", name]) => {
            Ok(api::signal(req, shared, id, name))
        }
        (&Method::POST, ["tasks", id, action]) if actions::ACTIONS.contains(action) => {
            if shared.keys.csrf_ok(req) {
                Ok(actions::act(req, shared, id, action))
            } else {
                Ok(Reply::text(
                    StatusCode::FORBIDDEN,
                    "durun ui: the form's CSRF token is missing or wrong: reload the page and try again",
                ))
            }
        }
        (_, ["tasks", _, action]) if actions::ACTIONS.contains(action) => Ok(Reply::text(
            StatusCode::METHOD_NOT_ALLOWED,
            "durun ui: an action is a POST from the task's page",
        )
        .with(header::ALLOW, "POST".to_owned())),
        _ => Ok(Reply::text(StatusCode::NOT_FOUND, "durun ui: no such page")),
    };
    answer.unwrap_or_else(|err| {
        let failure = crate::report::with_journal(&format!("{err:#}")).into_owned();
        Reply::html(html::page(
            "error",
            &shared.keys.csrf,
            None,
            &format!(
                "<h1>durun could not read the journal</h1><pre class=\"error\">{}</pre>",
                html::text(&failure)
            ),
        ))
        .status(StatusCode::INTERNAL_SERVER_ERROR)
    })
}
