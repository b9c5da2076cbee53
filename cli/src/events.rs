//! `glia events post KEY [PAYLOAD]`: post an event to `POST /v1/events`
//! (`docs/waits.md`): every run of the tenant waiting on `KEY` with
//! `wait_for_event` gets `PAYLOAD` as its tool result; an event nobody
//! waits for yet is kept for the dispatcher's retention (15 minutes by
//! default).
//!
//! The event's id is its idempotency: the same id posted twice is one
//! event. The command makes one id per invocation unless `--id` names one,
//! so its own retries after an outage ([`Server::call`]) never post the
//! event twice (a second event would reach a later wait on the same key).

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use reqwest::Method;
use serde_json::{Value, json};

use crate::client::{Server, http_client, print_json};

/// `glia events …` subcommands.
#[derive(Subcommand)]
pub enum EventsCommand {
    /// Post an event: prints its id, how many waiting runs it reached and
    /// whether the id was posted before.
    Post {
        #[command(flatten)]
        server: Server,
        /// The event key: 1 to 200 ASCII letters, digits and `. _ : / @ -`.
        key: String,
        /// The payload, JSON (default `{}`); at most 64 KiB.
        payload: Option<String>,
        /// The event's id (a UUID), to post the same event again safely
        /// from a script; default: a new one per invocation.
        #[arg(long)]
        id: Option<uuid::Uuid>,
        /// Print the API's answer (JSON).
        #[arg(long)]
        json: bool,
    },
}

/// Run a `glia events` command.
pub async fn events(cmd: EventsCommand) -> Result<()> {
    let EventsCommand::Post {
        server,
        key,
        payload,
        id,
        json,
    } = cmd;
    // What the dispatcher would refuse is refused here, before anything is sent.
    if !glia_proto::wait::valid_event_key(&key) {
        bail!(
            "key {key:?} must be 1 to {} characters of letters, digits and . _ : / @ -",
            glia_proto::wait::MAX_EVENT_KEY_LEN
        );
    }
    let payload: Value = match payload {
        None => json!({}),
        Some(text) => serde_json::from_str(&text).context("the payload is not JSON")?,
    };
    let id = id.unwrap_or_else(uuid::Uuid::now_v7);
    let body = json!({ "key": key, "payload": payload, "id": id });
    let answer = server
        .call(
            &http_client()?,
            Method::POST,
            "/v1/events",
            Some(&body),
            &[],
        )
        .await
        .context("posting the event")?
        .checked()?;
    if json {
        return print_json(&answer);
    }
    let again = if answer["duplicate"] == true {
        " (posted before: nothing new)"
    } else {
        ""
    };
    outln!(
        "event {} reached {} waiting run(s){again}",
        answer["id"].as_str().unwrap_or("-"),
        answer["delivered"]
    );
    Ok(())
}
