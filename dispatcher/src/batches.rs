//! Batches: many goals run with one configuration, submitted at once,
//! admitted progressively, watched, capped, cancelled and collected.
//!
//! | endpoint | scope | success | errors besides auth and bad input |
//! |---|---|---|---|
//! | `POST /v1/batches` | submit | 201 batch (200 on an idempotent repeat) | 409 `idempotency_conflict`, 422 `invalid_request` (`line` for JSONL) |
//! | `GET /v1/batches` | any | 200 page | – |
//! | `GET /v1/batches/{id}` | any | 200 batch with counts and spend | 404 `batch_not_found` |
//! | `GET /v1/batches/{id}/results` | any | 200 JSON Lines, one [`ItemResult`] per item | 404 |
//! | `GET /v1/batches/{id}/stream` | any | 200 SSE `progress` frames | 404 |
//! | `POST /v1/batches/{id}/cancel` | submit | 200 batch | 404 |
//! | `POST /v1/batches/{id}/pause`, `/resume` | submit | 200 batch | 404, 409 `batch_ended` |
//!
//! Every endpoint answers 404 `not_available` on a dispatcher without a
//! batch store (the SQLite single node, `glia serve`, for now; `glia dev`
//! has the in-memory twin).
//!
//! **Submission.** As JSON ([`CreateBatch`], at most
//! [`crate::Limits::max_body_bytes`]) or as JSON Lines (`Content-Type:
//! application/jsonl` or `application/x-ndjson`): line 1 is the
//! [`BatchSpec`], every further non-blank line one [`BatchItem`]. The upload
//! is read as it arrives and stored in chunks of [`CHUNK`] items inside one
//! transaction: the dispatcher never holds the file, and a malformed line
//! (reported with its `line` number), a bad item or a repeated `custom_id`
//! refuses the whole batch with nothing stored. An item's goal may use its
//! `inputs` as minijinja variables (`Summarise ticket {{ id }}`); an unknown
//! variable is an error of that item. An item's `config` is a JSON merge
//! patch (RFC 7396) over the batch's config for its run alone, checked at
//! submit as `POST /v1/runs` checks a config and applied at admission.
//!
//! **Admission** ([`admit`]): a background loop of every dispatcher. Each
//! pass folds finished runs' spend into their items, expires items past the
//! completion window and cancels the runs still going in a batch past it
//! (those items end `expired`, [`EXPIRED_REASON`]), then grants free slots: the fleet-wide cap on batch
//! runs in flight ([`Admission::max_in_flight`]) is shared among tenants by
//! weighted fair share (each slot goes to the tenant with the fewest runs in
//! flight per unit of weight that still has admissible work and is under
//! [`Admission::per_tenant`]; within a tenant, to its batch with the fewest
//! runs in flight under the batch's own `max_in_flight`). Items are claimed
//! in submission order and become runs through the same function as `POST
//! /v1/runs`, with the idempotency key `glia-batch:{batch}:{custom_id}`: a
//! dispatcher killed between creating a run and marking its item finds the
//! run again when the claim lapses, so no item runs twice and none is lost.
//! A batch whose spend reached its cap admits nothing more until the cap is
//! raised (`POST /v1/batches/{id}/resume` with `spend_cap`): the pass that
//! sees the cap reached pauses the batch.
//!
//! **Pause.** A paused batch admits nothing, and its runs get an operator
//! pause (as `POST /v1/runs/{id}/pause`) with the reason `batch {id} paused
//! by NAME` or, at the spend cap, `batch {id} reached its spend cap`: each
//! parks at `paused` at its next step boundary, so spend stops growing
//! within one model call per running run. Resuming the batch resumes only
//! the runs whose pause carries one of its reasons (a run an operator paused
//! on its own stays paused). See `docs/batches.md`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::Utc;
use futures::StreamExt;
use glia_backends::batches::{Batch, BatchState, BatchStore, Claim, Lane, NewBatch, NewItem};
use glia_backends::{Spend, SpendCap};
use glia_proto::RunConfig;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::admission::{admit_run, catalogue_check, check_labels, run_config, validate_run};
use crate::app::App;
use crate::auth::Principal;
use crate::control::{cancel_run, pause_run, resume_paused_by};
use crate::error::ApiError;
use crate::model::CreateRun;

pub use crate::config::{Admission, BatchConfig};
use crate::model::batches::*;

/// The cancel reason of a run its batch's completion window ended.
pub const EXPIRED_REASON: &str = "the batch's completion window ended";

/// Items stored per statement while a submission streams in.
pub const CHUNK: usize = 500;

pub(crate) fn store(app: &App) -> Result<&Arc<dyn BatchStore>, ApiError> {
    app.batches.store.as_ref().ok_or_else(|| {
        ApiError::NotAvailable(
            "batches are not available on this dispatcher (it was built without a batch store)"
                .into(),
        )
    })
}

pub(crate) fn tenant_of(p: &Principal) -> Option<&str> {
    (!p.is_admin()).then_some(p.tenant.as_str())
}

/// The spec's checks, as `POST /v1/runs` makes them (a config that
/// validates, or an agent of the tenant's that exists), and the agent's
/// version pinned: `name` becomes `name@N` with N the latest version at
/// submit, so every item runs the same definition whatever is registered
/// later. Errors: 422 naming `config` or `agent`, 404 `agent_not_found`.
pub(crate) async fn check_spec(
    app: &App,
    tenant: &str,
    spec: &mut BatchSpec,
) -> Result<RunConfig, ApiError> {
    let probe = CreateRun {
        goal: "batch".into(),
        config: spec.config.clone().unwrap_or_default(),
        batch_id: None,
        agent: spec.agent.clone(),
        tags: Vec::new(),
        metadata: Default::default(),
        start_at: None,
        recorded_tools: None,
    };
    let config = run_config(app, tenant, &probe).await?;
    if let Some(agent) = &config.agent {
        spec.agent = Some(format!("{}@{}", agent.name, agent.version));
    }
    Ok(config)
}

/// How the items of one submission are checked.
pub(crate) struct ItemRules {
    /// Renders goals with their inputs (an unknown variable is an error).
    env: minijinja::Environment<'static>,
    /// The batch's config as JSON, the base of each item's patch; `None` in
    /// a batch that names an agent (its items take no config).
    base: Option<Value>,
    /// For the catalogue check of each patched config.
    app: App,
    /// The input guardrails of the batch's config (an agent's resolved),
    /// compiled once: they screen each item's goal that has no config of
    /// its own.
    screen: glia_proto::guardrails::CompiledGuardrails,
}

impl ItemRules {
    pub(crate) fn new(
        app: &App,
        spec: &BatchSpec,
        config: &RunConfig,
    ) -> Result<ItemRules, ApiError> {
        let mut env = minijinja::Environment::new();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        let base = spec.agent.is_none().then(|| base_config(spec));
        let screen = config
            .guardrails
            .compile()
            .map_err(|e| ApiError::InvalidField {
                field: format!("config.guardrails.{}", e.field),
                reason: e.reason,
            })?;
        Ok(ItemRules {
            env,
            base,
            app: app.clone(),
            screen,
        })
    }
}

/// The batch's config as JSON: what an item's patch applies to.
pub(crate) fn base_config(spec: &BatchSpec) -> Value {
    serde_json::to_value(spec.config.clone().unwrap_or_default()).expect("a config serialises")
}

/// `base` with an item's `patch` applied (RFC 7396). Errors: the place in
/// the patched config that does not deserialize (`config.budget.max_turns:
/// invalid type…`, `config: unknown field…`).
pub(crate) fn patched_config(
    base: &Value,
    patch: &Map<String, Value>,
) -> Result<RunConfig, (Option<String>, String)> {
    let mut merged = base.clone();
    json_patch::merge(&mut merged, &Value::Object(patch.clone()));
    serde_path_to_error::deserialize::<_, RunConfig>(merged).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            "config".to_owned()
        } else {
            format!("config.{path}")
        };
        (Some(field), e.into_inner().to_string())
    })
}

/// An item's goal checked by the input guardrails of its config: a goal a
/// deny rule refuses fails the submission naming the item's `goal`, the
/// rule and the length, and is stored nowhere.
pub(crate) fn screened_goal(
    screen: &glia_proto::guardrails::CompiledGuardrails,
    goal: &str,
) -> Result<(), (Option<String>, String)> {
    match crate::admission::screen_compiled(screen, "goal", goal) {
        Ok(_) => Ok(()),
        Err(ApiError::ScreenedInput {
            field,
            guardrail,
            reason,
            chars,
        }) => Err((
            Some(field),
            format!(
                "refused by the input guardrail {guardrail} ({reason}); {chars} characters, not stored"
            ),
        )),
        Err(other) => Err((Some("config".into()), other.to_string())),
    }
}

/// One item as stored: the goal rendered with its inputs, metadata and the
/// config patch as JSON text (the patched config checked as `POST /v1/runs`
/// checks one).
pub(crate) fn prepare(
    item: BatchItem,
    line: u64,
    rules: &ItemRules,
) -> Result<NewItem, (Option<String>, String)> {
    if item.custom_id.is_empty() || item.custom_id.chars().count() > 255 {
        return Err((
            Some("custom_id".into()),
            "must be 1 to 255 characters".into(),
        ));
    }
    let goal = match &item.inputs {
        None => item.goal,
        Some(inputs) => rules
            .env
            .render_str(&item.goal, inputs)
            .map_err(|e| (Some("goal".into()), format!("rendering with inputs: {e}")))?,
    };
    if goal.trim().is_empty() {
        return Err((Some("goal".into()), "is blank".into()));
    }
    if goal.contains('\0') || item.custom_id.contains('\0') {
        return Err((Some("goal".into()), "contains U+0000".into()));
    }
    let config = match (&item.config, &rules.base) {
        (None, _) => None,
        (Some(_), None) => {
            return Err((
                Some("config".into()),
                "cannot be combined with the batch's `agent` (the definition is the config)".into(),
            ));
        }
        (Some(patch), Some(base)) => {
            let config = patched_config(base, patch)?;
            let probe = CreateRun {
                goal: goal.clone(),
                config,
                batch_id: None,
                agent: None,
                tags: Vec::new(),
                metadata: Default::default(),
                start_at: None,
                recorded_tools: None,
            };
            let checked =
                validate_run(&probe).and_then(|()| catalogue_check(&rules.app, &probe.config));
            checked.map_err(|e| match e {
                ApiError::InvalidField { field, reason } => (Some(field), reason),
                other => (Some("config".into()), other.to_string()),
            })?;
            let screen = probe
                .config
                .guardrails
                .compile()
                .map_err(|e| (Some(format!("config.guardrails.{}", e.field)), e.reason))?;
            screened_goal(&screen, &goal)?;
            Some(serde_json::to_string(patch).expect("JSON serialises"))
        }
    };
    if config.is_none() {
        screened_goal(&rules.screen, &goal)?;
    }
    let pairs = item.metadata.clone().unwrap_or_default();
    let tags = check_labels("", &item.tags, &pairs).map_err(|e| match e {
        ApiError::InvalidField { field, reason } => (Some(field), reason),
        other => (Some("tags".into()), other.to_string()),
    })?;
    let recorded_tools = match &item.recorded_tools {
        None => None,
        Some(recorded) => {
            recorded.validate().map_err(|e| (Some(e.field), e.reason))?;
            Some(serde_json::to_string(recorded).expect("JSON serialises"))
        }
    };
    let metadata = item
        .metadata
        .map(|m| serde_json::to_string(&m).expect("JSON serialises"));
    let tags = (!tags.is_empty()).then(|| serde_json::to_string(&tags).expect("JSON serialises"));
    Ok(NewItem {
        custom_id: item.custom_id,
        goal,
        metadata,
        tags,
        config,
        recorded_tools,
        line,
    })
}

pub(crate) fn new_batch(p: &Principal, key: Option<String>, spec: &BatchSpec) -> NewBatch {
    let id = Uuid::now_v7();
    let stored = BatchSpec {
        options: BatchOptions {
            spend_cap: None,
            ..spec.options.clone()
        },
        ..spec.clone()
    };
    NewBatch {
        id,
        tenant: p.tenant.clone(),
        idempotency_key: key,
        spec: serde_json::to_string(&stored).expect("a spec serialises"),
        max_in_flight: spec.options.max_in_flight,
        cap: spec
            .options
            .spend_cap
            .map(SpendCap::from)
            .unwrap_or_default(),
        expires_at: spec
            .options
            .completion_window_secs
            .map(|s| Utc::now() + chrono::Duration::seconds(s.min(i64::MAX as u64) as i64)),
    }
}

pub(crate) fn view(batch: &Batch, counts: BatchCounts, spend: Spend) -> BatchView {
    let spec: BatchSpec = serde_json::from_str(&batch.spec).unwrap_or_default();
    BatchView {
        id: batch.id,
        tenant: batch.tenant.clone(),
        status: BatchStatus::of(batch.state, &counts),
        cap_reached: reached(batch.cap, spend),
        total: batch.items_total,
        counts,
        spend: spend.into(),
        agent: spec.agent,
        options: BatchOptions {
            spend_cap: (batch.cap != SpendCap::default()).then(|| batch.cap.into()),
            ..spec.options
        },
        created_at: batch.created_at,
        updated_at: batch.updated_at,
        expires_at: batch.expires_at,
    }
}

pub(crate) fn reached(cap: SpendCap, spend: Spend) -> bool {
    cap.tokens.is_some_and(|t| spend.tokens >= t)
        || cap
            .cost_usd_micros
            .is_some_and(|c| spend.cost_usd_micros >= c)
}

pub(crate) async fn full_view(app: &App, batch: &Batch) -> Result<BatchView, ApiError> {
    let store = store(app)?;
    let (counts, spend) = futures::try_join!(store.counts(batch.id), store.spend(batch.id))?;
    Ok(view(batch, BatchCounts::of(&counts), spend))
}

pub(crate) async fn visible_batch(app: &App, p: &Principal, id: Uuid) -> Result<Batch, ApiError> {
    store(app)?
        .batch(tenant_of(p), id)
        .await?
        .ok_or(ApiError::BatchNotFound(id))
}

/// 404 unless the caller sees batch `id`; 409 `batch_ended` when it has
/// ended ([`BatchStatus::ended`]: an ended batch never changes again, so
/// the answer cannot go stale before the caller's change).
pub(crate) async fn not_ended(app: &App, p: &Principal, id: Uuid) -> Result<(), ApiError> {
    let status = full_view(app, &visible_batch(app, p, id).await?)
        .await?
        .status;
    if status.ended() {
        return Err(ApiError::BatchEnded(id, status.as_str()));
    }
    Ok(())
}

/// Give every run of batch `id` not done an operator pause with `reason`
/// (runs already paused or pausing, and runs that finished meanwhile, are
/// left as they are).
/// Cancel batch `id` (if `tenant` sees it; `None`: any): nothing more is
/// admitted, unadmitted items are `cancelled`, and its runs not done are
/// cancelled by `by`. Answers the batch. Errors: 404 `batch_not_found`.
pub(crate) async fn cancel_batch(
    app: &App,
    tenant: Option<&str>,
    id: Uuid,
    by: &str,
) -> Result<Batch, ApiError> {
    let store = store(app)?;
    let batch = store
        .update(tenant, id, Some(BatchState::Cancelled), None)
        .await?
        .ok_or(ApiError::BatchNotFound(id))?;
    let reason = format!("batch {id} cancelled by {by}");
    for run_id in store.live_runs(id).await? {
        match crate::control::cancel_run(app, run_id, &reason, by).await {
            Ok(_) | Err(ApiError::RunFinished(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(batch)
}

pub(crate) async fn park_runs(app: &App, id: Uuid, reason: &str, by: &str) -> Result<(), ApiError> {
    for run_id in store(app)?.live_runs(id).await? {
        match pause_run(app, run_id, reason, by).await {
            Ok(_) | Err(ApiError::RunFinished(_) | ApiError::RunCancelled(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Resume the runs of batch `id` that one of its pauses (or its spend cap)
/// holds or is about to hold; a run an operator paused on its own stays.
pub(crate) async fn resume_parked(app: &App, id: Uuid, by: &str) -> Result<(), ApiError> {
    let ours = format!("batch {id} ");
    for run_id in store(app)?.live_runs(id).await? {
        match resume_paused_by(app, run_id, by, |reason| reason.starts_with(&ours)).await {
            Ok(_) | Err(ApiError::RunFinished(_) | ApiError::RunCancelled(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Slots granted per batch: weighted fair share of `free` slots across
/// tenants, then across each tenant's batches (see the module doc).
/// Every lane's `in_flight` counts as load; a lane is granted at most its
/// `waiting` (the caller sets it to 0 for a batch that may not admit).
pub fn share(lanes: &[Lane], free: u64, admission: &Admission) -> HashMap<Uuid, u64> {
    let mut tenant_load: HashMap<&str, u64> = HashMap::new();
    for lane in lanes {
        *tenant_load.entry(lane.tenant.as_str()).or_insert(0) += lane.in_flight;
    }
    let mut grants: HashMap<Uuid, u64> = HashMap::new();
    let per_tenant = u64::from(admission.per_tenant);
    for _ in 0..free {
        let open = |lane: &&Lane| {
            let g = grants.get(&lane.batch_id).copied().unwrap_or(0);
            g < lane.waiting
                && lane
                    .max_in_flight
                    .is_none_or(|m| lane.in_flight + g < u64::from(m))
                && tenant_load[lane.tenant.as_str()] < per_tenant
        };
        let weight = |t: &str| u64::from(admission.weights.get(t).copied().unwrap_or(1).max(1));
        // The tenant with the least load per weight (compared as fractions), then the oldest batch id.
        let Some(tenant) = lanes
            .iter()
            .filter(open)
            .map(|l| l.tenant.as_str())
            .min_by(|a, b| {
                (u128::from(tenant_load[a]) * u128::from(weight(b)))
                    .cmp(&(u128::from(tenant_load[b]) * u128::from(weight(a))))
                    .then(a.cmp(b))
            })
        else {
            break;
        };
        let lane = lanes
            .iter()
            .filter(open)
            .filter(|l| l.tenant == tenant)
            .min_by_key(|l| {
                (
                    l.in_flight + grants.get(&l.batch_id).copied().unwrap_or(0),
                    l.batch_id,
                )
            })
            .expect("the tenant has an open lane");
        *grants.entry(lane.batch_id).or_insert(0) += 1;
        *tenant_load
            .get_mut(tenant)
            .expect("every tenant is counted") += 1;
    }
    grants
}

/// One admission pass: sweep, then grant and admit. Answers how many items
/// became runs.
pub async fn admit_once(app: &App) -> Result<u64, ApiError> {
    let store = store(app)?;
    let a = &app.batches.admission;
    store.sweep(1000).await?;
    // Batches past their completion window: their runs not done are
    // cancelled (answered again each pass until a worker applies the cancel).
    for run_id in store.expire_runs(1000).await? {
        match cancel_run(app, run_id, EXPIRED_REASON, "glia").await {
            Ok(_) | Err(ApiError::RunFinished(_) | ApiError::RunCancelled(_)) => {}
            Err(e) => {
                tracing::warn!(run_id = %run_id, "completion window ended; the run's cancel was not posted (retried next pass): {e}")
            }
        }
    }
    let lanes = store.lanes().await?;
    // Every batch's runs in flight count against the caps; only active
    // batches under their spend cap are granted slots.
    let mut admissible = Vec::with_capacity(lanes.len());
    let mut in_flight = 0;
    for mut lane in lanes {
        in_flight += lane.in_flight;
        let capped = lane.state == BatchState::Active
            && lane.waiting + lane.in_flight > 0
            && lane.cap != SpendCap::default()
            && reached(lane.cap, store.spend(lane.batch_id).await?);
        if capped {
            // The cap is reached: its runs pause, then the batch. A pass that
            // fails to park them all leaves the batch active, so the next
            // pass tries again (runs already pausing are skipped).
            let id = lane.batch_id;
            match park_runs(
                app,
                id,
                &format!("batch {id} reached its spend cap"),
                "glia",
            )
            .await
            {
                Ok(()) => {
                    if store
                        .update(None, id, Some(BatchState::Paused), None)
                        .await?
                        .is_some_and(|b| b.state == BatchState::Paused)
                    {
                        tracing::info!(batch_id = %id, "spend cap reached; batch paused");
                    }
                }
                Err(e) => {
                    tracing::warn!(batch_id = %id, "spend cap reached; not every run was paused (retried next pass): {e}")
                }
            }
        }
        if lane.state != BatchState::Active || capped {
            lane.waiting = 0;
        }
        admissible.push(lane);
    }
    let free = u64::from(a.max_in_flight)
        .saturating_sub(in_flight)
        .min(a.per_pass as u64);
    let grants = share(&admissible, free, a);
    let mut claims: Vec<Claim> = Vec::new();
    for lane in &admissible {
        if let Some(&n) = grants.get(&lane.batch_id) {
            claims.extend(
                store
                    .claim(lane.batch_id, n as usize, a.claim_lease)
                    .await?,
            );
        }
    }
    let tenants: HashMap<Uuid, &str> = admissible
        .iter()
        .map(|l| (l.batch_id, l.tenant.as_str()))
        .collect();
    let mut specs: HashMap<Uuid, Option<BatchSpec>> = HashMap::new();
    for claim in &claims {
        if let std::collections::hash_map::Entry::Vacant(e) = specs.entry(claim.batch_id) {
            let spec = store
                .batch(None, claim.batch_id)
                .await?
                .and_then(|b| serde_json::from_str(&b.spec).ok());
            e.insert(spec);
        }
    }
    let admitted = futures::stream::iter(claims)
        .map(|claim| {
            let spec = specs.get(&claim.batch_id).cloned().flatten();
            let tenant = tenants
                .get(&claim.batch_id)
                .copied()
                .unwrap_or_default()
                .to_owned();
            async move { admit_item(app, &tenant, spec, claim).await }
        })
        .buffer_unordered(16)
        .filter(|r| {
            if let Err(e) = r {
                // The item stays `admitting`; a later pass claims it again when the claim lapses.
                tracing::warn!("batch item not admitted (retried after the claim lapses): {e}");
            }
            futures::future::ready(matches!(r, Ok(true)))
        })
        .count()
        .await;
    Ok(admitted as u64)
}

/// Turn one claimed item into its run. Ok(false): refused (recorded on the item).
async fn admit_item(
    app: &App,
    tenant: &str,
    spec: Option<BatchSpec>,
    claim: Claim,
) -> Result<bool, ApiError> {
    let store = store(app)?;
    let Some(spec) = spec else {
        store
            .refused(
                claim.batch_id,
                claim.n,
                "the batch's stored specification cannot be read",
            )
            .await?;
        return Ok(false);
    };
    // The item's own config: its patch over the batch's (checked at submit;
    // a stored patch that no longer applies refuses the item).
    let config = match claim
        .config
        .as_deref()
        .map(serde_json::from_str::<Map<String, Value>>)
    {
        None => spec.config.clone().unwrap_or_default(),
        Some(Ok(patch)) => match patched_config(&base_config(&spec), &patch) {
            Ok(config) => config,
            Err((field, reason)) => {
                store
                    .refused(
                        claim.batch_id,
                        claim.n,
                        &format!("{}: {reason}", field.unwrap_or_default()),
                    )
                    .await?;
                return Ok(false);
            }
        },
        Some(Err(e)) => {
            store
                .refused(
                    claim.batch_id,
                    claim.n,
                    &format!("the item's stored config cannot be read: {e}"),
                )
                .await?;
            return Ok(false);
        }
    };
    // Its tags and metadata, checked at submit (a stored value that no
    // longer reads refuses the item).
    let labels = claim
        .tags
        .as_deref()
        .map(serde_json::from_str::<Vec<String>>)
        .transpose()
        .and_then(|tags| {
            let metadata = claim
                .metadata
                .as_deref()
                .map(serde_json::from_str::<BTreeMap<String, String>>)
                .transpose()?;
            Ok((tags.unwrap_or_default(), metadata.unwrap_or_default()))
        });
    let (tags, metadata) = match labels {
        Ok(labels) => labels,
        Err(e) => {
            store
                .refused(
                    claim.batch_id,
                    claim.n,
                    &format!("the item's stored tags or metadata cannot be read: {e}"),
                )
                .await?;
            return Ok(false);
        }
    };
    let recorded_tools = match claim.recorded_tools.as_deref().map(serde_json::from_str) {
        None => None,
        Some(Ok(recorded)) => Some(recorded),
        Some(Err(e)) => {
            store
                .refused(
                    claim.batch_id,
                    claim.n,
                    &format!("the item's stored recorded tools cannot be read: {e}"),
                )
                .await?;
            return Ok(false);
        }
    };
    let req = CreateRun {
        goal: claim.goal.clone(),
        config,
        batch_id: Some(claim.batch_id),
        agent: spec.agent,
        tags,
        metadata,
        start_at: None,
        recorded_tools,
    };
    let key = format!("glia-batch:{}:{}", claim.batch_id, claim.custom_id);
    let run = match admit_run(app, tenant, Some(key), &req, Some(&claim.custom_id)).await {
        Ok((run, _)) => run,
        Err(e) if e.status().is_client_error() => {
            tracing::warn!(batch_id = %claim.batch_id, custom_id = %claim.custom_id, "item refused at admission: {e}");
            store
                .refused(claim.batch_id, claim.n, &e.to_string())
                .await?;
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    let state = store.admitted(claim.batch_id, claim.n, run.run_id).await?;
    if state == BatchState::Paused {
        // Paused while this item was admitted: its run pauses too.
        match pause_run(
            app,
            run.run_id,
            &format!("batch {} paused", claim.batch_id),
            "glia",
        )
        .await
        {
            Ok(_) | Err(ApiError::RunFinished(_) | ApiError::RunCancelled(_)) => {}
            Err(e) => return Err(e),
        }
        // Resumed meanwhile: take the pause back.
        if store
            .batch(None, claim.batch_id)
            .await?
            .is_some_and(|b| b.state == BatchState::Active)
        {
            let ours = format!("batch {} ", claim.batch_id);
            match resume_paused_by(app, run.run_id, "glia", |reason| reason.starts_with(&ours))
                .await
            {
                Ok(_) | Err(ApiError::RunFinished(_) | ApiError::RunCancelled(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    if state == BatchState::Cancelled {
        match cancel_run(
            app,
            run.run_id,
            &format!("batch {} cancelled", claim.batch_id),
            "glia",
        )
        .await
        {
            Ok(_) | Err(ApiError::RunFinished(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The admission loop (spawned by `glia dispatcher`): a pass every
/// [`Admission::poll`], or at once after a submit or resume; failures are
/// logged and the next pass tries again. Returns at once without a store.
pub async fn admit(app: App) {
    if app.batches.store.is_none() {
        return;
    }
    loop {
        match admit_once(&app).await {
            Ok(n) if n > 0 => {
                tracing::debug!(admitted = n, "batch admission pass");
                continue;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("batch admission pass failed: {e}"),
        }
        let _ = tokio::time::timeout(app.batches.admission.poll, app.admission_woken()).await;
    }
}

/// Every item's result of `batch` as JSON Lines, in submission order,
/// streamed from the store a page at a time (one [`ItemResult`] per line;
/// items not finished show their status): the body of `GET
/// /v1/batches/{id}/results` and of the console's download. A store
/// failure mid-way cuts the body off (logged). Errors: 404
/// `not_available` without a batch store.
pub(crate) fn results_response(
    app: &App,
    batch: &Batch,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    const PAGE: usize = 1000;
    let store = store(app)?.clone();
    let batch_id = batch.id;
    let lines = futures::stream::unfold(Some(0u64), move |from| {
        let store = store.clone();
        async move {
            let from = from?;
            match store.items(batch_id, from, PAGE).await {
                Err(e) => {
                    tracing::warn!(%batch_id, "results cut off: {e}");
                    Some((Err(std::io::Error::other(e.to_string())), None))
                }
                Ok(items) if items.is_empty() => None,
                Ok(items) => {
                    let next = (items.len() == PAGE)
                        .then(|| items.last().map(|i| i.n + 1))
                        .flatten();
                    let mut out = Vec::new();
                    for item in items {
                        serde_json::to_writer(&mut out, &ItemResult::of(item))
                            .expect("results serialise");
                        out.push(b'\n');
                    }
                    Some((
                        Ok(axum::body::Bytes::from(out)),
                        Some(next.unwrap_or(u64::MAX)),
                    ))
                }
            }
        }
    });
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/jsonl")],
        axum::body::Body::from_stream(lines),
    )
        .into_response())
}
