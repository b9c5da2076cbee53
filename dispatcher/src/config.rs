//! Settings held by [`crate::App`]: the inbox's session key, webhooks'
//! store and receiver policy, the batch store and its admission settings,
//! retention periods.
//! Plain data (and the inbox's MAC); the modules that act on them re-export
//! them where they were always found (`inbox::InboxConfig`,
//! `webhooks::WebhookConfig`, `batches::BatchConfig`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use glia_backends::batches::BatchStore;
use glia_backends::webhooks::WebhookStore;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Inbox settings, part of [`crate::App`].
#[derive(Clone)]
pub struct InboxConfig {
    /// Signs session cookies and CSRF tokens (HMAC-SHA256). Default: 32
    /// random bytes per process; set the same key on every replica.
    pub session_key: [u8; 32],
    /// How long a sign-in lasts (default 8 h).
    pub session_ttl: Duration,
    /// Add `Secure` to the cookie (set when served over HTTPS).
    pub secure_cookies: bool,
}

impl Default for InboxConfig {
    fn default() -> Self {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).expect("the OS random source works");
        InboxConfig {
            session_key: key,
            session_ttl: Duration::from_secs(8 * 3600),
            secure_cookies: false,
        }
    }
}

impl InboxConfig {
    /// A configuration whose session key is derived from `secret` (SHA-256
    /// of it), e.g. `GLIA_SESSION_KEY`, so replicas agree.
    pub fn with_secret(secret: &str) -> InboxConfig {
        use sha2::Digest;
        InboxConfig {
            session_key: Sha256::digest(secret.as_bytes()).into(),
            ..InboxConfig::default()
        }
    }

    pub(crate) fn mac(&self, parts: &[&[u8]]) -> Vec<u8> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.session_key).expect("any key length");
        for p in parts {
            mac.update(p);
            mac.update(b"\0");
        }
        mac.finalize().into_bytes().to_vec()
    }
}

/// Who may be called.
#[derive(Debug, Clone, Default)]
pub struct WebhookPolicy {
    /// Allow loopback and private addresses (tests, single-host setups).
    pub allow_private: bool,
    /// Hosts allowed whatever they resolve to (exact, case-insensitive).
    pub allow_hosts: Vec<String>,
}

/// Webhook settings, part of [`crate::App`].
#[derive(Clone, Default)]
pub struct WebhookConfig {
    /// The store; `None` (in-memory fleets) answers 501.
    pub store: Option<Arc<dyn WebhookStore>>,
    /// Which receivers may be called.
    pub policy: WebhookPolicy,
    /// Base URL of this dispatcher as approvers reach it (links to the inbox
    /// in Slack messages), e.g. `https://glia.example.com`.
    pub public_url: Option<String>,
}

/// Fleet-wide admission settings. [`Admission::default`] is production's.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// Most batch runs not done at once across every tenant (default 256).
    /// Keep it below the fleet's worker slots so single runs always find one.
    pub max_in_flight: u32,
    /// Most batch runs not done at once per tenant (default 128).
    pub per_tenant: u32,
    /// Fair-share weight per tenant (default 1 for every tenant).
    pub weights: BTreeMap<String, u32>,
    /// Pause between admission passes when nothing woke the loop (default 200 ms).
    pub poll: Duration,
    /// Age after which an item claimed by a pass that did not finish is claimed again (default 30 s).
    pub claim_lease: Duration,
    /// Most items one pass admits (default 512).
    pub per_pass: usize,
    /// Most items in one batch (default 1,000,000).
    pub max_items: u64,
    /// Largest JSON Lines upload in bytes (default 1 GiB).
    pub max_upload_bytes: u64,
    /// Largest line of an upload in bytes (default 1 MiB).
    pub max_line_bytes: usize,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            max_in_flight: 256,
            per_tenant: 128,
            weights: BTreeMap::new(),
            poll: Duration::from_millis(200),
            claim_lease: Duration::from_secs(30),
            per_pass: 512,
            max_items: 1_000_000,
            max_upload_bytes: 1 << 30,
            max_line_bytes: 1 << 20,
        }
    }
}

/// The batch store and admission settings of an [`crate::App`].
#[derive(Clone, Default)]
pub struct BatchConfig {
    /// The store; `None` answers 404 `not_available`.
    pub store: Option<Arc<dyn BatchStore>>,
    /// Admission settings.
    pub admission: Admission,
}

/// Retention settings of the dispatcher ([`crate::App::retention`]; the sweeper is
/// `crate::retention`): how long each
/// tenant's finished runs keep their content. The default keeps everything.
#[derive(Debug, Clone, PartialEq)]
pub struct Retention {
    /// The period of tenants not in `tenants`; `None` keeps theirs.
    pub default: Option<Duration>,
    /// Periods per tenant. A run's period counts from its last event (when
    /// it finished).
    pub tenants: std::collections::BTreeMap<String, Duration>,
    /// Pause between sweeps (default 60 s).
    pub every: Duration,
    /// Most runs one sweep erases per period (default 100).
    pub per_sweep: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            default: None,
            tenants: Default::default(),
            every: Duration::from_secs(60),
            per_sweep: 100,
        }
    }
}

impl Retention {
    /// True when some tenant has a period: the sweeper has work.
    pub fn is_active(&self) -> bool {
        self.default.is_some() || !self.tenants.is_empty()
    }

    /// Parse a retention file: `{"default_days": 90, "tenants": {"acme":
    /// {"days": 30}}}` (both parts optional; days from 1 to 36,500). Unknown
    /// fields are refused, naming the path.
    pub fn from_json(text: &str) -> Result<Retention, String> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            #[serde(default)]
            default_days: Option<u32>,
            #[serde(default)]
            tenants: std::collections::BTreeMap<String, Tenant>,
        }
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Tenant {
            days: u32,
        }
        let de = &mut serde_json::Deserializer::from_str(text);
        let file: File = serde_path_to_error::deserialize(de)
            .map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
        let days = |n: u32, at: &str| {
            if (1..=36_500).contains(&n) {
                Ok(Duration::from_secs(u64::from(n) * 86_400))
            } else {
                Err(format!("{at}: {n} days is outside 1 to 36500"))
            }
        };
        Ok(Retention {
            default: file
                .default_days
                .map(|n| days(n, "default_days"))
                .transpose()?,
            tenants: file
                .tenants
                .into_iter()
                .map(|(t, p)| {
                    let period = days(p.days, &format!("tenants.{t}.days"))?;
                    Ok((t, period))
                })
                .collect::<Result<_, String>>()?,
            ..Retention::default()
        })
    }
}
