//! Placeholder: see ARCHITECTURE.md. This crate is built by a later issue.
