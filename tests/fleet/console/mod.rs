//! The console: its pages in a real browser.

mod console_more_browser;
mod runs_browser;
