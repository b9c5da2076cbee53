//! Evals (issue 31, `docs/evals.md`): datasets, experiments, and the loop
//! that drives and grades them.
//!
//! | endpoint | scope | success | errors besides auth and bad input |
//! |---|---|---|---|
//! | `PUT /v1/datasets/{name}` (JSON Lines) | submit | 201 the new version, 200 unchanged | 422 naming the line and field |
//! | `GET /v1/datasets`, `GET /v1/datasets/{name}?version=N` | any | 200 | 404 `dataset_not_found` |
//! | `POST /v1/experiments` `{"eval": {…}}` | submit | 201 (200 on an idempotent repeat) | 404 `dataset_not_found`, 409 `idempotency_conflict`, 422 naming `eval.…` |
//! | `GET /v1/experiments`, `GET /v1/experiments/{id}` | any | 200 | 404 `experiment_not_found` |
//! | `POST /v1/experiments/{id}/cancel` | submit | 200 | 404, 409 `experiment_ended` |
//!
//! An **experiment** runs each agent version over every case of a pinned
//! dataset version, `repetitions` times, as one managed batch per version
//! (idempotency key `experiment:{id}:{i}`, items `{case}#{rep}`): the
//! batches' caps, spend cap and admission apply, and every cell is a run
//! the console shows. The loop ([`evals`], in every dispatcher: soon after
//! a pass that had runs waiting on it, at most every [`TEND_EVERY`]
//! otherwise; one dispatcher tends an experiment at a time by a claim that
//! runs out, [`CLAIM_FOR`], held again before each effect) submits batches
//! not yet submitted, posts each case's scripted customer turns when its
//! run waits for input (and closes the conversation when they run out),
//! closes a run out of turns and cancels one out of any other budget,
//! decides approvals as the eval says (never one the operator's catalogue
//! reserves for a person), grades every ended cell once
//! (`EvalStore::record_grade`: the first grade stands), and completes the
//! experiment when every cell is graded. Creating one needs the `approve`
//! scope too when the eval decides approvals.
//!
//! Grading is `glia_evals::grade`. A `judge` grader is a run of its own
//! (idempotency key from the experiment, cell and grader: admitted once,
//! its cost recorded on it), its verdict the structured output; a judge
//! that does not succeed or answers garbage is a grading error, never a
//! pass (one paused by its budget is cancelled, so it ends). An `http`
//! grader POSTs to an origin the operator's catalogue allows (`[http] allowed_origins`, checked at create and again before
//! each call; no catalogue, no HTTP grader), redirects not followed.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use glia_backends::batches::{ItemView, SubmitError, Upload};
use glia_backends::evals::{
    DatasetInfo, EvalStore, Experiment, ExperimentState, Grade, PutDataset,
};
use glia_evals::dataset::{self, Case};
use glia_evals::grade::{self, Graded, HttpTask, JudgeTask, RunFacts, Verdict};
use glia_evals::spec::{Approvals, EvalSpec, GraderKind, VersionSpec};
use glia_evals::stats::{Cell, Summary};
use glia_proto::{Event, PauseReason, Payload, PolicyOrigin, PullPoint, RunConfig};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::admission::{admit_run, catalogue_check};
use crate::app::App;
use crate::auth::{Principal, Scope};
use crate::batches::{CHUNK, ItemRules, check_spec, new_batch, prepare};
use crate::control::post;
use crate::error::ApiError;
use crate::model::CreateRun;
use crate::model::batches::{BatchItem, BatchOptions, BatchSpec, SpendCapBody};
use crate::model::evals::{ExperimentProgress, ExperimentVersion, ExperimentView};

/// How often the loop looks at running experiments.
pub const TEND_EVERY: Duration = Duration::from_millis(500);
/// The tag of judge runs (each also carries [`EXPERIMENT_META`]).
pub const JUDGE_TAG: &str = "eval-judge";

/// How long a dispatcher's claim on an experiment lasts unless renewed.
pub const CLAIM_FOR: Duration = Duration::from_secs(15);
/// Most bytes of one dataset upload.
pub const MAX_DATASET_BYTES: usize = 64 << 20;
/// The metadata key naming a run's experiment (its cells' and judges' runs).
pub const EXPERIMENT_META: &str = "glia.experiment";
/// Most bytes of an HTTP grader's answer read.
const MAX_HTTP_ANSWER: usize = 1 << 20;

/// The eval store, or 404 `not_available`.
pub(crate) fn store(app: &App) -> Result<&Arc<dyn EvalStore>, ApiError> {
    app.evals
        .as_ref()
        .ok_or_else(|| ApiError::NotAvailable("evals need an eval store".into()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Store `text` (JSON Lines, `docs/evals.md`) as the next version of the
/// tenant's dataset `name`; true when a new version was stored (false: the
/// latest version has this content). Errors: 422 naming the dataset's
/// `name`, or the line and field of a bad case.
pub(crate) async fn put_dataset(
    app: &App,
    tenant: &str,
    name: &str,
    text: &str,
) -> Result<(DatasetInfo, bool), ApiError> {
    if !glia_evals::spec::is_valid_name(name) {
        return Err(ApiError::InvalidParam {
            name: "name".into(),
            reason: format!("{name:?}: 1 to 100 characters of A-Z a-z 0-9 _ . -"),
        });
    }
    let cases = dataset::parse_jsonl(text).map_err(|e| ApiError::InvalidLine {
        line: e.line as u64,
        field: e.field.clone(),
        code: "invalid_request",
        reason: e.reason.clone(),
    })?;
    let canonical = dataset::to_jsonl(&cases);
    let hash = dataset::content_hash(&cases);
    match store(app)?
        .put_dataset(
            tenant,
            name,
            &canonical,
            &hash,
            cases.len() as u32,
            Utc::now(),
        )
        .await?
    {
        PutDataset::Created(info) => {
            tracing::info!(
                tenant,
                dataset = name,
                version = info.version,
                cases = info.cases,
                "dataset stored"
            );
            Ok((info, true))
        }
        PutDataset::Unchanged(info) => Ok((info, false)),
    }
}

/// The cases of the tenant's dataset `name` (version `version`, the latest
/// for `None`) and its version. Errors: 404 `dataset_not_found`.
pub(crate) async fn dataset_cases(
    app: &App,
    tenant: &str,
    name: &str,
    version: Option<u32>,
) -> Result<(DatasetInfo, Vec<Case>), ApiError> {
    let found = store(app)?
        .dataset(Some(tenant), name, version)
        .await?
        .ok_or_else(|| {
            ApiError::DatasetNotFound(match version {
                Some(v) => format!("{name}@{v}"),
                None => name.to_owned(),
            })
        })?;
    let cases = dataset::parse_jsonl(&found.cases)
        .map_err(|e| ApiError::Internal(format!("stored dataset {name} does not parse: {e}")))?;
    Ok((found.info, cases))
}

/// The principal an experiment acts as: its tenant, named
/// `experiment:{id}` (the `by` of its batches and decisions).
fn acting(exp: &Experiment) -> Principal {
    Principal {
        tenant: exp.tenant.clone(),
        scopes: vec![Scope::Submit, Scope::Approve],
        name: Some(format!("experiment:{}", exp.id)),
    }
}

/// The batch spec of version `i`.
fn batch_spec(i: usize, version: &VersionSpec, eval: &EvalSpec) -> Result<BatchSpec, ApiError> {
    let (agent, config) = match version {
        VersionSpec::Agent(reference) => (Some(reference.clone()), None),
        VersionSpec::Inline { config, .. } => {
            let config: RunConfig = glia_proto::strict::from_json_value(Value::Object(
                config.clone(),
            ))
            .map_err(|e| ApiError::InvalidField {
                field: e.clone().under(&format!("eval.agents[{i}].config")).path,
                reason: e.reason,
            })?;
            (None, Some(config))
        }
    };
    Ok(BatchSpec {
        config,
        agent,
        options: BatchOptions {
            max_in_flight: eval.options.max_in_flight,
            spend_cap: eval.options.spend_cap.map(|c| SpendCapBody {
                tokens: c.tokens,
                usd_micros: c.usd_micros,
            }),
            completion_window_secs: eval.options.completion_window_secs,
        },
    })
}

/// The cell name of a case's repetition: its batch item's `custom_id`.
pub fn cell_id(case: &str, rep: u32) -> String {
    format!("{case}#{rep}")
}

/// A cell's case and repetition, from its `custom_id`.
fn split_cell(cell: &str) -> Option<(&str, u32)> {
    let (case, rep) = cell.rsplit_once('#')?;
    Some((case, rep.parse().ok()?))
}

/// A judge or HTTP grader checked against the operator's catalogue: the
/// judge's run config as a run's is checked (its provider), an HTTP
/// grader's origin as an HTTP tool's. No catalogue admits no HTTP grader.
fn grader_allowed(app: &App, kind: &GraderKind) -> Result<(), String> {
    match kind {
        GraderKind::Judge(j) => {
            let config = RunConfig {
                provider: j.provider.clone(),
                model: j.model.clone(),
                ..RunConfig::default()
            };
            catalogue_check(app, &config).map_err(|e| match e {
                ApiError::InvalidField { reason, .. } => reason,
                other => other.to_string(),
            })
        }
        GraderKind::Http(h) => {
            if app.admission.is_none() {
                return Err(
                    "this dispatcher has no catalogue, so it allows no HTTP grader (glia dispatcher --catalogue)".into(),
                );
            }
            let tool = serde_json::from_value(json!({
                "name": "http_grader", "description": "an HTTP grader",
                "input_schema": {"type": "object"}, "url": h.url,
            }))
            .map_err(|e| format!("not a usable URL: {e}"))?;
            let config = RunConfig {
                http_tools: vec![tool],
                ..RunConfig::default()
            };
            config
                .validate()
                .map_err(|e| e.reason.clone())
                .and_then(|()| {
                    catalogue_check(app, &config).map_err(|e| match e {
                        ApiError::InvalidField { reason, .. } => reason,
                        other => other.to_string(),
                    })
                })
        }
        _ => Ok(()),
    }
}

/// Create an experiment from `body` (`{"eval": …}`) for `p`'s tenant: the
/// eval parsed strictly, its dataset found and pinned (`name@N`), each agent
/// version resolved and pinned as a batch would pin it, inline configs and
/// every case's patch checked, judge providers and HTTP grader origins
/// checked against the catalogue; then stored and its batches submitted.
/// Answers the experiment and whether it was created (false: `key` found
/// an earlier one with the same request). Errors: 422 naming `eval.…`, 404
/// `dataset_not_found`, 409 `idempotency_conflict`.
pub(crate) async fn create_experiment(
    app: &App,
    p: &Principal,
    key: Option<String>,
    eval: Value,
) -> Result<(Experiment, bool), ApiError> {
    let store = store(app)?;
    let request_hash = hex(&Sha256::digest(
        serde_json::to_vec(&eval).expect("JSON serialises"),
    ));
    let mut spec = EvalSpec::from_value(eval).map_err(|e| ApiError::InvalidField {
        field: if e.path.is_empty() {
            "eval".into()
        } else {
            format!("eval.{}", e.path)
        },
        reason: e.reason,
    })?;
    // Deciding approvals is the approve scope's: an eval that decides its
    // runs' approvals needs a caller who may (a submit-only token cannot
    // have its consequential calls approved by an eval instead of a person).
    if spec.approvals != Approvals::Leave {
        p.require(Scope::Approve)?;
    }
    if spec.dataset_file.is_some() {
        return Err(ApiError::InvalidField {
            field: "eval.dataset_file".into(),
            reason: "the server reads no files: upload it (PUT /v1/datasets/{name}) and name it in `dataset` (glia eval run does this)".into(),
        });
    }
    let (name, version) = spec.dataset_ref().ok_or_else(|| ApiError::InvalidField {
        field: "eval.dataset".into(),
        reason: "names no dataset".into(),
    })?;
    let (info, cases) = dataset_cases(app, &p.tenant, &name, version).await?;
    spec.dataset = Some(format!("{}@{}", info.name, info.version));
    let patched = cases.iter().find(|c| c.config.is_some());
    for i in 0..spec.agents.len() {
        let mut batch = batch_spec(i, &spec.agents[i], &spec)?;
        if let (VersionSpec::Agent(_), Some(case)) = (&spec.agents[i], patched) {
            return Err(ApiError::InvalidField {
                field: format!("eval.agents[{i}]"),
                reason: format!(
                    "case {:?} carries a config patch, which only an inline {{label, config}} version takes",
                    case.id
                ),
            });
        }
        check_spec(app, &p.tenant, &mut batch)
            .await
            .map_err(|e| match e {
                ApiError::AgentNotFound(a) => ApiError::InvalidField {
                    field: format!("eval.agents[{i}]"),
                    reason: format!("the tenant has no agent {a}"),
                },
                ApiError::InvalidField { field, reason } => ApiError::InvalidField {
                    field: format!("eval.agents[{i}].{field}"),
                    reason,
                },
                other => other,
            })?;
        if let (VersionSpec::Agent(reference), Some(pinned)) = (&mut spec.agents[i], batch.agent) {
            *reference = pinned;
        }
    }
    let labels = spec.labels();
    if let Some(dup) = labels
        .iter()
        .enumerate()
        .find(|(i, l)| labels[..*i].contains(l))
    {
        return Err(ApiError::InvalidField {
            field: format!("eval.agents[{}]", dup.0),
            reason: format!("{} is the same version as an earlier one", dup.1),
        });
    }
    for (i, g) in spec.graders.iter().enumerate() {
        grader_allowed(app, &g.kind).map_err(|reason| ApiError::InvalidField {
            field: format!(
                "eval.graders[{i}].{}",
                if matches!(g.kind, GraderKind::Http(_)) {
                    "url"
                } else {
                    "provider"
                }
            ),
            reason,
        })?;
    }
    // Every case under every version is checked now, as its batch item will
    // be: a refused goal or config patch stores nothing.
    let id = Uuid::now_v7();
    for i in 0..spec.agents.len() {
        version_items(app, &p.tenant, id, &spec, i, &cases).await?;
    }
    let now = Utc::now();
    let experiment = Experiment {
        id,
        tenant: p.tenant.clone(),
        name: spec.name.clone(),
        idempotency_key: key.clone(),
        request_hash: request_hash.clone(),
        spec: serde_json::to_string(&spec).expect("a spec serialises"),
        batches: Vec::new(),
        state: ExperimentState::Running,
        created_at: now,
        finished_at: None,
    };
    let (stored, created) = store.create_experiment(&experiment).await?;
    if !created {
        if stored.request_hash != request_hash {
            return Err(ApiError::IdempotencyConflict(key.unwrap_or_default()));
        }
        return Ok((stored, false));
    }
    tracing::info!(experiment_id = %stored.id, tenant = %p.tenant, name = %stored.name, "experiment created");
    // The batches now; the loop submits them if this dispatcher stops first.
    let stored = match submit_batches(app, &stored, &spec, &cases).await {
        Ok(batches) => Experiment { batches, ..stored },
        Err(e) => {
            tracing::warn!(experiment_id = %stored.id, "experiment batches not submitted yet: {e}");
            stored
        }
    };
    Ok((stored, true))
}

/// The stored eval of `exp`.
fn spec_of(exp: &Experiment) -> Result<EvalSpec, ApiError> {
    glia_evals::spec::parse_json(&exp.spec)
        .map_err(|e| ApiError::Internal(format!("experiment {} spec does not parse: {e}", exp.id)))
}

/// Version `i`'s batch spec (its agent pinned) and its items, every case's
/// goal and config patch checked as a batch item's is (`case …` named in
/// the error, under `eval.agents[i]`).
async fn version_items(
    app: &App,
    tenant: &str,
    experiment: Uuid,
    spec: &EvalSpec,
    i: usize,
    cases: &[Case],
) -> Result<(BatchSpec, Vec<glia_backends::batches::NewItem>), ApiError> {
    let mut bspec = batch_spec(i, &spec.agents[i], spec)?;
    let config = check_spec(app, tenant, &mut bspec).await?;
    let rules = ItemRules::new(app, &bspec, &config)?;
    let mut items = Vec::with_capacity(cases.len() * spec.repetitions as usize);
    for case in cases {
        for rep in 0..spec.repetitions {
            let item = BatchItem {
                custom_id: cell_id(&case.id, rep),
                goal: case.goal.clone(),
                inputs: None,
                metadata: Some(BTreeMap::from([(
                    EXPERIMENT_META.to_owned(),
                    experiment.to_string(),
                )])),
                tags: vec!["eval".into()],
                config: case.config.clone(),
                recorded_tools: case.recorded_tools.clone(),
            };
            let line = items.len() as u64;
            items.push(prepare(item, line, &rules).map_err(|(field, reason)| {
                ApiError::InvalidField {
                    field: format!("eval.agents[{i}]"),
                    reason: format!(
                        "case {:?}: {}{reason}",
                        case.id,
                        field.map(|f| format!("{f}: ")).unwrap_or_default()
                    ),
                }
            })?);
        }
    }
    Ok((bspec, items))
}

/// Submit each version's batch (idempotent by `experiment:{id}:{i}`) and
/// record them on the experiment; answers their ids in the spec's order.
async fn submit_batches(
    app: &App,
    exp: &Experiment,
    spec: &EvalSpec,
    cases: &[Case],
) -> Result<Vec<Uuid>, ApiError> {
    let batches = crate::batches::store(app)?.clone();
    let p = acting(exp);
    let mut ids = Vec::with_capacity(spec.agents.len());
    for i in 0..spec.agents.len() {
        let (bspec, items) = version_items(app, &exp.tenant, exp.id, spec, i, cases).await?;
        let mut chunks: Vec<Result<Upload, SubmitError>> = Vec::new();
        let mut rest = items.into_iter().peekable();
        while rest.peek().is_some() {
            chunks.push(Ok(Upload::Items(rest.by_ref().take(CHUNK).collect())));
        }
        chunks.push(Ok(Upload::Done {
            request_hash: format!("experiment:{}:{i}", exp.id),
        }));
        let submitted = batches
            .submit(
                new_batch(&p, Some(format!("experiment:{}:{i}", exp.id)), &bspec),
                futures::stream::iter(chunks).boxed(),
            )
            .await
            .map_err(|e| ApiError::Internal(format!("experiment batch {i}: {e}")))?;
        ids.push(submitted.batch.id);
    }
    store(app)?.set_batches(exp.id, &ids).await?;
    app.wake_admission();
    Ok(ids)
}

/// The loop: every [`TEND_EVERY`], tend the running experiments this
/// dispatcher can claim. Never returns; errors are logged and retried.
pub async fn evals(app: App) {
    let owner = Uuid::now_v7();
    let http = grader_client();
    // While runs wait on the loop (a turn to post, an approval to decide, a
    // cell to grade) it passes again soon, backing off to TEND_EVERY when
    // nothing needs it: a conversation's turn is not held up for a whole
    // period each time.
    let mut idle = FAST_PASS;
    let mut cases = Cases::default();
    loop {
        let started = std::time::Instant::now();
        match tend_pass(&app, owner, &http, &mut cases).await {
            Ok(pass) if pass.acted > 0 => idle = FAST_PASS,
            Ok(_) => idle = (idle * 2).min(TEND_EVERY),
            Err(e) => {
                tracing::warn!("evals: {e}");
                idle = TEND_EVERY;
            }
        }
        // At most half the time in passes: a long pass is followed by a
        // pause as long.
        idle = idle.max(started.elapsed());
        tokio::time::sleep(idle).await;
    }
}

/// The pause between passes while runs wait on the loop.
const FAST_PASS: Duration = Duration::from_millis(25);

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    /// Cells graded.
    pub graded: usize,
    /// Runs that waited on the loop (a turn, a close, approvals; whether
    /// or not this pass posted, a post may still wait for a worker) plus
    /// cells graded.
    pub acted: usize,
}

/// The client HTTP graders are called with: redirects are not followed (a
/// grader's origin is the catalogue's word, not the grader's).
pub fn grader_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("an HTTP client builds")
}

/// The cases of the datasets experiments use, by tenant, name and version
/// (a version never changes, so what was read once holds): a pass does not
/// read and parse a dataset again.
#[derive(Default)]
pub struct Cases(BTreeMap<(String, String, u32), Arc<Vec<Case>>>);

impl Cases {
    /// At most this many datasets are kept; past it the cache starts over.
    const MAX: usize = 64;

    async fn get(
        &mut self,
        app: &App,
        tenant: &str,
        name: &str,
        version: u32,
    ) -> Result<Arc<Vec<Case>>, ApiError> {
        let key = (tenant.to_owned(), name.to_owned(), version);
        if let Some(cases) = self.0.get(&key) {
            return Ok(cases.clone());
        }
        let (_, cases) = dataset_cases(app, tenant, name, Some(version)).await?;
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        let cases = Arc::new(cases);
        self.0.insert(key, cases.clone());
        Ok(cases)
    }
}

/// One pass over the running experiments this dispatcher (`owner`) can
/// claim; answers how many cells it graded.
pub async fn tend_once(app: &App, owner: Uuid, http: &reqwest::Client) -> Result<usize, ApiError> {
    Ok(tend_pass(app, owner, http, &mut Cases::default())
        .await?
        .graded)
}

/// One pass over the running experiments this dispatcher (`owner`) can
/// claim, reading datasets through `cases`.
pub async fn tend_pass(
    app: &App,
    owner: Uuid,
    http: &reqwest::Client,
    cases: &mut Cases,
) -> Result<Pass, ApiError> {
    let Some(store) = app.evals.clone() else {
        return Ok(Pass::default());
    };
    let mut total = Pass::default();
    for exp in store.running_experiments(100).await? {
        let now = Utc::now();
        let until = now + chrono::Duration::from_std(CLAIM_FOR).expect("a short duration");
        if !store.tend(exp.id, owner, now, until).await? {
            continue;
        }
        match tend(app, &exp, owner, http, cases).await {
            Ok(pass) => {
                total.graded += pass.graded;
                total.acted += pass.acted;
            }
            Err(e) => tracing::warn!(experiment_id = %exp.id, "evals: {e}"),
        }
    }
    Ok(total)
}

/// Every item of batch `id`, in order.
async fn items_of(app: &App, id: Uuid) -> Result<Vec<ItemView>, ApiError> {
    let store = crate::batches::store(app)?;
    let mut all = Vec::new();
    loop {
        let page = store.items(id, all.len() as u64, 1000).await?;
        let done = page.len() < 1000;
        all.extend(page);
        if done {
            return Ok(all);
        }
    }
}

/// Every event of a run, in order.
async fn events_of(app: &App, run_id: Uuid) -> Result<Vec<Event>, ApiError> {
    let mut all: Vec<Event> = Vec::new();
    loop {
        let after = all.last().map_or(0, |e| e.seq);
        let page = app.log.events(run_id, after, 1000).await?;
        let done = page.len() < 1000;
        all.extend(page);
        if done {
            return Ok(all);
        }
    }
}

fn ended(status: &str) -> bool {
    matches!(status, "succeeded" | "failed" | "cancelled" | "expired")
}

/// Tend one experiment.
async fn tend(
    app: &App,
    exp: &Experiment,
    owner: Uuid,
    http: &reqwest::Client,
    cache: &mut Cases,
) -> Result<Pass, ApiError> {
    let spec = spec_of(exp)?;
    let Some((name, Some(version))) = spec.dataset_ref() else {
        return Err(ApiError::Internal(
            "a stored experiment names its dataset's version".into(),
        ));
    };
    let cases = cache.get(app, &exp.tenant, &name, version).await?;
    let batches = if exp.batches.len() == spec.agents.len() {
        exp.batches.clone()
    } else {
        submit_batches(app, exp, &spec, &cases).await?
    };
    let by_id: BTreeMap<&str, &Case> = cases.iter().map(|c| (c.id.as_str(), c)).collect();
    let store = store(app)?;
    let done: HashSet<(String, String)> = store
        .grades(exp.id)
        .await?
        .into_iter()
        .map(|g| (g.version, g.cell))
        .collect();
    let labels = spec.labels();
    let mut all_graded = true;
    let mut graded = 0;
    let mut waiting = 0;
    for (label, batch) in labels.iter().zip(&batches) {
        for item in items_of(app, *batch).await? {
            if done.contains(&(label.clone(), item.custom_id.clone())) {
                continue;
            }
            all_graded = false;
            let Some(case) = split_cell(&item.custom_id).and_then(|(c, _)| by_id.get(c)) else {
                continue;
            };
            let acts = match (item.run_id, item.pull_point.as_ref()) {
                (Some(_), Some(PullPoint::AwaitingInput))
                | (
                    Some(_),
                    Some(PullPoint::Paused {
                        reason: PauseReason::Budget { .. },
                    }),
                ) => true,
                (Some(_), Some(PullPoint::AwaitingApproval { .. })) => {
                    spec.approvals != Approvals::Leave
                }
                _ => ended(&item.status),
            };
            if !acts {
                continue;
            }
            // The claim is held again before each effect: a pass that
            // outlasts it (slow HTTP graders) stops here, so two
            // dispatchers never act on one experiment at once.
            let now = Utc::now();
            let until = now + chrono::Duration::from_std(CLAIM_FOR).expect("a short duration");
            if !store.tend(exp.id, owner, now, until).await? {
                return Ok(Pass {
                    graded,
                    acted: waiting + graded,
                });
            }
            let at = At {
                exp,
                spec: &spec,
                label,
                case,
                item: &item,
            };
            let acted = act(app, &at, http).await;
            match acted {
                Ok(Acted::Waited) => waiting += 1,
                Ok(Acted::Graded(true)) => {
                    graded += 1;
                    app.metrics().eval_cells_graded.inc();
                }
                Ok(Acted::Graded(false) | Acted::Nothing) => {}
                // The stores are down: the whole pass waits for them.
                Err(e @ (ApiError::LogUnavailable(_) | ApiError::QueueUnavailable(_))) => {
                    return Err(e);
                }
                // One cell's trouble never holds up the others: a scripted
                // turn a guardrail refuses ends that run (its cell fails),
                // anything else is logged and tried again next pass.
                Err(ApiError::ScreenedInput { reason, .. }) => {
                    if let Some(run) = item.run_id {
                        let why = format!("the eval's scripted turn was refused: {reason}");
                        let by = format!("experiment:{}", exp.id);
                        match crate::control::cancel_run(app, run, &why, &by).await {
                            Ok(_) | Err(ApiError::RunFinished(_)) => {}
                            Err(e) => tracing::warn!(experiment_id = %exp.id, %run, "evals: {e}"),
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(experiment_id = %exp.id, cell = %item.custom_id, "evals: {e}");
                }
            }
        }
    }
    let expected = labels.len() * cases.len() * spec.repetitions as usize;
    if all_graded
        && done.len() >= expected
        && store
            .finish_experiment(None, exp.id, ExperimentState::Completed, Utc::now())
            .await?
    {
        tracing::info!(experiment_id = %exp.id, cells = expected, "experiment completed");
    }
    Ok(Pass {
        graded,
        acted: waiting + graded,
    })
}

/// What the loop did for one cell.
enum Acted {
    /// Its run waits on the loop (a turn, a close, approvals).
    Waited,
    /// It was graded (true: this grade was written, false: an earlier
    /// one stands).
    Graded(bool),
    /// Nothing (a judge run still going).
    Nothing,
}

/// One cell as the loop sees it: its experiment, eval, version, case and
/// batch item.
struct At<'a> {
    exp: &'a Experiment,
    spec: &'a EvalSpec,
    label: &'a str,
    case: &'a Case,
    item: &'a ItemView,
}

/// Do for one cell what its item's state asks: speak, close, decide, or
/// grade it once it ended.
async fn act(app: &App, at: &At<'_>, http: &reqwest::Client) -> Result<Acted, ApiError> {
    let At {
        exp,
        spec,
        label,
        case,
        item,
    } = *at;
    match (item.run_id, item.pull_point.as_ref()) {
        (Some(run), Some(PullPoint::AwaitingInput)) => {
            speak(app, run, case).await?;
            Ok(Acted::Waited)
        }
        (
            Some(run),
            Some(PullPoint::Paused {
                reason: PauseReason::Budget { limit },
            }),
        ) => {
            spent(app, exp, run, *limit).await?;
            Ok(Acted::Waited)
        }
        (Some(run), Some(PullPoint::AwaitingApproval { .. })) => {
            decide(app, exp, spec, run).await?;
            Ok(Acted::Waited)
        }
        _ => match grade_cell(app, at, http).await? {
            None => Ok(Acted::Nothing),
            Some(cell) => {
                let grade = Grade {
                    experiment_id: exp.id,
                    version: label.to_owned(),
                    cell: item.custom_id.clone(),
                    run_id: item.run_id.unwrap_or(Uuid::nil()),
                    grade: serde_json::to_string(&cell).expect("a cell serialises"),
                    graded_at: Utc::now(),
                };
                Ok(Acted::Graded(store(app)?.record_grade(&grade).await?))
            }
        },
    }
}

/// Post a waiting conversation's next scripted customer turn, or close it
/// (with the case's farewell, if any) when the case has no more. Nothing when a message or close already waits
/// in its inbox.
async fn speak(app: &App, run: Uuid, case: &Case) -> Result<(), ApiError> {
    if app
        .log
        .inbox(run)
        .await?
        .iter()
        .any(|i| matches!(i.payload, Payload::Input { .. } | Payload::Close { .. }))
    {
        return Ok(());
    }
    let given = events_of(app, run)
        .await?
        .iter()
        .filter(|e| e.kind.name() == "input.received")
        .count();
    let payload = match case.turns.get(given) {
        Some(text) => {
            let (text, redactions) =
                crate::admission::redacted_input(app, run, "text", text.clone()).await?;
            Payload::Input { text, redactions }
        }
        None => match &case.farewell {
            Some(text) => {
                let (text, redactions) =
                    crate::admission::redacted_input(app, run, "text", text.clone()).await?;
                Payload::Close {
                    text: Some(text),
                    redactions,
                }
            }
            None => Payload::Close {
                text: None,
                redactions: Vec::new(),
            },
        },
    };
    match post(app, run, payload).await {
        Ok(_) => Ok(()),
        // The run moved on (ended, a cancel waits): the next pass sees it.
        Err(
            glia_backends::LogError::Finished(_)
            | glia_backends::LogError::Cancelled(_)
            | glia_backends::LogError::Duplicate { .. },
        ) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A run paused by its budget: out of turns, it is closed (as a harness's
/// turn limit ends a conversation: it completes with its last answer and a
/// `bounds` grader sees the spend); out of anything else (cost, tokens,
/// time), it is cancelled, so its cell fails rather than passing on a
/// last answer its budget cut short.
async fn spent(
    app: &App,
    exp: &Experiment,
    run: Uuid,
    limit: glia_proto::budget::Limit,
) -> Result<(), ApiError> {
    if limit == glia_proto::budget::Limit::Turns {
        return close_spent(app, run).await;
    }
    let why = format!("the run ran out of its {limit} budget in an eval");
    match crate::control::cancel_run(app, run, &why, &format!("experiment:{}", exp.id)).await {
        Ok(_) | Err(ApiError::RunFinished(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Close a run paused by its budget (once: nothing when a close already
/// waits in its inbox).
async fn close_spent(app: &App, run: Uuid) -> Result<(), ApiError> {
    if app
        .log
        .inbox(run)
        .await?
        .iter()
        .any(|i| matches!(i.payload, Payload::Close { .. }))
    {
        return Ok(());
    }
    let close = Payload::Close {
        text: None,
        redactions: Vec::new(),
    };
    match post(app, run, close).await {
        Ok(_)
        | Err(
            glia_backends::LogError::Finished(_)
            | glia_backends::LogError::Cancelled(_)
            | glia_backends::LogError::Duplicate { .. },
        ) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Decide a waiting run's approvals as the eval says, by
/// `experiment:{id}`: `approve` approves new calls and rejects running
/// again a call a crash interrupted (its outcome is unknown), `approve_all`
/// approves both (for tools safe to run twice), `reject` rejects both,
/// `leave` decides nothing. A call whose approval the operator's catalogue
/// requires (`require_approval`, `require_approval_no_retry`) is left for
/// a person whatever the eval says, and a call whose decision already
/// waits in the run's inbox is left alone.
async fn decide(app: &App, exp: &Experiment, spec: &EvalSpec, run: Uuid) -> Result<(), ApiError> {
    let body = |decision: Value| -> crate::model::DecisionBody {
        serde_json::from_value(decision).expect("a decision body")
    };
    let reject = |why: String| body(json!({"decision": "reject", "reason": why}));
    let (new, interrupted) = match spec.approvals {
        Approvals::Leave => return Ok(()),
        Approvals::Approve => (
            body(json!({"decision": "approve"})),
            // Its outcome is unknown: never run again on the eval's word.
            reject(format!(
                "the eval {} does not run again a call a crash interrupted (its outcome is unknown)",
                spec.name
            )),
        ),
        Approvals::ApproveAll => (
            body(json!({"decision": "approve"})),
            body(json!({"decision": "approve"})),
        ),
        Approvals::Reject => {
            let why = format!("rejected by the eval {}", spec.name);
            (reject(why.clone()), reject(why))
        }
    };
    // A decision already waiting for a worker is not made again (that
    // would be a contested decision, recorded against the first).
    let waiting: HashSet<String> = app
        .log
        .inbox(run)
        .await?
        .into_iter()
        .filter_map(|i| match i.payload {
            Payload::Approval { call_id, .. } => Some(call_id),
            _ => None,
        })
        .collect();
    let state = app.log.load(run).await?;
    let p = acting(exp);
    for call in state.pending_calls.iter().filter(|c| {
        c.approval == glia_proto::ApprovalStatus::Requested && !waiting.contains(&c.call_id)
    }) {
        let policy = state
            .step_tools
            .iter()
            .find(|t| t.name == call.name)
            .and_then(|t| t.policy.as_ref());
        // The operator's word that a person approves this tool is not the
        // eval's to decide: it waits for one (the batch window ends it).
        if policy.is_some_and(|p| p.requires_approval && p.approval_by == PolicyOrigin::Operator) {
            continue;
        }
        let body = if call.interrupted { &interrupted } else { &new };
        match crate::control::decide_one(app, &p, run, call.call_id.clone(), body).await {
            Ok(_)
            | Err(
                ApiError::AlreadyDecided { .. }
                | ApiError::RunFinished(_)
                | ApiError::RunCancelled(_)
                | ApiError::StaleArgs { .. },
            ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Grade an ended cell; `None` while a judge run it needs is still going.
async fn grade_cell(
    app: &App,
    at: &At<'_>,
    http: &reqwest::Client,
) -> Result<Option<Cell>, ApiError> {
    let (exp, spec, label, case, item) = (at.exp, at.spec, at.label, at.case, at.item);
    let rep = split_cell(&item.custom_id).map_or(0, |(_, r)| r);
    let Some(run_id) = item.run_id else {
        return Ok(Some(Cell {
            version: label.to_owned(),
            case_id: case.id.clone(),
            rep,
            run_id: None,
            status: item.status.clone(),
            verdicts: Vec::new(),
            pass: Some(false),
            error: Some(format!(
                "not run: {}",
                item.error.clone().unwrap_or_else(|| item.status.clone())
            )),
            facts: None,
        }));
    };
    let facts = RunFacts::from_events(&events_of(app, run_id).await?);
    let mut verdicts: Vec<Option<Verdict>> = Vec::with_capacity(spec.graders.len());
    let mut posts: Vec<(usize, HttpTask)> = Vec::new();
    for (i, g) in spec.graders.iter().enumerate() {
        match grade::grade(g, case, &facts) {
            Graded::Done(v) => verdicts.push(Some(v)),
            Graded::Judge(task) => match judge(app, exp, label, &item.custom_id, &task).await? {
                Some(v) => verdicts.push(Some(v)),
                None => return Ok(None),
            },
            Graded::Http(task) => {
                verdicts.push(None);
                posts.push((i, task));
            }
        }
    }
    // HTTP graders only once every judge has answered, so a cell waiting
    // for its judge does not call them again and again.
    for (i, task) in posts {
        verdicts[i] = Some(call_http(app, &spec.graders[i].kind, http, &task).await);
    }
    let verdicts: Vec<Verdict> = verdicts.into_iter().flatten().collect();
    let (pass, _) = grade::cell_pass(facts.succeeded(), &verdicts);
    let error = if !facts.succeeded() {
        Some(format!(
            "the run {}{}",
            facts.outcome,
            facts
                .error
                .as_deref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        ))
    } else {
        verdicts
            .iter()
            .find_map(|v| v.error.as_ref().map(|e| format!("{}: {e}", v.grader)))
    };
    Ok(Some(Cell {
        version: label.to_owned(),
        case_id: case.id.clone(),
        rep,
        run_id: Some(run_id),
        status: item.status.clone(),
        verdicts,
        pass: Some(pass),
        error,
        facts: Some(facts),
    }))
}

/// The verdict of a judge grader: its run admitted once (idempotency key
/// from the experiment, version, cell and grader), `None` until it ends.
async fn judge(
    app: &App,
    exp: &Experiment,
    label: &str,
    cell: &str,
    task: &JudgeTask,
) -> Result<Option<Verdict>, ApiError> {
    let error = |why: String| {
        Ok(Some(Verdict::grading_error(
            &task.grader,
            task.required,
            why,
        )))
    };
    let key = format!(
        "judge:{}",
        hex(&Sha256::digest(format!(
            "{}\n{label}\n{cell}\n{}",
            exp.id, task.grader
        )))
    );
    let config: RunConfig = match glia_proto::strict::from_json_value(task.config.clone()) {
        Ok(c) => c,
        Err(e) => return error(format!("the judge's config is invalid: {e}")),
    };
    let req = CreateRun {
        goal: task.goal.clone(),
        config,
        batch_id: None,
        agent: None,
        tags: vec![JUDGE_TAG.into()],
        metadata: BTreeMap::from([(EXPERIMENT_META.to_owned(), exp.id.to_string())]),
        start_at: None,
        recorded_tools: None,
    };
    let run = match admit_run(app, &exp.tenant, Some(key), &req, None).await {
        Ok((run, _)) => run,
        Err(e @ (ApiError::LogUnavailable(_) | ApiError::QueueUnavailable(_))) => return Err(e),
        Err(e) => return error(format!("the judge run was refused: {e}")),
    };
    if run.status != glia_backends::RunStatus::Done {
        // A judge that spent its budget (calling tools it does not have, say)
        // waits for nobody: cancel it, and its end is a grading error.
        if let Some(PullPoint::Paused {
            reason: glia_proto::PauseReason::Budget { limit },
        }) = &run.pull_point
        {
            let reason = format!("the judge's budget ({limit:?}) is spent");
            crate::control::cancel_run(app, run.run_id, &reason, &acting(exp).by()).await?;
        }
        return Ok(None);
    }
    let facts = RunFacts::from_events(&events_of(app, run.run_id).await?);
    let mut verdict =
        grade::judge_verdict(&task.grader, task.required, task.pass_threshold, &facts);
    verdict.reason = match verdict.reason.is_empty() {
        true => format!("judge run {}", run.run_id),
        false => format!("{} (judge run {})", verdict.reason, run.run_id),
    };
    Ok(Some(verdict))
}

/// The verdict of an HTTP grader: one POST, its origin checked against the
/// catalogue again first; no answer, a non-2xx or a body that is not a
/// verdict is a grading error.
async fn call_http(
    app: &App,
    kind: &GraderKind,
    http: &reqwest::Client,
    task: &HttpTask,
) -> Verdict {
    let error = |why: String| Verdict::grading_error(&task.grader, task.required, why);
    if let Err(why) = grader_allowed(app, kind) {
        return error(format!("not called: {why}"));
    }
    let sent = http
        .post(&task.url)
        .timeout(Duration::from_millis(task.timeout_ms))
        .json(&task.body)
        .send()
        .await;
    let response = match sent {
        Ok(r) => r,
        Err(e) => return error(format!("the HTTP grader did not answer: {e}")),
    };
    let status = response.status().as_u16();
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) if body.len() + bytes.len() <= MAX_HTTP_ANSWER => {
                body.extend_from_slice(&bytes)
            }
            Ok(_) => {
                return error(format!(
                    "the HTTP grader's answer is over {MAX_HTTP_ANSWER} bytes"
                ));
            }
            Err(e) => return error(format!("the HTTP grader's answer was cut off: {e}")),
        }
    }
    grade::http_verdict(&task.grader, task.required, status, &body)
}

/// Every cell of `exp`: graded ones as graded, the others as their items
/// stand (ungraded); in the spec's version order, then item order.
pub(crate) async fn cells(
    app: &App,
    exp: &Experiment,
    spec: &EvalSpec,
) -> Result<Vec<Cell>, ApiError> {
    let mut graded: BTreeMap<(String, String), Cell> = BTreeMap::new();
    for g in store(app)?.grades(exp.id).await? {
        let cell: Cell = serde_json::from_str(&g.grade)
            .map_err(|e| ApiError::Internal(format!("grade of {} does not parse: {e}", g.cell)))?;
        graded.insert((g.version, g.cell), cell);
    }
    let mut all = Vec::new();
    for (label, batch) in spec.labels().iter().zip(&exp.batches) {
        for item in items_of(app, *batch).await? {
            if let Some(cell) = graded.remove(&(label.clone(), item.custom_id.clone())) {
                all.push(cell);
                continue;
            }
            let (case, rep) = split_cell(&item.custom_id).unwrap_or((&item.custom_id, 0));
            all.push(Cell {
                version: label.clone(),
                case_id: case.to_owned(),
                rep,
                run_id: item.run_id,
                status: item.status.clone(),
                verdicts: Vec::new(),
                pass: None,
                error: None,
                facts: None,
            });
        }
    }
    Ok(all)
}

/// The view of `exp`; with `results`, its cells and summary.
pub(crate) async fn view(
    app: &App,
    exp: &Experiment,
    results: bool,
) -> Result<ExperimentView, ApiError> {
    if !results {
        let graded = store(app)?.grade_count(exp.id).await?;
        return head(app, exp, &spec_of(exp)?, graded).await;
    }
    let (mut view, cells, summary) = view_results(app, exp).await?;
    view.summary = Some(serde_json::to_value(summary).expect("a summary serialises"));
    view.cells = Some(
        cells
            .iter()
            .map(|c| serde_json::to_value(c).expect("a cell serialises"))
            .collect(),
    );
    Ok(view)
}

/// The view of `exp` without results, and its cells and summary as they
/// are (the console's experiment page).
pub(crate) async fn view_results(
    app: &App,
    exp: &Experiment,
) -> Result<(ExperimentView, Vec<Cell>, Summary), ApiError> {
    let spec = spec_of(exp)?;
    let cells = self::cells(app, exp, &spec).await?;
    let graded = cells.iter().filter(|c| c.pass.is_some()).count() as u64;
    let summary = glia_evals::stats::summarize(&spec.labels(), &cells);
    Ok((head(app, exp, &spec, graded).await?, cells, summary))
}

/// The view of `exp` (eval `spec`, `graded` cells graded), without results.
async fn head(
    app: &App,
    exp: &Experiment,
    spec: &EvalSpec,
    graded: u64,
) -> Result<ExperimentView, ApiError> {
    let labels = spec.labels();
    let (name, version) = spec.dataset_ref().unwrap_or_default();
    let cases = match version {
        Some(v) => store(app)?
            .dataset_info(Some(&exp.tenant), &name, Some(v))
            .await?
            .map_or(0, |d| d.cases),
        None => 0,
    };
    Ok(ExperimentView {
        id: exp.id,
        name: exp.name.clone(),
        state: exp.state,
        dataset: spec.dataset.clone().unwrap_or_default(),
        versions: labels
            .iter()
            .enumerate()
            .map(|(i, label)| ExperimentVersion {
                label: label.clone(),
                batch_id: exp.batches.get(i).copied(),
            })
            .collect(),
        repetitions: spec.repetitions,
        progress: ExperimentProgress {
            cells: labels.len() as u64 * u64::from(cases) * u64::from(spec.repetitions),
            graded,
        },
        created_at: exp.created_at,
        finished_at: exp.finished_at,
        eval: serde_json::from_str(&exp.spec).unwrap_or(Value::Null),
        summary: None,
        cells: None,
    })
}

/// Cancel a running experiment of `p`'s: its batches are cancelled (their
/// runs too) and its cells not graded stay so. Errors: 404
/// `experiment_not_found`, 409 `experiment_ended`.
pub(crate) async fn cancel(app: &App, p: &Principal, id: Uuid) -> Result<Experiment, ApiError> {
    let store = store(app)?;
    let tenant = crate::batches::tenant_of(p);
    let exp = store
        .experiment(tenant, id)
        .await?
        .ok_or(ApiError::ExperimentNotFound(id))?;
    if !store
        .finish_experiment(tenant, id, ExperimentState::Cancelled, Utc::now())
        .await?
    {
        return Err(ApiError::ExperimentEnded(id));
    }
    for batch in &exp.batches {
        crate::batches::cancel_batch(app, Some(&exp.tenant), *batch, &p.by()).await?;
    }
    // Its judge runs still going are cancelled too: nobody reads them now.
    for status in [
        glia_backends::RunStatus::Runnable,
        glia_backends::RunStatus::Parked,
    ] {
        let mut filter = glia_backends::RunFilter {
            tenant: Some(exp.tenant.clone()),
            status: Some(status),
            tags: vec![JUDGE_TAG.into()],
            metadata: BTreeMap::from([(EXPERIMENT_META.to_owned(), id.to_string())]),
            limit: 1000,
            ..Default::default()
        };
        loop {
            let page = app.log.list_runs(&filter).await?;
            for run in &page {
                match crate::control::cancel_run(app, run.run_id, "experiment cancelled", &p.by())
                    .await
                {
                    Ok(_) | Err(ApiError::RunFinished(_) | ApiError::RunCancelled(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            match page.last() {
                Some(last) if page.len() == filter.limit => filter.before = Some(last.run_id),
                _ => break,
            }
        }
    }
    tracing::info!(experiment_id = %id, by = %p.by(), "experiment cancelled");
    store
        .experiment(tenant, id)
        .await?
        .ok_or(ApiError::ExperimentNotFound(id))
}
