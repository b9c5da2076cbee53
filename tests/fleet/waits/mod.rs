//! Durable timers and event waits (issue 32), on Postgres, RabbitMQ and
//! Redis with `glia` processes: a run sleeps across a dispatcher restart
//! and wakes; a run waiting for an event whose worker was killed (`kill
//! -9`) completes once the event is posted; an event posted before the wait
//! began is delivered when it begins; a run admitted with `start_at` parks
//! across a dispatcher restart and starts once, not before its time. No
//! worker holds a waiting run. Every wait is "eventually, within a generous
//! deadline": the machine is busy.

mod bench;
mod timers;
