//! Erasure and retention, end to end: a run (and a batch run) whose goal,
//! tool arguments, tool result, approval edit and model answer carry a
//! unique canary is driven to done by real workers, erased through the
//! API, and then the canary is searched for everywhere: every table of the
//! database, blobs, Redis, the API's answers, the export, and the
//! processes' logs; counts, kinds, sequence numbers, times, usage and cost
//! are unchanged. On the fleet (Postgres, RabbitMQ, Redis) and on the
//! single node (SQLite).

mod erasure;
