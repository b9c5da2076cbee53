//! The RabbitMQ adapter of [`JobQueue`] (lapin).
//!
//! # Topology
//!
//! For a queue named `N` ([`QueueOptions::queue`]), every (re)connection
//! declares, idempotently:
//!
//! - `N`: a durable **quorum** queue (`x-queue-type: quorum`) with
//!   `x-delivery-limit` ([`QueueOptions::delivery_limit`]) and dead-lettering
//!   to `N.dlx` with routing key `N`: the starts;
//! - `N.resume`: the resumes ([`Job::resume`]), declared like `N` (same
//!   delivery limit, dead-lettered to `N.dlx` with routing key `N`, so into
//!   the same `N.dlq`). RabbitMQ 3.10's quorum queues have no message
//!   priorities: resumes go first because they have a queue and a consumer
//!   of their own (see *Resumes first*);
//! - `N.dlx`: a durable direct exchange;
//! - `N.dlq`: a durable quorum queue bound to `N.dlx` with key `N`. Jobs that
//!   were nacked without requeue, exceeded the delivery limit, or whose body
//!   is not a [`Job`] end up here.
//!
//! Declaring `N` with arguments different from an existing queue of that
//! name fails (`PRECONDITION_FAILED`); [`RabbitQueue::connect`] reports it.
//!
//! # Messages
//!
//! A job is published to the default exchange with routing key `N` (a
//! start) or `N.resume` (a resume), `mandatory`, persistent (`delivery_mode` 2), `content-type:
//! application/json`, body = the [`Job`] as JSON. Publishing waits for the
//! broker's confirm (the channel is in confirm mode); for a quorum queue the
//! confirm means a majority of its replicas wrote the message to disk.
//!
//! # Resumes first
//!
//! The consuming channel has two consumers, one per queue, each with
//! [`QueueOptions::prefetch`]. [`JobQueue::next`] polls the resume consumer
//! before the start consumer (a biased select), so a resume that has reached
//! this process is handed out before any start, however many starts wait
//! (delivered ahead or still in `N`); [`JobQueue::next_resume`] polls the
//! resume consumer only. [`JobQueue::depth`] and [`JobQueue::stats`] count
//! both queues.
//!
//! # Durability
//!
//! A confirmed job survives a broker restart (tested against a private node:
//! a clean stop, and a SIGKILL of a node whose queue was a few minutes old).
//! Caveat measured on RabbitMQ 3.10.8: a node SIGKILLed within about three
//! minutes of *declaring* a quorum queue may come back with that queue empty
//! — it registers a fresh Raft server for it and the old log, with its
//! messages, is orphaned (the server registry is a DETS table, apparently
//! saved every three minutes). Postgres is the truth: the reconciler
//! re-enqueues runs whose jobs were lost.
//!
//! # Connections and reconnects
//!
//! Publishing and consuming use two separate connections (the broker blocks
//! publishing connections under memory or disk alarms; consumers must keep
//! draining meanwhile). lapin's own automatic recovery is **not** used: this
//! adapter owns the reconnect loop.
//!
//! - [`JobQueue::next`] never fails because the broker is away: when its
//!   connection or channel dies (or the broker cancels either consumer) it
//!   reconnects with exponential backoff
//!   (backon, [`QueueOptions::reconnect_min`] to
//!   [`QueueOptions::reconnect_max`], jittered), redeclares the topology, sets
//!   the prefetch again and resumes consuming from both queues. It only returns
//!   [`QueueError::Closed`], after [`RabbitQueue::close`].
//! - [`JobQueue::publish`] makes at most [`QueueOptions::publish_attempts`]
//!   attempts, reconnecting between them with the same backoff, then returns
//!   [`QueueError::Unavailable`]. A publish whose connection died before its
//!   confirm arrived is sent again, so a job may be delivered twice
//!   (at-least-once: a consumer drops a job whose `head_seq` is stale).
//!
//! # Acknowledgements
//!
//! Each [`Delivery`]'s acker holds the delivery tag and the channel the job
//! came on. A channel that has died takes its unacked deliveries with it; the
//! broker redelivers them (with `redelivered` set). Acking one of them returns
//! [`QueueError::Unavailable`], which a consumer may log and ignore.

use std::fmt::Display;
use std::sync::Arc;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBuilder};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions,
    BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, Consumer,
    ExchangeKind,
};
use tokio::sync::{Mutex, watch};
use tracing::{debug, warn};

use crate::{Acker, Delivery, Job, JobQueue, QueueError, QueueStats};

/// How a [`RabbitQueue`] names, sizes and retries things.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueOptions {
    /// Name of the job queue (the starts); `<queue>.resume`, `<queue>.dlx`
    /// and `<queue>.dlq` are derived from it. At most 248 bytes (AMQP short
    /// string, with room for the suffixes).
    pub queue: String,
    /// How many unacked deliveries the broker pushes to this consumer ahead
    /// of [`JobQueue::next`] (`basic.qos` prefetch count, per channel).
    /// At least 1.
    pub prefetch: u16,
    /// `x-delivery-limit`: how many times a job may be returned to the queue
    /// (nacked with requeue, or its consumer's channel died) before the
    /// broker dead-letters it. Capped at `i32::MAX`.
    pub delivery_limit: u32,
    /// First delay before reconnecting after a failure.
    pub reconnect_min: Duration,
    /// Largest delay between reconnection attempts, jitter included (the
    /// backoff doubles towards it, jittered between half of it and it).
    pub reconnect_max: Duration,
    /// Attempts per [`JobQueue::publish`] (and per [`JobQueue::depth`] or
    /// dead-letter call) before it gives up with
    /// [`QueueError::Unavailable`]. At least 1.
    pub publish_attempts: usize,
    /// How long one attempt waits for the broker's confirm before the publish
    /// fails with [`QueueError::NotConfirmed`] (the job may or may not have
    /// been taken).
    pub confirm_timeout: Duration,
    /// Bound on opening a connection (TCP, AMQP handshake, channel, topology).
    pub connect_timeout: Duration,
    /// Name shown for this client's connections in the broker's management
    /// tools (`<name> publisher`, `<name> consumer`).
    pub connection_name: String,
}

impl QueueOptions {
    /// Options for queue `queue`: prefetch 16, delivery limit 5, reconnect
    /// backoff 100 ms → 5 s, 5 publish attempts, 30 s confirm timeout, 10 s
    /// connect timeout.
    pub fn new(queue: impl Into<String>) -> QueueOptions {
        QueueOptions {
            queue: queue.into(),
            prefetch: 16,
            delivery_limit: 5,
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
            publish_attempts: 5,
            confirm_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            connection_name: "glia".into(),
        }
    }

    /// Name of the queue of resumes: `<queue>.resume`.
    pub fn resume_queue(&self) -> String {
        format!("{}.resume", self.queue)
    }

    /// Name of the dead-letter queue: `<queue>.dlq`.
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dlq", self.queue)
    }

    /// Name of the dead-letter exchange: `<queue>.dlx`.
    pub fn dead_letter_exchange(&self) -> String {
        format!("{}.dlx", self.queue)
    }

    /// Delays between attempts: from `reconnect_min`, doubling, jittered,
    /// never over `reconnect_max`; at most `times` of them (`None`: no end).
    /// backon adds its jitter (up to 100 %) after capping, so it is given
    /// half the cap, and each delay is clamped as well.
    fn delays(&self, times: Option<usize>) -> impl Iterator<Item = Duration> + use<> {
        let max = self.reconnect_max.max(self.reconnect_min);
        let builder = ExponentialBuilder::default()
            .with_min_delay(self.reconnect_min)
            .with_max_delay((max / 2).max(self.reconnect_min))
            .with_jitter();
        let builder = match times {
            Some(n) => builder.with_max_times(n),
            None => builder.without_max_times(),
        };
        builder.build().map(move |d| d.min(max))
    }
}

impl Default for QueueOptions {
    /// [`QueueOptions::new`]`("glia.jobs")`.
    fn default() -> Self {
        QueueOptions::new("glia.jobs")
    }
}

/// The publishing connection: a confirm-mode channel on its own connection.
struct PubLink {
    conn: Connection,
    channel: Channel,
    generation: u64,
}

impl PubLink {
    fn healthy(&self) -> bool {
        self.conn.status().connected() && self.channel.status().connected()
    }
}

/// The consuming connection: a channel with the prefetch set and a consumer
/// on each queue.
struct ConsLink {
    conn: Arc<Connection>,
    channel: Channel,
    starts: Consumer,
    resumes: Consumer,
}

/// The job queue on RabbitMQ. See the [module documentation](self) for the
/// topology, the message format and the reconnect behaviour.
///
/// Share it (`Arc<RabbitQueue>`) between the tasks of a process: publishes
/// run concurrently on one channel; concurrent [`JobQueue::next`] calls take
/// turns on one consumer.
pub struct RabbitQueue {
    url: String,
    opts: QueueOptions,
    publisher: Mutex<Option<Arc<PubLink>>>,
    consumer: Mutex<Option<ConsLink>>,
    /// The consumer's connection, reachable without the consumer lock (which
    /// a pending `next` holds), so `close`/`drop_connections` can end it.
    consumer_conn: StdMutex<Option<Arc<Connection>>>,
    generation: AtomicU64,
    shutdown: watch::Sender<bool>,
}

/// What one attempt of an operation on the publishing link concluded.
enum Attempt {
    /// The link is broken (or the broker is away): reconnect and try again.
    Retry(QueueError),
    /// Final answer; do not retry.
    Fail(QueueError),
}

fn unavailable(what: &str, e: impl Display) -> QueueError {
    QueueError::Unavailable(format!("{what}: {e}"))
}

fn short(s: &str) -> ShortString {
    ShortString::from(s)
}

/// Close a connection politely, bounded; errors are irrelevant (it is being
/// dropped either way).
async fn close_conn(conn: &Connection) {
    if conn.status().connected() {
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            conn.close(200, short("glia: closing")),
        )
        .await;
    }
}

/// Declare the queue of starts, the queue of resumes, their dead-letter
/// exchange and dead-letter queue.
async fn declare_topology(ch: &Channel, o: &QueueOptions) -> Result<(), QueueError> {
    let dlx = o.dead_letter_exchange();
    let dlq = o.dead_letter_queue();
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let quorum = || {
        let mut args = FieldTable::default();
        args.insert(
            short("x-queue-type"),
            AMQPValue::LongString(LongString::from("quorum")),
        );
        args
    };
    ch.exchange_declare(
        short(&dlx),
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .map_err(|e| unavailable(&format!("declare exchange {dlx}"), e))?;
    ch.queue_declare(short(&dlq), durable, quorum())
        .await
        .map_err(|e| unavailable(&format!("declare queue {dlq}"), e))?;
    ch.queue_bind(
        short(&dlq),
        short(&dlx),
        short(&o.queue),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .map_err(|e| unavailable(&format!("bind {dlq} to {dlx}"), e))?;
    let mut args = quorum();
    let limit = i32::try_from(o.delivery_limit).unwrap_or(i32::MAX);
    args.insert(short("x-delivery-limit"), AMQPValue::LongInt(limit));
    args.insert(
        short("x-dead-letter-exchange"),
        AMQPValue::LongString(LongString::from(dlx.as_str())),
    );
    args.insert(
        short("x-dead-letter-routing-key"),
        AMQPValue::LongString(LongString::from(o.queue.as_str())),
    );
    for queue in [o.queue.clone(), o.resume_queue()] {
        ch.queue_declare(short(&queue), durable, args.clone())
            .await
            .map_err(|e| unavailable(&format!("declare queue {queue}"), e))?;
    }
    Ok(())
}

impl RabbitQueue {
    /// Connect to the broker at `url` (`amqp://user:pass@host:port/vhost`,
    /// vhost URL-encoded: `%2f` is `/`), declare the topology and open the
    /// publishing channel in confirm mode. The consuming connection opens on
    /// the first [`JobQueue::next`].
    ///
    /// Errors: [`QueueError::Unavailable`] when the broker cannot be reached
    /// within [`QueueOptions::connect_timeout`], refuses the credentials, or
    /// already has a queue of that name with other arguments. No retry here:
    /// a process that starts before its broker retries `connect` itself.
    pub async fn connect(url: &str, opts: QueueOptions) -> Result<RabbitQueue, QueueError> {
        let mut opts = opts;
        opts.prefetch = opts.prefetch.max(1);
        opts.publish_attempts = opts.publish_attempts.max(1);
        if opts.queue.is_empty() || opts.queue.len() > 248 {
            return Err(QueueError::Unavailable(format!(
                "queue name must be 1 to 248 bytes, got {:?}",
                opts.queue
            )));
        }
        let queue = RabbitQueue {
            url: url.to_owned(),
            opts,
            publisher: Mutex::new(None),
            consumer: Mutex::new(None),
            consumer_conn: StdMutex::new(None),
            generation: AtomicU64::new(0),
            shutdown: watch::channel(false).0,
        };
        let link = queue.open_publisher().await?;
        *queue.publisher.lock().await = Some(Arc::new(link));
        Ok(queue)
    }

    /// The options in use.
    pub fn options(&self) -> &QueueOptions {
        &self.opts
    }

    /// Jobs waiting in the dead-letter queue `<queue>.dlq` (passive declare).
    /// Errors as [`JobQueue::depth`].
    pub async fn dead_letter_depth(&self) -> Result<u64, QueueError> {
        let dlq = self.opts.dead_letter_queue();
        self.message_count(&dlq).await
    }

    /// Take the oldest dead-lettered job, if any, without waiting
    /// (`basic.get` on `<queue>.dlq`). Ack the returned delivery to remove it,
    /// or nack it with `requeue` to leave it there. A body that is not a
    /// [`Job`] is left in place and reported as
    /// [`QueueError::Unavailable`]. Other errors as [`JobQueue::depth`].
    pub async fn next_dead_letter(&self) -> Result<Option<Delivery>, QueueError> {
        let dlq = self.opts.dead_letter_queue();
        self.on_publisher_link(|link| {
            let dlq = dlq.clone();
            async move {
                // A channel of its own: the delivery's acker keeps it open
                // until the job is acked.
                let ch = link
                    .conn
                    .create_channel()
                    .await
                    .map_err(|e| Attempt::Retry(unavailable("open channel", e)))?;
                let got = ch
                    .basic_get(short(&dlq), BasicGetOptions { no_ack: false })
                    .await
                    .map_err(|e| {
                        if e.is_amqp_soft_error() {
                            Attempt::Fail(unavailable(&format!("get from {dlq}"), e))
                        } else {
                            Attempt::Retry(unavailable(&format!("get from {dlq}"), e))
                        }
                    })?;
                let Some(msg) = got else {
                    let _ = ch.close(200, short("done")).await;
                    return Ok(None);
                };
                let d = msg.delivery;
                match serde_json::from_slice::<Job>(&d.data) {
                    Ok(job) => Ok(Some(Delivery {
                        job,
                        redelivered: d.redelivered,
                        enqueued_at: enqueued_at(&d.properties),
                        acker: Box::new(RabbitAcker {
                            acker: d.acker,
                            _channel: ch,
                        }),
                    })),
                    Err(e) => {
                        let _ = d
                            .acker
                            .nack(BasicNackOptions {
                                multiple: false,
                                requeue: true,
                            })
                            .await;
                        Err(Attempt::Fail(unavailable(
                            &format!("dead letter in {dlq} is not a job"),
                            e,
                        )))
                    }
                }
            }
        })
        .await
    }

    /// Delete both queues, the dead-letter queue and exchange, with whatever
    /// they hold. For tests and decommissioning; a running consumer of this
    /// queue gets cancelled and would redeclare an empty topology when it
    /// reconnects. Errors as [`JobQueue::depth`].
    pub async fn delete_topology(&self) -> Result<(), QueueError> {
        let o = self.opts.clone();
        self.on_publisher_link(|link| {
            let o = o.clone();
            async move {
                let ch = link
                    .conn
                    .create_channel()
                    .await
                    .map_err(|e| Attempt::Retry(unavailable("open channel", e)))?;
                for q in [o.queue.clone(), o.resume_queue(), o.dead_letter_queue()] {
                    ch.queue_delete(short(&q), QueueDeleteOptions::default())
                        .await
                        .map_err(|e| {
                            Attempt::Retry(unavailable(&format!("delete queue {q}"), e))
                        })?;
                }
                let dlx = o.dead_letter_exchange();
                ch.exchange_delete(short(&dlx), ExchangeDeleteOptions::default())
                    .await
                    .map_err(|e| {
                        Attempt::Retry(unavailable(&format!("delete exchange {dlx}"), e))
                    })?;
                let _ = ch.close(200, short("done")).await;
                Ok(())
            }
        })
        .await
    }

    /// Close both connections now, as a network failure would, without
    /// shutting the queue down: unacked deliveries go back to the queue (and
    /// come again with `redelivered` set), their ackers answer
    /// [`QueueError::Unavailable`], and the next call — or a pending
    /// [`JobQueue::next`] — reconnects. Sheds a link an operator suspects is
    /// stale; tests use it to exercise the reconnect loop.
    pub async fn drop_connections(&self) {
        let publisher = self.publisher.lock().await.take();
        if let Some(link) = publisher {
            close_conn(&link.conn).await;
        }
        let consumer = self
            .consumer_conn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(conn) = consumer {
            close_conn(&conn).await;
        }
    }

    /// Shut down for good: pending and later [`JobQueue::next`] calls return
    /// [`QueueError::Closed`], publishes too; both connections close, so the
    /// broker requeues every delivery not acked yet. Ack what you handled
    /// before closing. Idempotent.
    pub async fn close(&self) {
        self.shutdown.send_replace(true);
        let consumer = self
            .consumer_conn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(conn) = consumer {
            close_conn(&conn).await;
        }
        let publisher = self.publisher.lock().await.take();
        if let Some(link) = publisher {
            close_conn(&link.conn).await;
        }
        if let Some(link) = self.consumer.lock().await.take() {
            close_conn(&link.conn).await;
        }
    }

    fn is_shut_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    fn properties(&self, role: &str) -> ConnectionProperties {
        ConnectionProperties::default().with_connection_name(LongString::from(format!(
            "{} {role}",
            self.opts.connection_name
        )))
    }

    async fn open_connection(&self, role: &str) -> Result<Connection, QueueError> {
        match tokio::time::timeout(
            self.opts.connect_timeout,
            Connection::connect(&self.url, self.properties(role)),
        )
        .await
        {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(unavailable("connect", e)),
            Err(_) => Err(QueueError::Unavailable(format!(
                "connect: no answer within {:?}",
                self.opts.connect_timeout
            ))),
        }
    }

    /// Run `setup` (channel, topology, …) on a fresh connection within
    /// [`QueueOptions::connect_timeout`]; close the connection if it fails.
    async fn set_up<T>(
        &self,
        conn: &Connection,
        what: &str,
        setup: impl Future<Output = Result<T, QueueError>>,
    ) -> Result<T, QueueError> {
        let result = match tokio::time::timeout(self.opts.connect_timeout, setup).await {
            Ok(result) => result,
            Err(_) => Err(QueueError::Unavailable(format!(
                "{what}: no answer within {:?}",
                self.opts.connect_timeout
            ))),
        };
        if result.is_err() {
            close_conn(conn).await;
        }
        result
    }

    async fn open_publisher(&self) -> Result<PubLink, QueueError> {
        let conn = self.open_connection("publisher").await?;
        let setup = async {
            let channel = conn
                .create_channel()
                .await
                .map_err(|e| unavailable("open channel", e))?;
            declare_topology(&channel, &self.opts).await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| unavailable("confirm.select", e))?;
            Ok::<_, QueueError>(channel)
        };
        let channel = self.set_up(&conn, "publisher setup", setup).await?;
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        debug!(queue = %self.opts.queue, generation, "rabbitmq publisher connected");
        Ok(PubLink {
            conn,
            channel,
            generation,
        })
    }

    async fn open_consumer(&self) -> Result<ConsLink, QueueError> {
        let conn = Arc::new(self.open_connection("consumer").await?);
        let setup = async {
            let channel = conn
                .create_channel()
                .await
                .map_err(|e| unavailable("open channel", e))?;
            declare_topology(&channel, &self.opts).await?;
            // Not global: each consumer of the channel has its own prefetch.
            channel
                .basic_qos(self.opts.prefetch, BasicQosOptions { global: false })
                .await
                .map_err(|e| unavailable("basic.qos", e))?;
            let consume = |queue: String| {
                let channel = channel.clone();
                async move {
                    channel
                        .basic_consume(
                            short(&queue),
                            short(""),
                            BasicConsumeOptions::default(),
                            FieldTable::default(),
                        )
                        .await
                        .map_err(|e| unavailable(&format!("basic.consume {queue}"), e))
                }
            };
            // Resumes first, so that resumes already waiting reach this
            // process before the starts do.
            let resumes = consume(self.opts.resume_queue()).await?;
            let starts = consume(self.opts.queue.clone()).await?;
            Ok::<_, QueueError>((channel, starts, resumes))
        };
        let (channel, starts, resumes) = self.set_up(&conn, "consumer setup", setup).await?;
        *self.consumer_conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        debug!(queue = %self.opts.queue, "rabbitmq consumer connected");
        Ok(ConsLink {
            conn,
            channel,
            starts,
            resumes,
        })
    }

    /// The current publishing link, opening one if there is none or it died.
    async fn publisher_link(&self) -> Result<Arc<PubLink>, QueueError> {
        let mut slot = self.publisher.lock().await;
        if self.is_shut_down() {
            return Err(QueueError::Closed);
        }
        if let Some(link) = slot.as_ref() {
            if link.healthy() {
                return Ok(link.clone());
            }
            let old = slot.take();
            if let Some(old) = old {
                close_conn(&old.conn).await;
            }
        }
        let link = Arc::new(self.open_publisher().await?);
        *slot = Some(link.clone());
        Ok(link)
    }

    /// Forget the publishing link of `generation` (if it is still the
    /// current one) so the next attempt reconnects.
    async fn discard_publisher(&self, generation: u64) {
        let mut slot = self.publisher.lock().await;
        if slot.as_ref().is_some_and(|l| l.generation == generation) {
            let old = slot.take();
            drop(slot);
            if let Some(old) = old {
                close_conn(&old.conn).await;
            }
        }
    }

    /// Run `op` on the publishing link, reconnecting between at most
    /// [`QueueOptions::publish_attempts`] attempts with backoff.
    async fn on_publisher_link<T, F, Fut>(&self, op: F) -> Result<T, QueueError>
    where
        F: Fn(Arc<PubLink>) -> Fut,
        Fut: Future<Output = Result<T, Attempt>>,
    {
        let mut delays = self.opts.delays(Some(self.opts.publish_attempts - 1));
        let mut shutdown = self.shutdown.subscribe();
        loop {
            let (err, generation) = match self.publisher_link().await {
                Ok(link) => {
                    let generation = link.generation;
                    match op(link).await {
                        Ok(v) => return Ok(v),
                        Err(Attempt::Fail(e)) => return Err(e),
                        Err(Attempt::Retry(e)) => (e, Some(generation)),
                    }
                }
                Err(QueueError::Closed) => return Err(QueueError::Closed),
                Err(e) => (e, None),
            };
            if let Some(generation) = generation {
                self.discard_publisher(generation).await;
            }
            let Some(delay) = delays.next() else {
                return Err(err);
            };
            warn!(queue = %self.opts.queue, error = %err, ?delay, "rabbitmq: retrying after reconnect");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.wait_for(|down| *down) => return Err(QueueError::Closed),
            }
        }
    }

    async fn message_count(&self, queue: &str) -> Result<u64, QueueError> {
        Ok(self.counts(queue).await?.0)
    }

    /// Messages ready in `queue` and its consumers (a passive declare).
    async fn counts(&self, queue: &str) -> Result<(u64, u64), QueueError> {
        self.on_publisher_link(|link| async move {
            // A passive declare of a missing queue closes its channel: use a
            // throwaway one, never the confirm channel.
            let ch = link
                .conn
                .create_channel()
                .await
                .map_err(|e| Attempt::Retry(unavailable("open channel", e)))?;
            let passive = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            match ch
                .queue_declare(short(queue), passive, FieldTable::default())
                .await
            {
                Ok(q) => {
                    let _ = ch.close(200, short("done")).await;
                    Ok((u64::from(q.message_count()), u64::from(q.consumer_count())))
                }
                Err(e) if e.is_amqp_soft_error() => {
                    Err(Attempt::Fail(unavailable(&format!("queue {queue}"), e)))
                }
                Err(e) => Err(Attempt::Retry(unavailable(&format!("queue {queue}"), e))),
            }
        })
        .await
    }

    /// The loop of [`JobQueue::next`] (`starts`: a start may be taken when
    /// no resume is there) and [`JobQueue::next_resume`]: consume, and own
    /// the reconnects of the consuming link.
    async fn take(&self, starts: bool) -> Result<Delivery, QueueError> {
        let mut shutdown = self.shutdown.subscribe();
        if *shutdown.borrow() {
            return Err(QueueError::Closed);
        }
        let mut slot = tokio::select! {
            slot = self.consumer.lock() => slot,
            _ = shutdown.wait_for(|down| *down) => return Err(QueueError::Closed),
        };
        let mut delays = self.opts.delays(None);
        loop {
            if self.is_shut_down() {
                return Err(QueueError::Closed);
            }
            if slot.is_none() {
                let opened = tokio::select! {
                    opened = self.open_consumer() => opened,
                    _ = shutdown.wait_for(|down| *down) => return Err(QueueError::Closed),
                };
                match opened {
                    Ok(link) => *slot = Some(link),
                    Err(e) => {
                        let delay = delays.next().unwrap_or(self.opts.reconnect_max);
                        warn!(queue = %self.opts.queue, error = %e, ?delay, "rabbitmq consumer: reconnecting");
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = shutdown.wait_for(|down| *down) => return Err(QueueError::Closed),
                        }
                        continue;
                    }
                }
            }
            let Some(link) = slot.as_mut() else { continue };
            // Biased: a resume that is here goes before any start.
            let item = tokio::select! {
                biased;
                item = link.resumes.next() => item,
                item = link.starts.next(), if starts => item,
                _ = shutdown.wait_for(|down| *down) => return Err(QueueError::Closed),
            };
            match item {
                // Prefetched before its channel died: it can no longer be
                // acked, and the broker requeues it. Skip it.
                Some(Ok(d)) if d.acker.poisoned() => {
                    debug!(queue = %self.opts.queue, "rabbitmq consumer: skipping a delivery from a dead channel");
                }
                Some(Ok(d)) => match serde_json::from_slice::<Job>(&d.data) {
                    Ok(job) => {
                        let acker = RabbitAcker {
                            acker: d.acker,
                            _channel: link.channel.clone(),
                        };
                        let enqueued_at = enqueued_at(&d.properties);
                        return Ok(Delivery {
                            job,
                            redelivered: d.redelivered,
                            acker: Box::new(acker),
                            enqueued_at,
                        });
                    }
                    Err(e) => {
                        warn!(queue = %self.opts.queue, error = %e, "rabbitmq consumer: body is not a job; dead-lettering it");
                        let _ = d
                            .acker
                            .nack(BasicNackOptions {
                                multiple: false,
                                requeue: false,
                            })
                            .await;
                    }
                },
                other => {
                    match other {
                        Some(Err(e)) => {
                            warn!(queue = %self.opts.queue, error = %e, "rabbitmq consumer: channel failed; reconnecting")
                        }
                        _ => {
                            warn!(queue = %self.opts.queue, "rabbitmq consumer: cancelled by the broker; reconnecting")
                        }
                    }
                    if let Some(old) = slot.take() {
                        close_conn(&old.conn).await;
                    }
                    let delay = delays.next().unwrap_or(self.opts.reconnect_max);
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.wait_for(|down| *down) => return Err(QueueError::Closed),
                    }
                }
            }
        }
    }

    async fn publish_once(
        &self,
        link: Arc<PubLink>,
        queue: &str,
        body: &[u8],
    ) -> Result<(), Attempt> {
        let mut headers = FieldTable::default();
        headers.insert(
            short(ENQUEUED_HEADER),
            AMQPValue::LongLongInt(chrono::Utc::now().timestamp_millis()),
        );
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type(short("application/json"))
            .with_headers(headers);
        let confirm = link
            .channel
            .basic_publish(
                short(""),
                short(queue),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                props,
            )
            .await
            .map_err(|e| Attempt::Retry(unavailable("publish", e)))?;
        let confirmation = match tokio::time::timeout(self.opts.confirm_timeout, confirm).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(Attempt::Retry(unavailable("publish confirm", e))),
            Err(_) => {
                return Err(Attempt::Fail(QueueError::NotConfirmed(format!(
                    "no confirm within {:?}",
                    self.opts.confirm_timeout
                ))));
            }
        };
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            // Unroutable: the queue is gone. Reconnecting redeclares it.
            Confirmation::Ack(Some(returned)) => {
                Err(Attempt::Retry(QueueError::NotConfirmed(format!(
                    "returned by the broker: {} {}",
                    returned.reply_code, returned.reply_text
                ))))
            }
            Confirmation::Nack(_) => Err(Attempt::Fail(QueueError::NotConfirmed(
                "nacked by the broker".into(),
            ))),
            Confirmation::NotRequested => Err(Attempt::Fail(QueueError::NotConfirmed(
                "channel not in confirm mode".into(),
            ))),
        }
    }
}

#[async_trait]
impl JobQueue for RabbitQueue {
    /// Publish `job` persistently and wait for the broker's confirm.
    ///
    /// Errors: [`QueueError::Unavailable`] after
    /// [`QueueOptions::publish_attempts`] failed attempts (broker away,
    /// connection or channel died, queue unroutable);
    /// [`QueueError::NotConfirmed`] when the broker nacked it or no confirm
    /// came within [`QueueOptions::confirm_timeout`] (not retried: the job
    /// may be in the queue); [`QueueError::Closed`] after
    /// [`RabbitQueue::close`].
    async fn publish(&self, job: &Job) -> Result<(), QueueError> {
        let body = serde_json::to_vec(job).map_err(|e| unavailable("encode job", e))?;
        let body = &body;
        let queue = if job.resume {
            self.opts.resume_queue()
        } else {
            self.opts.queue.clone()
        };
        let queue = &queue;
        self.on_publisher_link(|link| self.publish_once(link, queue, body))
            .await
    }

    /// Wait for the next job, however long the broker is away: a resume
    /// that has reached this process before any start. A body that is not a
    /// [`Job`] is dead-lettered (nack without requeue) and skipped.
    ///
    /// Errors: only [`QueueError::Closed`], after [`RabbitQueue::close`].
    /// Cancel-safe: dropping the future loses no job.
    async fn next(&self) -> Result<Delivery, QueueError> {
        self.take(true).await
    }

    /// Wait for the next resume, however long the broker is away; starts
    /// stay where they are (delivered ahead to this process, at most
    /// [`QueueOptions::prefetch`] of them, or in the queue). As
    /// [`JobQueue::next`] otherwise.
    async fn next_resume(&self) -> Result<Delivery, QueueError> {
        self.take(false).await
    }

    /// Jobs ready in both queues, not counting those delivered and not yet
    /// acked (the message counts of a passive declare of each).
    ///
    /// Errors: [`QueueError::Unavailable`] when the broker cannot be reached
    /// after [`QueueOptions::publish_attempts`] attempts or the queue does not
    /// exist; [`QueueError::Closed`] after [`RabbitQueue::close`].
    async fn depth(&self) -> Result<u64, QueueError> {
        Ok(self.message_count(&self.opts.queue).await?
            + self.message_count(&self.opts.resume_queue()).await?)
    }

    /// Three passive declares: both job queues (ready jobs, summed;
    /// consumers of the queue of starts: each consumer process attaches to
    /// both) and `<queue>.dlq` (dead-lettered jobs). Errors as
    /// [`JobQueue::depth`].
    async fn stats(&self) -> Result<QueueStats, QueueError> {
        let (ready, consumers) = self.counts(&self.opts.queue).await?;
        let resumes = self.message_count(&self.opts.resume_queue()).await?;
        let dead_lettered = self.dead_letter_depth().await?;
        Ok(QueueStats {
            ready: ready + resumes,
            consumers: Some(consumers),
            dead_lettered: Some(dead_lettered),
        })
    }
}

/// Acknowledges one delivery on the channel it came from.
struct RabbitAcker {
    /// lapin's handle: the channel id and delivery tag; poisoned when that
    /// channel closes, and single-use.
    acker: lapin::Acker,
    /// Keeps the channel open until the delivery is settled.
    _channel: Channel,
}

impl RabbitAcker {
    fn settled(&self, what: &str, result: lapin::Result<bool>) -> Result<(), QueueError> {
        match result {
            Ok(true) => Ok(()),
            // Poisoned: the channel died; the broker requeues the job itself.
            Ok(false) if self.acker.poisoned() => Err(QueueError::Unavailable(format!(
                "{what}: the delivery's channel closed; the broker will redeliver it"
            ))),
            // Already settled by an earlier call: nothing to do.
            Ok(false) => Ok(()),
            Err(e) => Err(unavailable(what, e)),
        }
    }
}

#[async_trait]
impl Acker for RabbitAcker {
    /// `basic.ack`. Errors: [`QueueError::Unavailable`] when the channel is
    /// gone (the job will be redelivered). A second settle is a no-op.
    async fn ack(&self) -> Result<(), QueueError> {
        let r = self.acker.ack(BasicAckOptions { multiple: false }).await;
        self.settled("ack", r)
    }

    /// `basic.nack`: `requeue` puts the job back (counting towards the
    /// delivery limit); otherwise it is dead-lettered to `<queue>.dlq`.
    /// Errors as for `ack`.
    async fn nack(&self, requeue: bool) -> Result<(), QueueError> {
        let r = self
            .acker
            .nack(BasicNackOptions {
                multiple: false,
                requeue,
            })
            .await;
        self.settled("nack", r)
    }
}

/// The message header carrying a job's publish time, ms since the Unix epoch.
pub const ENQUEUED_HEADER: &str = "x-glia-enqueued-ms";

/// The publish time a delivery carries in [`ENQUEUED_HEADER`], if any.
fn enqueued_at(props: &BasicProperties) -> Option<chrono::DateTime<chrono::Utc>> {
    match props.headers().as_ref()?.inner().get(ENQUEUED_HEADER)? {
        AMQPValue::LongLongInt(ms) => chrono::DateTime::from_timestamp_millis(*ms),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_delays_grow_jittered_and_stay_within_the_bounds() {
        let mut o = QueueOptions::new("q");
        o.reconnect_min = Duration::from_millis(100);
        o.reconnect_max = Duration::from_secs(5);
        for _ in 0..50 {
            let delays: Vec<Duration> = o.delays(None).take(20).collect();
            assert!(
                delays
                    .iter()
                    .all(|d| *d >= o.reconnect_min && *d <= o.reconnect_max),
                "{delays:?}"
            );
            assert!(
                delays[10..].iter().all(|d| *d >= o.reconnect_max / 2),
                "the cap is reached: {delays:?}"
            );
        }
        assert_eq!(o.delays(Some(4)).count(), 4);
        // A floor above half the cap still never exceeds the cap.
        o.reconnect_min = Duration::from_secs(4);
        assert!(o.delays(None).take(20).all(|d| d <= o.reconnect_max));
    }
}
