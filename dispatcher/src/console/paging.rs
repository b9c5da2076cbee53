//! The list pages' shared parts: the session and the `?after=`/`?before=`
//! cursor, and the Next link's cursor. A leaf: the pages import it, it
//! imports none of them.

use std::collections::HashMap;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use uuid::Uuid;

use crate::app::App;
use crate::inbox::{Session, error_page, session, to_login};

/// A list page's session and its cursor, `?{param}=ID` (the page's Next
/// link), or the answer: to sign in, or a 400 page naming `param` (`what`:
/// the kind of id, `a batch`).
// The error is the page to answer with, as `inbox::checked_post`'s.
#[allow(clippy::result_large_err)]
pub(super) fn list_start(
    app: &App,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    param: &str,
    what: &str,
) -> Result<(Session, Option<Uuid>), Response> {
    let s = session(app, headers).ok_or_else(to_login)?;
    match q.get(param).map(|a| a.trim()).filter(|a| !a.is_empty()) {
        None => Ok((s, None)),
        Some(a) => match a.parse::<Uuid>() {
            Ok(id) => Ok((s, Some(id))),
            Err(_) => Err(error_page(
                Some(&s),
                StatusCode::BAD_REQUEST,
                &format!("{param}: not {what} id (use the page's Next link)"),
            )),
        },
    }
}

/// The Next link's cursor: the id of a full page's last entry.
pub(super) fn next_cursor<T>(found: &[T], page: usize, id: impl Fn(&T) -> Uuid) -> Option<Uuid> {
    (found.len() == page)
        .then(|| found.last().map(id))
        .flatten()
}
