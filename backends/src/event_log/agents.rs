//! The agent registry: tenants' agent definitions, versioned by content.
//!
//! # Contract
//!
//! - A version is immutable. Putting the content of an agent's latest
//!   version again writes nothing; other content becomes the next version
//!   (1 for a new name). Concurrent puts of one name are serialised.
//! - An agent is visible only to its tenant.

use async_trait::async_trait;

use crate::{AgentVersion, LogError};

/// Agent definitions by tenant, name and version. See the [module](self)
/// for the contract.
#[async_trait]
pub trait AgentRegistry: Send + Sync {
    /// Register version of `tenant`'s agent `name`: `definition` is its
    /// canonical JSON (an `AgentDefinition`, already validated) and
    /// `content_hash` its hash. When the agent's latest version has the same
    /// hash, that version is returned with `false` and nothing is written;
    /// otherwise the definition becomes the next version (1 for a new name),
    /// returned with `true`. Versions are immutable; concurrent puts of one
    /// name are serialised (each distinct content gets its own version, the
    /// same content one).
    async fn put_agent(
        &self,
        tenant: &str,
        name: &str,
        definition: &str,
        content_hash: &str,
    ) -> Result<(AgentVersion, bool), LogError>;

    /// One version of `tenant`'s agent `name` (`None`: the latest); `Ok(None)` when absent.
    async fn get_agent(
        &self,
        tenant: &str,
        name: &str,
        version: Option<u32>,
    ) -> Result<Option<AgentVersion>, LogError>;

    /// The latest version of each of `tenant`'s agents, by name.
    async fn list_agents(&self, tenant: &str) -> Result<Vec<AgentVersion>, LogError>;
}
