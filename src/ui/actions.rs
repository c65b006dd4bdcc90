//! The page's actions. Each runs the `durun` command it stands for, this
//! very binary on the same journal, so a button does exactly what the
//! command line does, checks and messages included, and the page can do
//! nothing the command line cannot.

use hyper::StatusCode;
use serde_json::json;

use super::Shared;
use super::html::{page, task_href, text};
use super::http::{Reply, Req};
use crate::own_command::{EditFile, Said};

/// The actions, as the last segment of `POST /tasks/ID/ACTION`.
pub(super) const ACTIONS: [&str; 6] = ["approve", "reject", "signal", "cancel", "resolve", "fork"];

/// The command line of `action` on task `id` from the form, or what is
/// wrong with the form. A value is never read as an option: options are
/// given as `--name=VALUE` and the task id and other values come after
/// `--`, so a form value that starts with `-` stays a value.
fn command(req: &Req, id: &str, action: &str) -> Result<(Vec<String>, Option<EditFile>), String> {
    let field = |name: &str| {
        req.field(name)
            .map(str::trim)
            .filter(|value| !value.is_empty())
    };
    let mut options: Vec<String> = Vec::new();
    let mut values = vec![id.to_owned()];
    let mut edit = None;
    match action {
        "approve" => {
            if let Some(comment) = field("comment") {
                options.push(format!("--data={}", json!({ "comment": comment })));
            }
            // The budget's raise (SPEC 19): checked by the command.
            if let Some(usd) = field("add_usd") {
                options.push(format!("--add-usd={usd}"));
            }
            if let Some(tokens) = field("add_tokens") {
                options.push(format!("--add-tokens={tokens}"));
            }
        }
        "reject" => {
            if let Some(reason) = field("reason") {
                options.push(format!("--reason={reason}"));
            }
        }
        "signal" => {
            values.push(field("name").ok_or("a signal needs a name")?.to_owned());
            if let Some(data) = field("data") {
                options.push(format!("--data={data}"));
            }
        }
        "resolve" => {
            values.push(field("step").ok_or("which step?")?.to_owned());
            match field("how") {
                Some("retry") => options.push("--retry".to_owned()),
                Some("output") => options.push(format!(
                    "--output={}",
                    field("value").ok_or("the output, as JSON, is missing")?
                )),
                Some("fail") => options.push(format!(
                    "--fail={}",
                    field("value").ok_or("the reason is missing")?
                )),
                _ => return Err("resolve how: retry, output or fail".to_owned()),
            }
        }
        "fork" => {
            options.push(format!(
                "--from-step={}",
                field("from").ok_or("fork from which step?")?
            ));
            // The step page's edited answer: a file for `--output`.
            if let Some(output) = req
                .field("output")
                .filter(|output| !output.trim().is_empty())
            {
                let file =
                    EditFile::new(output).map_err(|err| format!("cannot keep the edit: {err}"))?;
                options.push(format!("--output={}", file.path().display()));
                edit = Some(file);
            }
        }
        _ => {}
    }
    let mut args = vec![action.to_owned()];
    args.extend(options);
    args.push("--".to_owned());
    args.extend(values);
    Ok((args, edit))
}

/// Runs this `durun` binary with `args` on the server's journal, in `cwd`
/// (the server's own directory if `None`).
pub(super) fn durun(shared: &Shared, args: &[String], cwd: Option<&std::path::Path>) -> Said {
    crate::own_command::durun(&shared.settings, args, cwd)
}

pub(super) fn act(req: &Req, shared: &Shared, id: &str, action: &str) -> Reply {
    let back = task_href(id);
    let (ok, message, location) = match command(req, id, action) {
        Err(message) => (false, message, back),
        Ok((args, edit)) => {
            let said = durun(shared, &args, None);
            drop(edit);
            let location = if action == "fork" && said.ok && !said.printed.is_empty() {
                task_href(&said.printed)
            } else {
                back
            };
            (said.ok, said.message, location)
        }
    };
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    if req
        .header("accept")
        .is_some_and(|accept| accept.contains("application/json"))
    {
        return Reply::json(
            json!({"ok": ok, "message": message, "location": location})
                .to_string()
                .into_bytes(),
        )
        .status(status);
    }
    // Without the script: a page that says what happened, and the way back.
    Reply::html(page(
        action,
        &shared.keys.csrf,
        None,
        &format!(
            "<h1>{}</h1><pre class=\"{}\">{}</pre><p><a href=\"{}\">back to the task</a></p>",
            if ok { "Done" } else { "Not done" },
            if ok { "said" } else { "error" },
            text(&message),
            text(&location)
        ),
    ))
    .status(status)
}
