//! The console: the pages of runs in a real browser.

mod runs_browser;
