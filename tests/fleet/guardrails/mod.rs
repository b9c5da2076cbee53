//! Guardrails that keep secrets: a denied goal or batch item is refused
//! (422) and stored nowhere; tool results are redacted or withheld before
//! they are stored, sent to a model or shown.

mod secrets;
