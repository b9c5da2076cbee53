//! Test support: an event log built one event at a time, each event applied
//! through [`RunState::apply`] (the one transition function), so a test can
//! only build logs the contract accepts, and can check that an illegal event
//! is refused without changing the state. Used by this crate's own tests and
//! re-exported by `glia-testkit`; pure like the rest of the crate.

use chrono::DateTime;
use uuid::Uuid;

use crate::{Event, EventKind, Phase, RunState, TransitionError};

/// A run's state and the events applied to it so far, for run id
/// [`Uuid::nil`], every event stamped at the Unix epoch with the next
/// sequence number (1, 2, …).
#[derive(Debug, Clone)]
pub struct EventLog {
    /// The state after the last applied event.
    pub state: RunState,
    /// The events applied, in order.
    pub events: Vec<Event>,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog::new()
    }
}

impl EventLog {
    /// An empty log (phase [`Phase::Idle`], head sequence 0).
    pub fn new() -> Self {
        EventLog {
            state: RunState::new(Uuid::nil()),
            events: Vec::new(),
        }
    }

    /// The event `kind` would be as the next one of this log.
    pub fn event(&self, kind: EventKind) -> Event {
        Event {
            run_id: Uuid::nil(),
            seq: self.state.head_seq + 1,
            at: DateTime::UNIX_EPOCH,
            kind,
        }
    }

    /// Apply `kind` as the next event. Panics, naming the event and the
    /// refusal, when the transition function refuses it.
    pub fn ok(&mut self, kind: EventKind) -> &mut Self {
        let e = self.event(kind);
        if let Err(err) = self.state.apply(&e) {
            panic!("{} should apply: {err}", e.kind.name());
        }
        self.events.push(e);
        self
    }

    /// Apply `kind`, expecting a refusal; returns the error. Panics when it
    /// applies or when the refusal changed the state.
    pub fn refused(&mut self, kind: EventKind) -> TransitionError {
        let before = self.state.clone();
        let err = self
            .state
            .apply(&self.event(kind))
            .expect_err("should be refused");
        assert_eq!(self.state, before, "a refused event changes nothing");
        err
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.state.phase
    }
}
