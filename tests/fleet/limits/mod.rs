//! Limits: a real provider's 429 retried in place, the cooldown shared
//! fleet-wide through Redis, prices applied.

mod provider_fleet;
