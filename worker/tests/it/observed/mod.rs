//! A sink that hands every event to a worker's `RunObserver`, for the
//! metrics tests.

use glia_proto::Event;

/// Hands everything to the observer, as the worker's sink does.
pub struct Observed(pub glia_worker::metrics::RunObserver);

#[glia_agent::async_trait]
impl glia_agent::agent::EventSink for Observed {
    async fn record(&mut self, event: &Event) -> Result<(), glia_agent::agent::SinkError> {
        self.0.record(event);
        Ok(())
    }

    fn live(&self, event: &glia_proto::LiveEvent) {
        self.0.live(event);
    }
}
