//! Limits: a real provider's 429 retried in place, the cooldown shared
//! fleet-wide through Redis, prices applied; tenant input bounded.

mod provider_fleet;
mod tenant_input;
