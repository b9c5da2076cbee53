//! Approvals: the inbox approves and rejects pending calls in a browser.

mod inbox_browser;
