//! Approvals: the inbox approves and rejects pending calls in a browser.

pub(crate) mod inbox_browser;
